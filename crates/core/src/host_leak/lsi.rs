//! The Leak Suspicion Index: how much a call stack's unfreed memory looks like a leak rather
//! than a cache, a pool or work in flight (docs/analyses.md#lsi).
//!
//! `LSI = 100 · (0.26·G + 0.21·R + 0.12·S + 0.12·P + 0.29·E)`, every factor clipped to [0, 1]:
//!
//! * **G, growth**: the weighted least-squares slope of the stack's live bytes per beat, over
//!   the points after the warm-up, divided by the stack's mean allocated bytes per beat.
//!   1 = everything allocated stays; 0 = flat or shrinking. The warm-up (start-up allocations:
//!   tables, configuration) is the window's first 5 s, or its first quarter when shorter than
//!   20 s, so that a short window keeps most of its beats.
//! * **R, release**: unfreed bytes / allocated bytes.
//! * **S, lifetime**: mean age of the unfreed blocks against the mean lifetime of the freed
//!   ones, as `age / (age + lifetime)`: 0.5 when alike, towards 1 when the survivors are far
//!   older than blocks usually live. 0.5 with fewer than 8 frees.
//! * **P, pattern**: the recent slope against the base slope: does the growth go on? Recent =
//!   the last 25% of the series' beats, at least 10 of the beats the series were sampled at by
//!   the window's end, leaving at least 2 base points.
//! * **E, scale**: `max(log10(1 + unfreed count) / 2, log10(1 + unfreed MiB) / 2.8)`.
//!
//! A series' positions and slopes are in beats of the configured length (`WindowFacts::beat_ms`),
//! also while the beat was finer (fractional positions); G and P are ratios, so the unit cancels.
//! Only the warm-up and the recent span are lengths, converted from time and from the sampled
//! beat.
//!
//! Without a usable series, G and P are unknown: shown as `-`, the row says why, and the LSI
//! counts them as the neutral 0.5. Nothing is guessed. A series too short to split into a base
//! and a recent span is not usable for G either: its two or three points lie wherever the beats
//! of a short process fell, before, inside or after a growth of half a second. One thing is known without a series: a
//! stack's live bytes rise only through its own allocations, so a stack that allocated nothing
//! in the last quarter of the window (or in its last tenth, when all its allocations came in one
//! burst of at most a quarter of the window) was not growing as the window ended. Such a stack
//! is resident/early (made and kept), in a window long enough for a series to have shown growth
//! (its row still says the series was missing). A Python program's import leaves hundreds of
//! thousands of such small stacks, too many to sample; they are not leaks. Except a stack whose
//! surviving blocks were born late and kept (`grew_late`, from the ledger's counts and ages
//! alone): in a short process the work comes after seconds of imports and the exit can outlast
//! it, so its quiet end says nothing about the stack. What an import made is told apart by its
//! Python frames instead (`made_by_import`; the report moves such sites to the resident rows).
//!
//! Classification: **resident/early** when G < 0.05 and the stack's newest allocation lies in
//! the first 20% of the window or the stack stopped allocating as above (or, without a series,
//! when it stopped), or when its Python frames show an import; **resident/turnover** when R ≤ 0.3 and the tail is flat;
//! otherwise **suspected_leak** when LSI ≥ 60, else **growth_watch**, with `/turnover` appended
//! when R ≤ 0.3 but the tail still rises. The tail is flat when, over the recent span, live
//! bytes grew by at most 5% of the live bytes at its end (recent slope × recent beats / live):
//! a cache that turns over stays level, while a leak hidden in heavy traffic (every twentieth
//! request kept, say) keeps adding a visible share of what is live.

use super::model::CountBytes;

pub const WEIGHT_GROWTH: f64 = 0.26;
pub const WEIGHT_RELEASE: f64 = 0.21;
pub const WEIGHT_LIFETIME: f64 = 0.12;
pub const WEIGHT_PATTERN: f64 = 0.12;
pub const WEIGHT_SCALE: f64 = 0.29;
/// The start of a window that growth ignores (start-up allocations), at most this long...
pub const WARMUP_MS: f64 = 5000.0;
/// ...and at most this share of the window.
pub const WARMUP_SHARE: f64 = 0.25;
/// Points after the warm-up needed for a slope.
pub const MIN_POINTS: usize = 3;
/// The recent span of the pattern covers at least this many sampled beats: fewer points give
/// no stable recent slope.
pub const RECENT_MIN_BEATS: f64 = 10.0;
pub const MIN_FREES_FOR_LIFETIME: u64 = 8;
pub const SUSPECTED_LEAK_LSI: f64 = 60.0;
/// A stack without a series that allocated nothing in this last share of the window is
/// resident (see the module comment).
pub const QUIET_TAIL_SHARE: f64 = 0.25;
/// ...or nothing in this last share, when all its allocations came in one burst no longer than
/// `BURST_SHARE` of the window (a module imported lazily by the first training step).
pub const BURST_QUIET_TAIL_SHARE: f64 = 0.10;
pub const BURST_SHARE: f64 = 0.25;
pub const NEUTRAL: f64 = 0.5;
/// `grew_late`: live blocks, kept share and birth time that make a site's growth late.
pub const LATE_MIN_BLOCKS: u64 = 16;
pub const LATE_MIN_RELEASE: f64 = 0.5;
pub const LATE_BIRTH_SHARE: f64 = 0.5;

/// One sample of a stack's live memory: at `beat` (beats since the window opened), weighted by
/// the number of beats it stands for (more after the series' resolution was halved).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesPoint {
    pub beat: f64,
    pub live_bytes: f64,
    /// Live blocks at that beat (not a factor input; kept for displays of the series).
    pub live_blocks: f64,
    pub weight: f64,
}

/// Why a site has no usable series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Degradation {
    /// The stack was never among the top-k stacks at a beat.
    NoSeries,
    /// Its series was dropped to make room for another (at most 1024 series).
    SeriesEvicted,
    /// Too few points after the warm-up for a base and a recent span (a short window).
    InsufficientSeries,
    /// The window outlasted the warm-up but no beat was taken after it (no thread allocated
    /// after the warm-up to drive the beat).
    NoWarmupThread,
}

impl Degradation {
    pub fn label(self) -> &'static str {
        match self {
            Degradation::NoSeries => "no_series",
            Degradation::SeriesEvicted => "series_evicted",
            Degradation::InsufficientSeries => "insufficient_series",
            Degradation::NoWarmupThread => "no_warmup_thread",
        }
    }
}

/// A site's series as the report has it.
#[derive(Clone, Debug, PartialEq)]
pub enum Series {
    Points(Vec<SeriesPoint>),
    Missing(Degradation),
}

/// What the ledger knows about a site besides its series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SiteFacts {
    pub unfreed: CountBytes,
    pub allocated: CountBytes,
    pub freed_count: u64,
    pub mean_live_age_ms: f64,
    pub mean_freed_lifetime_ms: f64,
    /// Time of the newest allocation, nanoseconds since the epoch.
    pub last_alloc_ns: u64,
    /// Time of the oldest allocation in the window (0: not known).
    pub first_alloc_ns: u64,
}

/// The window, in wall-clock time and in beats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowFacts {
    pub start_ns: u64,
    pub end_ns: u64,
    /// The configured beat: the unit of series positions and slopes.
    pub beat_ms: u64,
    /// The beat the series were sampled at by the window's end: `beat_ms` when it is fixed,
    /// shorter or longer when the beat adapted to the window.
    pub sampled_ms: f64,
}

impl WindowFacts {
    pub fn window_ms(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }

    /// The window's length in beats; at least 1 ms' worth, so that no rate divides by zero.
    pub fn beats(&self) -> f64 {
        self.window_ms().max(1.0) / self.beat_ms.max(1) as f64
    }

    /// The warm-up, in beats.
    pub fn warmup_beats(&self) -> f64 {
        WARMUP_MS.min(WARMUP_SHARE * self.window_ms()) / self.beat_ms.max(1) as f64
    }

    /// The shortest recent span of the pattern, in beats.
    pub fn recent_min_beats(&self) -> f64 {
        RECENT_MIN_BEATS * self.sampled_ms / self.beat_ms.max(1) as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Factors {
    pub growth: Option<f64>,
    pub release: f64,
    pub lifetime: f64,
    pub pattern: Option<f64>,
    pub scale: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    SuspectedLeak,
    GrowthWatch,
    ResidentEarly,
    ResidentTurnover,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Assessment {
    pub factors: Factors,
    pub lsi: f64,
    pub class: Class,
    /// `/turnover`: most of what the stack allocated was freed, but its tail still rises.
    pub turnover: bool,
    /// Live-bytes slope over the points after the warm-up, bytes per beat.
    pub slope: Option<f64>,
    /// Points the slope was fitted to.
    pub beats: usize,
    pub degraded: Option<Degradation>,
}

impl Assessment {
    pub fn is_resident(&self) -> bool {
        matches!(self.class, Class::ResidentEarly | Class::ResidentTurnover)
    }

    /// `suspected_leak`, `growth_watch/turnover`, `resident/early`, ...
    pub fn class_label(&self) -> String {
        let base = match self.class {
            Class::SuspectedLeak => "suspected_leak",
            Class::GrowthWatch => "growth_watch",
            Class::ResidentEarly => "resident/early",
            Class::ResidentTurnover => "resident/turnover",
        };
        if self.turnover && !self.is_resident() {
            format!("{base}/turnover")
        } else {
            base.to_string()
        }
    }
}

fn clip(x: f64) -> f64 {
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
struct SeriesFactors {
    growth: f64,
    slope: f64,
    beats: usize,
    pattern: f64,
    /// Growth over the recent span as a share of the live bytes at its end.
    tail_rise: f64,
}

/// Growth of `points` over their span (by their fitted slope) as a share of the last live bytes.
fn rise(points: &[SeriesPoint], slope: f64) -> f64 {
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

fn series_factors(
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

/// Scale of the unfreed memory alone (no series needed).
pub fn scale_factor(unfreed: CountBytes) -> f64 {
    let by_count = (1.0 + unfreed.count as f64).log10() / 2.0;
    let by_mib = (1.0 + unfreed.bytes as f64 / (1024.0 * 1024.0)).log10() / 2.8;
    clip(by_count.max(by_mib))
}

pub fn lifetime_factor(site: &SiteFacts) -> f64 {
    if site.freed_count < MIN_FREES_FOR_LIFETIME {
        return NEUTRAL;
    }
    let age = site.mean_live_age_ms.max(0.0);
    let life = site.mean_freed_lifetime_ms.max(0.0);
    if age + life <= 0.0 {
        NEUTRAL
    } else {
        clip(age / (age + life))
    }
}

pub fn lsi(f: &Factors) -> f64 {
    100.0
        * (WEIGHT_GROWTH * f.growth.unwrap_or(NEUTRAL)
            + WEIGHT_RELEASE * f.release
            + WEIGHT_LIFETIME * f.lifetime
            + WEIGHT_PATTERN * f.pattern.unwrap_or(NEUTRAL)
            + WEIGHT_SCALE * f.scale)
}

/// Whether a site's surviving memory was made late in the window and kept: at least
/// `LATE_MIN_BLOCKS` blocks still live, at least `LATE_MIN_RELEASE` of what it allocated, born
/// on average after the window's midpoint. Only the ledger's counts and ages say so, not the
/// beats. Such a site is not called stopped from the quiet end of its window: a short process
/// (a DataLoader worker) spends its first seconds importing, its work comes late, and its exit
/// (interpreter finalization) can outlast the work, so a leak that grew until the work ended
/// looks as quiet at the end as a table made once.
pub fn grew_late(site: &SiteFacts, release: f64, window: &WindowFacts) -> bool {
    let window_ms = window.window_ms();
    let newest_ms = site.last_alloc_ns.saturating_sub(window.start_ns) as f64 / 1e6;
    // No block is younger than the newest allocation.
    let mean_birth_ms = (window_ms - site.mean_live_age_ms.max(0.0)).min(newest_ms);
    site.unfreed.count >= LATE_MIN_BLOCKS
        && release >= LATE_MIN_RELEASE
        && mean_birth_ms > LATE_BIRTH_SHARE * window_ms
}

/// Whether a Python stack (innermost first) runs through the import machinery: its memory was
/// made by a module body or the loader, which run once per module, so it does not grow however
/// its few beats fell. A script's own top level runs through `runpy`, not this.
pub fn made_by_import(python_frames: &[String]) -> bool {
    python_frames.iter().any(|frame| {
        let file = frame.split('(').next().unwrap_or(frame);
        file.contains("importlib._bootstrap") || file.contains("importlib/_bootstrap")
    })
}

impl Assessment {
    /// The same assessment, as resident/early: for a site `made_by_import`.
    pub fn made_once(self) -> Assessment {
        Assessment {
            class: Class::ResidentEarly,
            turnover: false,
            ..self
        }
    }
}

/// Assesses one site.
pub fn assess(series: &Series, site: &SiteFacts, window: &WindowFacts) -> Assessment {
    let beats = window.beats();
    let mean_alloc_per_beat = site.allocated.bytes as f64 / beats;
    let release = if site.allocated.bytes == 0 {
        0.0
    } else {
        clip(site.unfreed.bytes as f64 / site.allocated.bytes as f64)
    };
    let computed = match series {
        Series::Points(points) => series_factors(points, mean_alloc_per_beat, window),
        Series::Missing(reason) => Err(*reason),
    };
    let (growth, pattern, slope, fitted, tail_rise, degraded) = match &computed {
        Ok(s) => (
            Some(s.growth),
            Some(s.pattern),
            Some(s.slope),
            s.beats,
            Some(s.tail_rise),
            None,
        ),
        Err(reason) => (None, None, None, 0, None, Some(*reason)),
    };
    // Only where a series could have shown growth: a window too short for MIN_POINTS sampled
    // beats after its warm-up says nothing either way.
    let newest_ms = site.last_alloc_ns.saturating_sub(window.start_ns) as f64 / 1e6;
    let warmup_ms = window.warmup_beats() * window.beat_ms.max(1) as f64;
    let long_enough = window.window_ms() - warmup_ms >= MIN_POINTS as f64 * window.sampled_ms;
    let window_ms = window.window_ms();
    let oldest_ms = site.first_alloc_ns.saturating_sub(window.start_ns) as f64 / 1e6;
    let burst = site.first_alloc_ns != 0 && newest_ms - oldest_ms <= BURST_SHARE * window_ms;
    let stopped = long_enough
        && !grew_late(site, release, window)
        && (newest_ms <= (1.0 - QUIET_TAIL_SHARE) * window_ms
            || (burst && newest_ms <= (1.0 - BURST_QUIET_TAIL_SHARE) * window_ms));
    let factors = Factors {
        growth,
        release,
        lifetime: lifetime_factor(site),
        pattern,
        scale: scale_factor(site.unfreed),
    };
    let lsi = lsi(&factors);

    let window_ns = window.end_ns.saturating_sub(window.start_ns) as f64;
    let newest_early = site.last_alloc_ns.saturating_sub(window.start_ns) as f64 <= 0.2 * window_ns;
    let turnover_share = release <= 0.3;
    let tail_flat = tail_rise.map(|r| r <= FLAT_TAIL);
    let class = if growth.map_or(stopped, |g| g < 0.05 && (newest_early || stopped)) {
        Class::ResidentEarly
    } else if turnover_share && tail_flat == Some(true) {
        Class::ResidentTurnover
    } else if lsi >= SUSPECTED_LEAK_LSI {
        Class::SuspectedLeak
    } else {
        Class::GrowthWatch
    };
    Assessment {
        factors,
        lsi,
        class,
        turnover: turnover_share && tail_flat == Some(false),
        slope,
        beats: fitted,
        degraded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn cb(count: u64, bytes: u64) -> CountBytes {
        CountBytes { count, bytes }
    }

    fn points(values: &[(f64, f64)]) -> Vec<SeriesPoint> {
        values
            .iter()
            .map(|&(beat, live)| SeriesPoint {
                beat,
                live_bytes: live,
                live_blocks: 1.0,
                weight: 1.0,
            })
            .collect()
    }

    /// Live bytes at beats 1..=n from `f`.
    fn series(n: u32, f: impl Fn(f64) -> f64) -> Vec<SeriesPoint> {
        (1..=n)
            .map(|b| SeriesPoint {
                beat: b as f64,
                live_bytes: f(b as f64),
                live_blocks: 1.0,
                weight: 1.0,
            })
            .collect()
    }

    /// A 20-beat window of 1 s beats.
    fn window() -> WindowFacts {
        WindowFacts {
            start_ns: 0,
            end_ns: 20_000_000_000,
            beat_ms: 1000,
            sampled_ms: 1000.0,
        }
    }

    fn site(unfreed: CountBytes, allocated: CountBytes, freed_count: u64) -> SiteFacts {
        SiteFacts {
            unfreed,
            allocated,
            freed_count,
            mean_live_age_ms: 0.0,
            mean_freed_lifetime_ms: 0.0,
            last_alloc_ns: 19_900_000_000,
            first_alloc_ns: 0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn slope_of_a_line_and_weights() {
        assert_eq!(
            weighted_slope(&points(&[(0.0, 5.0), (2.0, 9.0)])),
            Some(2.0)
        );
        assert_eq!(weighted_slope(&points(&[(1.0, 5.0)])), None);
        assert_eq!(weighted_slope(&points(&[(1.0, 5.0), (1.0, 7.0)])), None);
        // A heavy point pulls the fit: (0,0) w1, (1,0) w1, (2,6) w2.
        let p = vec![
            SeriesPoint {
                beat: 0.0,
                live_bytes: 0.0,
                live_blocks: 0.0,
                weight: 1.0,
            },
            SeriesPoint {
                beat: 1.0,
                live_bytes: 0.0,
                live_blocks: 0.0,
                weight: 1.0,
            },
            SeriesPoint {
                beat: 2.0,
                live_bytes: 6.0,
                live_blocks: 1.0,
                weight: 2.0,
            },
        ];
        // mx = 1.25, my = 3, sxx = 1.5625+0.0625+1.125 = 2.75, sxy = 3.75+0.75+4.5 = 9
        assert!(close(weighted_slope(&p).unwrap(), 9.0 / 2.75));
    }

    #[test]
    fn growth_is_slope_over_mean_allocation() {
        // 1000 B allocated per beat, all kept: live grows 1000 B/beat -> G = 1.
        let s = Series::Points(series(20, |b| 1000.0 * b));
        let a = assess(&s, &site(cb(20, 20_000), cb(20, 20_000), 0), &window());
        assert_eq!(a.factors.growth, Some(1.0));
        assert!(close(a.slope.unwrap(), 1000.0));
        assert_eq!(a.beats, 16); // beats 5..=20
                                 // Half of it kept: G = 0.5.
        let s = Series::Points(series(20, |b| 500.0 * b));
        let a = assess(&s, &site(cb(10, 10_000), cb(20, 20_000), 10), &window());
        assert!(close(a.factors.growth.unwrap(), 0.5));
        // Shrinking: clipped to 0.
        let s = Series::Points(series(20, |b| 20_000.0 - 100.0 * b));
        let a = assess(&s, &site(cb(1, 18_000), cb(20, 20_000), 19), &window());
        assert_eq!(a.factors.growth, Some(0.0));
    }

    #[test]
    fn release_is_unfreed_over_allocated() {
        let s = Series::Missing(Degradation::NoSeries);
        let a = assess(&s, &site(cb(1, 250), cb(4, 1000), 3), &window());
        assert!(close(a.factors.release, 0.25));
        let a = assess(&s, &site(cb(0, 0), cb(0, 0), 0), &window());
        assert_eq!(a.factors.release, 0.0);
    }

    #[test]
    fn lifetime_compares_live_age_with_freed_lifetime() {
        let mut f = site(cb(1, 1), cb(10, 10), 7);
        f.mean_live_age_ms = 900.0;
        f.mean_freed_lifetime_ms = 100.0;
        assert_eq!(lifetime_factor(&f), NEUTRAL); // fewer than 8 frees
        f.freed_count = 8;
        assert!(close(lifetime_factor(&f), 0.9));
        f.mean_live_age_ms = 100.0;
        assert!(close(lifetime_factor(&f), 0.5));
        f.mean_live_age_ms = 0.0;
        f.mean_freed_lifetime_ms = 0.0;
        assert_eq!(lifetime_factor(&f), NEUTRAL);
    }

    #[test]
    fn pattern_compares_recent_with_base_slope() {
        // Growth that stopped at beat 10 of 30: recent slope 0 -> P = 0.
        let stopped = series(30, |b| 100.0 * b.min(10.0));
        let (base, recent) = split_recent(
            &stopped
                .iter()
                .copied()
                .filter(|p| p.beat >= 5.0)
                .collect::<Vec<_>>(),
            10.0,
        )
        .map(|(b, r)| (b.to_vec(), r.to_vec()))
        .unwrap();
        // Points 5..=30 (26): span 25 -> recent = last 10 beats: beats 21..=30 (cut at 20).
        assert_eq!(base.len(), 15);
        assert_eq!(recent.len(), 11);
        let w = WindowFacts {
            end_ns: 30_000_000_000,
            ..window()
        };
        let a = assess(
            &Series::Points(stopped),
            &site(cb(10, 1000), cb(10, 1000), 0),
            &w,
        );
        assert_eq!(a.factors.pattern, Some(0.0));
        // Steady growth: recent = base -> P = 1.
        let steady = series(30, |b| 100.0 * b);
        let a = assess(
            &Series::Points(steady),
            &site(cb(30, 3000), cb(30, 3000), 0),
            &w,
        );
        assert!(close(a.factors.pattern.unwrap(), 1.0));
        // Growth that started late: base flat, recent rising -> P = 1.
        let late = series(30, |b| if b < 21.0 { 0.0 } else { 100.0 * (b - 20.0) });
        let a = assess(
            &Series::Points(late),
            &site(cb(10, 1000), cb(10, 1000), 0),
            &w,
        );
        assert_eq!(a.factors.pattern, Some(1.0));
    }

    #[test]
    fn scale_by_count_or_size() {
        assert_eq!(scale_factor(cb(0, 0)), 0.0);
        assert!(close(scale_factor(cb(9, 100)), 0.5)); // log10(10)/2
        assert_eq!(scale_factor(cb(99, 100)), 1.0); // log10(100)/2
                                                    // 1 block of 9 MiB: by size log10(10)/2.8.
        assert!(close(scale_factor(cb(1, 9 * MIB)), 1.0 / 2.8));
    }

    #[test]
    fn lsi_weights_sum_to_100() {
        let all = Factors {
            growth: Some(1.0),
            release: 1.0,
            lifetime: 1.0,
            pattern: Some(1.0),
            scale: 1.0,
        };
        assert!(close(lsi(&all), 100.0));
        let neutral = Factors {
            growth: None,
            release: 0.0,
            lifetime: 0.0,
            pattern: None,
            scale: 0.0,
        };
        assert!(close(lsi(&neutral), 100.0 * (0.26 + 0.12) * 0.5));
    }

    #[test]
    fn steady_leak_is_a_suspected_leak() {
        let s = Series::Points(series(20, |b| 1000.0 * b));
        let a = assess(&s, &site(cb(200, 20_000), cb(200, 20_000), 0), &window());
        // G 1, R 1, S 0.5 (no frees), P 1, E = min(1, log10(201)/2) = 1.
        assert!(close(a.lsi, 100.0 * (0.26 + 0.21 + 0.06 + 0.12 + 0.29)));
        assert_eq!(a.class, Class::SuspectedLeak);
        assert_eq!(a.class_label(), "suspected_leak");
        assert_eq!(a.degraded, None);
    }

    #[test]
    fn one_off_table_is_resident_early() {
        let s = Series::Points(series(20, |_| 40_000.0));
        let mut f = site(cb(1, 40_000), cb(1, 40_000), 0);
        f.last_alloc_ns = 10_000_000; // at 0.01 s of 20 s
        let a = assess(&s, &f, &window());
        assert_eq!(a.factors.growth, Some(0.0));
        assert_eq!(a.class, Class::ResidentEarly);
        assert_eq!(a.class_label(), "resident/early");
    }

    #[test]
    fn bounded_ring_is_resident_turnover() {
        // 16 blocks of 120 B kept of 2000 allocated; live flat at 1920 B.
        let s = Series::Points(series(20, |_| 1920.0));
        let a = assess(&s, &site(cb(16, 1920), cb(2000, 240_000), 1984), &window());
        assert_eq!(a.class, Class::ResidentTurnover);
        assert!(!a.turnover);
    }

    #[test]
    fn leak_hidden_in_heavy_turnover_is_not_resident() {
        // 1 block in 20 kept: R = 0.05, G = 0.05, but live grows steadily.
        let s = Series::Points(series(20, |b| 500.0 * b));
        let a = assess(
            &s,
            &site(cb(100, 10_000), cb(2000, 200_000), 1900),
            &window(),
        );
        assert!(close(a.factors.growth.unwrap(), 0.05));
        assert!(!a.is_resident(), "{:?}", a.class);
        assert!(a.turnover);
        // Recent span: beats 11..=20 (cut at 10): rise 500 * 9 / 10_000 = 0.45.
        assert_eq!(a.class_label(), "growth_watch/turnover");
    }

    #[test]
    fn turnover_with_rising_tail_is_flagged() {
        // Mostly freed (R = 0.2) but live still rises 2000 B/beat over 10_000 B/beat allocated.
        let s = Series::Points(series(20, |b| 2000.0 * b));
        let a = assess(
            &s,
            &site(cb(400, 40_000), cb(2000, 200_000), 1600),
            &window(),
        );
        assert!(close(a.factors.release, 0.2));
        assert!(a.turnover);
        assert!(
            a.class_label().ends_with("/turnover"),
            "{}",
            a.class_label()
        );
        assert!(!a.is_resident());
    }

    #[test]
    fn growth_watch_below_threshold() {
        // Little kept, slowly: G 0.1, R 0.4, small scale.
        let s = Series::Points(series(20, |b| 10.0 * b));
        let a = assess(&s, &site(cb(2, 200), cb(5, 500), 3), &window());
        assert!(a.lsi < SUSPECTED_LEAK_LSI, "{}", a.lsi);
        assert_eq!(a.class, Class::GrowthWatch);
    }

    fn window_of(ms: u64, beat_ms: u64, sampled_ms: f64) -> WindowFacts {
        WindowFacts {
            start_ns: 0,
            end_ns: ms * 1_000_000,
            beat_ms,
            sampled_ms,
        }
    }

    #[test]
    fn warmup_and_recent_span_follow_the_window() {
        // Long windows: the 5 s warm-up and 10 beats of 1 s, as with the fixed 1 s beat.
        let w = window_of(100_000, 1000, 1000.0);
        assert_eq!(
            (w.beats(), w.warmup_beats(), w.recent_min_beats()),
            (100.0, 5.0, 10.0)
        );
        assert_eq!(window_of(20_000, 1000, 1000.0).warmup_beats(), 5.0);
        // 300 s sampled at 4 s: the recent span is at least 40 s.
        assert_eq!(window_of(300_000, 1000, 4000.0).recent_min_beats(), 40.0);
        // 3 s sampled at 62.5 ms: a quarter of the window, 10 beats of 62.5 ms.
        let w = window_of(3000, 1000, 62.5);
        assert_eq!(
            (w.beats(), w.warmup_beats(), w.recent_min_beats()),
            (3.0, 0.75, 0.625)
        );
        // A fixed 100 ms beat over 4 s: the warm-up is 1 s, 10 beats.
        let w = window_of(4000, 100, 100.0);
        assert_eq!(
            (w.beats(), w.warmup_beats(), w.recent_min_beats()),
            (40.0, 10.0, 10.0)
        );
        // An empty window still has a length to divide by.
        assert_eq!(window_of(0, 1000, 62.5).beats(), 0.001);
    }

    /// Live bytes every 62.5 ms (1/16 beat) of a 3 s window, as the adaptive beat samples it.
    fn short_series(f: impl Fn(f64) -> f64) -> Series {
        Series::Points(
            (1..=48)
                .map(|k| SeriesPoint {
                    beat: k as f64 / 16.0,
                    live_bytes: f(k as f64 / 16.0),
                    live_blocks: 1.0,
                    weight: 1.0,
                })
                .collect(),
        )
    }

    #[test]
    fn a_short_window_classifies() {
        let w = window_of(3000, 1000, 62.5);
        // 1000 B kept every 10 ms: 100_000 B per 1 s beat, as much as is allocated.
        let leak = short_series(|b| 100_000.0 * b);
        let mut f = site(cb(300, 300_000), cb(300, 300_000), 0);
        f.last_alloc_ns = 2_990_000_000;
        let a = assess(&leak, &f, &w);
        assert_eq!(a.degraded, None);
        // The points from 0.75 beats (12/16) to 3 beats (48/16).
        assert_eq!(a.beats, 37);
        assert!(close(a.slope.unwrap(), 100_000.0));
        assert_eq!(a.factors.growth, Some(1.0));
        assert!(close(a.factors.pattern.unwrap(), 1.0));
        assert!(close(a.lsi, 100.0 * (0.26 + 0.21 + 0.06 + 0.12 + 0.29)));
        assert_eq!(a.class_label(), "suspected_leak");
        // A table allocated at start and kept: flat after the warm-up.
        let table = short_series(|_| 65_536.0);
        let mut f = site(cb(1, 65_536), cb(1, 65_536), 0);
        f.last_alloc_ns = 1_000_000;
        let a = assess(&table, &f, &w);
        assert_eq!(a.degraded, None);
        assert_eq!(a.factors.growth, Some(0.0));
        assert_eq!(a.class_label(), "resident/early");
    }

    #[test]
    fn a_stack_without_a_series_that_stopped_allocating_is_resident() {
        let w = window();
        let mut f = site(cb(300, 30_000), cb(300, 30_000), 0);
        f.last_alloc_ns = w.start_ns + 11_000_000_000; // 11 s into a 20 s window
        f.mean_live_age_ms = 15_000.0; // born 5 s in, on average
        let a = assess(&Series::Missing(Degradation::NoSeries), &f, &w);
        assert_eq!(a.factors.growth, None, "nothing is guessed");
        assert_eq!(a.degraded, Some(Degradation::NoSeries));
        assert_eq!(a.class_label(), "resident/early");
        // Allocating in the window's last quarter: not called resident...
        f.last_alloc_ns = w.start_ns + 15_500_000_000;
        f.first_alloc_ns = w.start_ns + 1_000_000_000;
        let a = assess(&Series::Missing(Degradation::NoSeries), &f, &w);
        assert!(!a.is_resident());
        // ...unless all of it came in one burst (2 s of 20) that ended before the last tenth.
        f.first_alloc_ns = w.start_ns + 13_500_000_000;
        let a = assess(&Series::Missing(Degradation::NoSeries), &f, &w);
        assert_eq!(a.class_label(), "resident/early");
        f.last_alloc_ns = w.start_ns + 18_500_000_000;
        f.first_alloc_ns = w.start_ns + 16_500_000_000;
        assert!(!assess(&Series::Missing(Degradation::NoSeries), &f, &w).is_resident());
        // A window too short for a series: nothing is said either way.
        let short = WindowFacts {
            start_ns: 0,
            end_ns: 100_000_000,
            beat_ms: 1000,
            sampled_ms: 62.5,
        };
        f.last_alloc_ns = 1_000_000;
        assert!(!assess(&Series::Missing(Degradation::NoSeries), &f, &short).is_resident());
    }

    #[test]
    fn degraded_rows_are_neutral_and_labelled() {
        let f = site(cb(200, 20_000), cb(200, 20_000), 0);
        for reason in [
            Degradation::NoSeries,
            Degradation::SeriesEvicted,
            Degradation::InsufficientSeries,
            Degradation::NoWarmupThread,
        ] {
            let a = assess(&Series::Missing(reason), &f, &window());
            assert_eq!(a.degraded, Some(reason));
            assert_eq!(a.factors.growth, None);
            assert_eq!(a.factors.pattern, None);
            assert!(close(
                a.lsi,
                100.0 * (0.26 * 0.5 + 0.21 + 0.06 + 0.12 * 0.5 + 0.29)
            ));
            assert_ne!(a.class, Class::ResidentEarly);
        }
        // Points only inside the warm-up: insufficient.
        let short = Series::Points(series(4, |b| 100.0 * b));
        assert_eq!(
            assess(&short, &f, &window()).degraded,
            Some(Degradation::InsufficientSeries)
        );
        assert_eq!(Degradation::NoWarmupThread.label(), "no_warmup_thread");
    }

    /// A DataLoader worker's leak: a 16 s process imports for 14 s, then keeps 769 blocks
    /// (1.6 MB) over half a second, then spends 1.5 s exiting.
    fn late_leak() -> (SiteFacts, WindowFacts) {
        let facts = SiteFacts {
            unfreed: cb(769, 1_597_952),
            allocated: cb(788, 1_616_544),
            freed_count: 19,
            mean_live_age_ms: 1750.0,
            mean_freed_lifetime_ms: 50.0,
            last_alloc_ns: 14_500_000_000,
            first_alloc_ns: 14_000_000_000,
        };
        (facts, window_of(16_000, 1000, 250.0))
    }

    fn at(values: &[(f64, f64)]) -> Series {
        Series::Points(points(values))
    }

    #[test]
    fn a_late_leak_gets_one_verdict_whatever_beats_it_got() {
        let (facts, w) = late_leak();
        let full = 1_597_952.0;
        // No beat during the growth, a beat in it, beats only after it, two beats.
        let few = [
            Series::Missing(Degradation::NoSeries),
            at(&[(14.0, 66_576.0), (15.5, full), (16.0, full)]),
            at(&[(14.6, full), (15.5, full), (16.0, full)]),
            at(&[(14.25, 800_000.0), (16.0, full)]),
        ];
        let verdicts: Vec<Assessment> = few.iter().map(|s| assess(s, &facts, &w)).collect();
        // G and P neutral, R 0.99, S 1750/1800, E 1.
        let want = 100.0
            * (0.26 * 0.5
                + 0.21 * (1_597_952.0 / 1_616_544.0)
                + 0.12 * (1750.0 / 1800.0)
                + 0.12 * 0.5
                + 0.29);
        for a in &verdicts {
            assert_eq!(a.factors.growth, None);
            assert!(close(a.lsi, want), "{} != {want}", a.lsi);
            assert_eq!(a.class_label(), "suspected_leak");
        }
        assert_eq!(verdicts[0].degraded, Some(Degradation::NoSeries));
        assert!(verdicts[1..]
            .iter()
            .all(|a| a.degraded == Some(Degradation::InsufficientSeries)));
    }

    #[test]
    fn a_late_leak_with_many_beats_is_a_leak_too() {
        let (facts, _) = late_leak();
        // Sampled every 62.5 ms: the growth from 14 s to 14.5 s, then flat until 16 s.
        let w = window_of(16_000, 1000, 62.5);
        let series = Series::Points(
            (224..=256)
                .map(|k| {
                    let beat = k as f64 / 16.0;
                    SeriesPoint {
                        beat,
                        live_bytes: 1_597_952.0 * ((beat - 14.0) / 0.5).min(1.0),
                        live_blocks: 1.0,
                        weight: 1.0,
                    }
                })
                .collect(),
        );
        let a = assess(&series, &facts, &w);
        assert_eq!(a.degraded, None);
        assert_eq!(a.factors.growth, Some(1.0));
        // The growth ended before the recent span: the pattern says it stopped.
        assert_eq!(a.factors.pattern, Some(0.0));
        assert_eq!(a.class_label(), "suspected_leak");
    }

    #[test]
    fn what_an_import_made_early_stays_resident_with_few_beats() {
        // A table made between 1 s and 3 s of the same 16 s process and kept.
        let w = window_of(16_000, 1000, 250.0);
        let facts = SiteFacts {
            unfreed: cb(1466, 234_560),
            allocated: cb(4472, 426_944),
            freed_count: 3006,
            mean_live_age_ms: 14_000.0,
            mean_freed_lifetime_ms: 5.0,
            last_alloc_ns: 3_000_000_000,
            first_alloc_ns: 1_000_000_000,
        };
        for series in [
            Series::Missing(Degradation::NoSeries),
            at(&[(4.0, 234_560.0), (9.0, 234_560.0), (16.0, 234_560.0)]),
        ] {
            assert_eq!(assess(&series, &facts, &w).class_label(), "resident/early");
        }
    }

    #[test]
    fn late_growth_needs_kept_blocks_born_late() {
        let (facts, w) = late_leak();
        assert!(grew_late(&facts, 0.99, &w));
        // Mostly freed, few blocks, or born early: not late growth.
        assert!(!grew_late(&facts, 0.4, &w));
        let few = SiteFacts {
            unfreed: cb(15, 61_440),
            ..facts
        };
        assert!(!grew_late(&few, 0.99, &w));
        let early = SiteFacts {
            mean_live_age_ms: 9000.0,
            ..facts
        };
        assert!(!grew_late(&early, 0.99, &w));
        // An age younger than the newest allocation allows is taken as born at it.
        let last_early = SiteFacts {
            mean_live_age_ms: 0.0,
            last_alloc_ns: 7_000_000_000,
            ..facts
        };
        assert!(!grew_late(&last_early, 0.99, &w));
    }

    #[test]
    fn import_frames_mark_what_an_import_made() {
        let frames = |list: &[&str]| list.iter().map(|f| f.to_string()).collect::<Vec<_>>();
        assert!(made_by_import(&frames(&[
            "/v/torch/_ops.py(154): OperatorBase.py_impl.<locals>.inner",
            "/v/torch/_meta_registrations.py(9497): <module>",
            "<frozen importlib._bootstrap>(241): _call_with_frames_removed",
        ])));
        assert!(made_by_import(&frames(&[
            "<frozen importlib._bootstrap_external>(729): _compile_bytecode"
        ])));
        assert!(made_by_import(&frames(&[
            "/usr/lib/python3.8/importlib/_bootstrap.py(219): _call_with_frames_removed"
        ])));
        // The script's own top level and a function that mentions importlib are not imports.
        assert!(!made_by_import(&frames(&[
            "/w/train.py(19): <module>",
            "<frozen runpy>(88): _run_code",
        ])));
        assert!(!made_by_import(&frames(&[
            "/w/a.py(3): load_importlib._bootstrap"
        ])));
        assert!(!made_by_import(&[]));
        let (facts, w) = late_leak();
        let a = assess(&Series::Missing(Degradation::NoSeries), &facts, &w).made_once();
        assert_eq!(a.class_label(), "resident/early");
    }
}
