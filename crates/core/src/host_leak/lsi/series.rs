//! The series half of the LSI: slopes of a stack's live bytes over beats, the split into a
//! base and a recent span, and the factors (G, P, the tail's rise) they give.

use super::{Degradation, SeriesPoint, WindowFacts, MIN_POINTS};

pub(super) fn clip(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// Weighted least-squares slope of live bytes over beats; `None` with fewer than 2 distinct
/// beats.
pub fn weighted_slope(points: &[SeriesPoint]) -> Option<f64> {
    let w: f64 = points.iter().map(|p| p.weight).sum();
    if points.len() < 2 || w <= 0.0 {
        return None;
    }
    let mx = points.iter().map(|p| p.weight * p.beat).sum::<f64>() / w;
    let my = points.iter().map(|p| p.weight * p.live_bytes).sum::<f64>() / w;
    let sxx: f64 = points
        .iter()
        .map(|p| p.weight * (p.beat - mx).powi(2))
        .sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points
        .iter()
        .map(|p| p.weight * (p.beat - mx) * (p.live_bytes - my))
        .sum();
    Some(sxy / sxx)
}

/// Splits post-warm-up points into (base, recent): recent covers the last 25% of their beats,
/// at least `min_span` beats, and each part keeps at least 2 points. `None` when that is
/// impossible.
pub fn split_recent(
    points: &[SeriesPoint],
    min_span: f64,
) -> Option<(&[SeriesPoint], &[SeriesPoint])> {
    if points.len() < 4 {
        return None;
    }
    let first = points.first()?.beat;
    let last = points.last()?.beat;
    let span = ((last - first) * 0.25).max(min_span);
    let mut cut = points.partition_point(|p| p.beat < last - span);
    cut = cut.clamp(2, points.len() - 2);
    Some((&points[..cut], &points[cut..]))
}

/// Largest growth of the tail, as a share of the live bytes at its end, that still counts as
/// flat.
pub const FLAT_TAIL: f64 = 0.05;

/// G, P and the tail's rise from a series; or why they are unknown.
pub(super) struct SeriesFactors {
    pub(super) growth: f64,
    pub(super) slope: f64,
    pub(super) beats: usize,
    pub(super) pattern: f64,
    /// Growth over the recent span as a share of the live bytes at its end.
    pub(super) tail_rise: f64,
}

/// Growth of `points` over their span (by their fitted slope) as a share of the last live bytes.
pub(super) fn rise(points: &[SeriesPoint], slope: f64) -> f64 {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return 0.0;
    };
    let grown = slope * (last.beat - first.beat);
    if grown <= 0.0 {
        0.0
    } else {
        grown / last.live_bytes.max(1.0)
    }
}

/// G, P and the tail's rise of `points`, or why the series cannot tell them.
pub(super) fn series_factors(
    points: &[SeriesPoint],
    mean_alloc_per_beat: f64,
    window: &WindowFacts,
) -> Result<SeriesFactors, Degradation> {
    let warmup = window.warmup_beats();
    let after: Vec<SeriesPoint> = points
        .iter()
        .copied()
        .filter(|p| p.beat >= warmup)
        .collect();
    if after.len() < MIN_POINTS {
        return Err(Degradation::InsufficientSeries);
    }
    let slope = weighted_slope(&after).ok_or(Degradation::InsufficientSeries)?;
    let norm = |s: f64| {
        if mean_alloc_per_beat > 0.0 {
            s / mean_alloc_per_beat
        } else {
            0.0
        }
    };
    // Fewer points than a base and a recent span need are wherever the allocation-driven beats
    // of a short process happened to fall: a slope through them said 1 in one worker and 0 in
    // the next for the same leak. Such a series says nothing about growth either.
    let Some((base, recent)) = split_recent(&after, window.recent_min_beats()) else {
        return Err(Degradation::InsufficientSeries);
    };
    let base_slope = weighted_slope(base).unwrap_or(0.0);
    let recent_slope = weighted_slope(recent).unwrap_or(0.0);
    let pattern = if base_slope > 0.0 {
        clip(recent_slope / base_slope)
    } else if recent_slope > 0.0 {
        1.0
    } else {
        0.0
    };
    let tail_rise = rise(recent, recent_slope);
    Ok(SeriesFactors {
        growth: clip(norm(slope)),
        slope,
        beats: after.len(),
        pattern,
        tail_rise,
    })
}
