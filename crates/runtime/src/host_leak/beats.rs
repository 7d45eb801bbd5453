//! The beat series: once per beat (1 s by default) the live bytes and blocks of the top-k
//! stacks are appended to a per-stack series, the input of the Leak Suspicion Index.
//!
//! Beats are driven by the program's own allocations: the first allocation after a beat falls
//! due takes it, on its own thread, under the reentrancy guard. Beats add no thread to the
//! program (the only one msmemscope adds is the attach listener, which
//! `MSMEMSCOPE_NO_CONTROL=1` turns off). A window whose program stops allocating gets no beats
//! until the closing sample.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use msmemscope_core::host_leak::lsi::{Series as LsiSeries, SeriesPoint, WARMUP_BEATS};
use msmemscope_core::host_leak::{knobs, CountBytes};

/// Stacks sampled per beat.
pub const TOP_K: usize = 256;
/// Series kept at most; more stacks evict the one with the least live memory now.
pub const MAX_SERIES: usize = 1024;
/// Points per series before its resolution is halved.
pub const SERIES_CAPACITY: usize = 128;
#[derive(Clone, Copy, Debug)]
struct Point {
    /// Beats since the window opened (fractional for the closing sample).
    beat: f64,
    live_bytes: u64,
    live_count: u64,
    weight: u32,
}

#[derive(Debug, Default)]
struct Series {
    points: Vec<Point>,
    /// Beats between points: doubles each time the series is halved.
    step: u32,
}

impl Series {
    fn push(&mut self, beat: f64, live: CountBytes) {
        if self.step == 0 {
            self.step = 1;
        }
        if let Some(last) = self.points.last() {
            if beat < last.beat + self.step as f64 && beat.fract() == 0.0 {
                return;
            }
        }
        if self.points.len() == SERIES_CAPACITY {
            // Keep every second point, each now standing for twice the beats.
            let kept: Vec<Point> = self
                .points
                .iter()
                .skip(1)
                .step_by(2)
                .map(|p| Point {
                    weight: p.weight * 2,
                    ..*p
                })
                .collect();
            self.points = kept;
            self.step *= 2;
        }
        self.points.push(Point {
            beat,
            live_bytes: live.bytes,
            live_count: live.count,
            weight: self.step,
        });
    }
}

#[derive(Default)]
struct Store {
    series: HashMap<u32, Series>,
    evicted: HashSet<u32>,
    /// Beats taken by the program's threads at or after the warm-up.
    beats_after_warmup: u64,
    beats_taken: u64,
}

pub struct Beats {
    start_ns: u64,
    beat_ms: u64,
    /// The next beat index due.
    next_beat: AtomicU64,
    store: Mutex<Store>,
}

/// The series metadata for the report.
#[derive(Clone, Copy, Debug)]
pub struct BeatSummary {
    pub beat_ms: u64,
    pub beats_taken: u64,
    pub series: usize,
    pub evicted: usize,
}

impl Beats {
    pub fn new(start_ns: u64, beat_ms: u64) -> Beats {
        Beats {
            start_ns,
            beat_ms: knobs::BEAT_MS.resolve(Some(beat_ms)),
            next_beat: AtomicU64::new(1),
            store: Mutex::new(Store::default()),
        }
    }

    pub fn beat_ms(&self) -> u64 {
        self.beat_ms
    }

    /// The beat due at `now_ns`, if this caller won the right to take it.
    #[inline]
    pub fn due(&self, now_ns: u64) -> Option<u64> {
        let elapsed_beats = now_ns.saturating_sub(self.start_ns) / (self.beat_ms * 1_000_000);
        let next = self.next_beat.load(Ordering::Relaxed);
        if elapsed_beats < next {
            return None;
        }
        self.next_beat
            .compare_exchange(
                next,
                elapsed_beats + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .ok()
            .map(|_| elapsed_beats)
    }

    /// Records beat `beat` (a whole number, or the closing sample's fraction) from `live`,
    /// every stack's live memory now.
    pub fn record(&self, beat: f64, live: &mut Vec<(u32, CountBytes)>, closing: bool) {
        let Ok(mut store) = self.store.try_lock() else {
            return;
        };
        // The top-k stacks by live bytes.
        if live.len() > TOP_K {
            live.select_nth_unstable_by(TOP_K - 1, |a, b| b.1.bytes.cmp(&a.1.bytes));
            live.truncate(TOP_K);
        }
        let current: HashMap<u32, u64> = live.iter().map(|&(id, cb)| (id, cb.bytes)).collect();
        for &(id, cb) in live.iter() {
            if !store.series.contains_key(&id) && store.series.len() >= MAX_SERIES {
                // Evict the series of the stack with the least live memory now (outside the
                // current top-k it has none counted here).
                let victim = store
                    .series
                    .keys()
                    .copied()
                    .min_by_key(|k| (current.get(k).copied().unwrap_or(0), *k));
                if let Some(victim) = victim {
                    store.series.remove(&victim);
                    store.evicted.insert(victim);
                }
            }
            store.series.entry(id).or_default().push(beat, cb);
        }
        store.beats_taken += 1;
        if !closing && beat >= WARMUP_BEATS as f64 {
            store.beats_after_warmup += 1;
        }
    }

    /// Beats since the window opened at `now_ns`, fractional.
    pub fn beat_at(&self, now_ns: u64) -> f64 {
        now_ns.saturating_sub(self.start_ns) as f64 / (self.beat_ms as f64 * 1e6)
    }

    /// Gives back the series of a closed window whose report is written (up to `MAX_SERIES`
    /// series of `SERIES_CAPACITY` points). `false` when the store could not be locked before
    /// `deadline`. The window takes no beat afterwards (`Ledger::take_beat` checks first).
    pub fn release(&self, deadline: std::time::Instant) -> bool {
        let Some(mut store) = super::block_table::lock_until(&self.store, deadline) else {
            return false;
        };
        let taken = std::mem::take(&mut *store);
        drop(store);
        drop(taken);
        true
    }

    /// Drops the series of recycled stacks: their ids will name other stacks.
    pub fn forget(&self, ids: &[u32]) {
        if let Ok(mut store) = self.store.lock() {
            for id in ids {
                store.series.remove(id);
                store.evicted.remove(id);
            }
        }
    }

    /// The series of stack `id` for the LSI, or why there is none. `window_beats` is the
    /// window's length in beats.
    pub fn series_of(&self, id: Option<u32>, window_beats: f64) -> LsiSeries {
        use msmemscope_core::host_leak::lsi::{Degradation, MIN_POINTS};
        let Ok(store) = self.store.lock() else {
            return LsiSeries::Missing(Degradation::NoSeries);
        };
        if window_beats < (WARMUP_BEATS as usize + MIN_POINTS) as f64 {
            return LsiSeries::Missing(Degradation::InsufficientSeries);
        }
        if store.beats_after_warmup == 0 {
            return LsiSeries::Missing(Degradation::NoWarmupThread);
        }
        let Some(id) = id else {
            return LsiSeries::Missing(Degradation::NoSeries);
        };
        match store.series.get(&id) {
            Some(series) => LsiSeries::Points(
                series
                    .points
                    .iter()
                    .map(|p| SeriesPoint {
                        beat: p.beat,
                        live_bytes: p.live_bytes as f64,
                        live_blocks: p.live_count as f64,
                        weight: p.weight as f64,
                    })
                    .collect(),
            ),
            None if store.evicted.contains(&id) => LsiSeries::Missing(Degradation::SeriesEvicted),
            None => LsiSeries::Missing(Degradation::NoSeries),
        }
    }

    pub fn summary(&self) -> BeatSummary {
        let store = self.store.lock();
        let (beats_taken, series, evicted) = match &store {
            Ok(s) => (s.beats_taken, s.series.len(), s.evicted.len()),
            Err(_) => (0, 0, 0),
        };
        BeatSummary {
            beat_ms: self.beat_ms,
            beats_taken,
            series,
            evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cb(bytes: u64) -> CountBytes {
        CountBytes { count: 1, bytes }
    }

    #[test]
    fn halves_resolution_when_full() {
        let mut s = Series::default();
        for b in 1..=(SERIES_CAPACITY as u64) {
            s.push(b as f64, cb(b));
        }
        assert_eq!(s.points.len(), SERIES_CAPACITY);
        s.push(129.0, cb(129));
        assert_eq!(s.step, 2);
        assert_eq!(s.points.len(), SERIES_CAPACITY / 2 + 1);
        assert_eq!(s.points[0].beat, 2.0);
        assert_eq!(s.points[0].weight, 2);
        assert_eq!(s.points.last().unwrap().beat, 129.0);
        // Beat 130 is skipped (step 2), 131 kept.
        s.push(130.0, cb(130));
        s.push(131.0, cb(131));
        assert_eq!(s.points.last().unwrap().beat, 131.0);
        assert_eq!(s.points.len(), SERIES_CAPACITY / 2 + 2);
    }

    #[test]
    fn due_once_per_beat() {
        let beats = Beats::new(0, 1000);
        assert_eq!(beats.due(500_000_000), None);
        assert_eq!(beats.due(1_200_000_000), Some(1));
        assert_eq!(beats.due(1_900_000_000), None);
        assert_eq!(beats.due(4_100_000_000), Some(4));
    }

    #[test]
    fn reasons_for_a_missing_series() {
        use msmemscope_core::host_leak::lsi::Degradation;
        let missing = |s: LsiSeries| match s {
            LsiSeries::Missing(reason) => Some(reason),
            LsiSeries::Points(_) => None,
        };
        let beats = Beats::new(0, 1000);
        // A window shorter than the warm-up plus the minimum points.
        assert_eq!(
            missing(beats.series_of(Some(1), 7.9)),
            Some(Degradation::InsufficientSeries)
        );
        // Long enough, but only beats inside the warm-up and the closing sample were taken.
        beats.record(3.0, &mut vec![(1, cb(10))], false);
        beats.record(30.5, &mut vec![(1, cb(10))], true);
        assert_eq!(
            missing(beats.series_of(Some(1), 30.5)),
            Some(Degradation::NoWarmupThread)
        );
        // A beat after the warm-up: stack 1 has a series, stack 2 never made the top-k.
        beats.record(6.0, &mut vec![(1, cb(10))], false);
        assert_eq!(missing(beats.series_of(Some(1), 30.5)), None);
        assert_eq!(
            missing(beats.series_of(Some(2), 30.5)),
            Some(Degradation::NoSeries)
        );
        assert_eq!(
            missing(beats.series_of(None, 30.5)),
            Some(Degradation::NoSeries)
        );
        // A recycled stack's series is gone with it.
        beats.forget(&[1]);
        assert_eq!(
            missing(beats.series_of(Some(1), 30.5)),
            Some(Degradation::NoSeries)
        );
    }

    #[test]
    fn keeps_the_top_k_by_live_bytes() {
        let beats = Beats::new(0, 1000);
        let mut live: Vec<(u32, CountBytes)> = (0..(TOP_K as u32 + 10))
            .map(|i| (i, cb(i as u64)))
            .collect();
        beats.record(6.0, &mut live, false);
        assert_eq!(beats.summary().series, TOP_K);
        // The 10 smallest were left out.
        for id in 0..10 {
            assert!(matches!(
                beats.series_of(Some(id), 20.0),
                LsiSeries::Missing(_)
            ));
        }
        assert!(matches!(
            beats.series_of(Some(10), 20.0),
            LsiSeries::Points(_)
        ));
    }

    #[test]
    fn evicts_the_smallest_series_beyond_the_limit() {
        let beats = Beats::new(0, 1000);
        for round in 0..2u32 {
            let mut live: Vec<(u32, CountBytes)> = (0..TOP_K as u32)
                .map(|i| (round * 10_000 + i, cb(1000 + i as u64)))
                .collect();
            beats.record(6.0 + round as f64, &mut live, false);
        }
        // 512 series so far: under the limit.
        assert_eq!(beats.summary().series, 2 * TOP_K);
        for round in 2..5u32 {
            let mut live: Vec<(u32, CountBytes)> = (0..TOP_K as u32)
                .map(|i| (round * 10_000 + i, cb(1000 + i as u64)))
                .collect();
            beats.record(6.0 + round as f64, &mut live, false);
        }
        let summary = beats.summary();
        assert_eq!(summary.series, MAX_SERIES);
        assert_eq!(summary.evicted, 5 * TOP_K - MAX_SERIES);
        assert!(matches!(
            beats.series_of(Some(0), 20.0),
            LsiSeries::Missing(msmemscope_core::host_leak::lsi::Degradation::SeriesEvicted)
        ));
        assert!(matches!(
            beats.series_of(Some(40_000), 20.0),
            LsiSeries::Points(_)
        ));
    }
}
