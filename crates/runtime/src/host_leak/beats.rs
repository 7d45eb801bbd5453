//! The beat series: at every beat the live bytes and blocks of the top-k stacks are appended to
//! a per-stack series, the input of the Leak Suspicion Index.
//!
//! The beat adapts to the window, so that a window of a second already gives the LSI enough
//! points and one past its first minute is sampled no more often than with a fixed 1 s beat:
//! it starts at 1/16 of the configured beat (62.5 ms of 1 s) and doubles whenever the window
//! outgrows what `SERIES_CAPACITY` beats cover; every series then merges its points pairwise.
//! A window of T ≥ 8 s thus ends with 64 to 128 beats per series, of T/128 to T/64 each: 1 s
//! from 64 s to 128 s, beyond which the fixed 1 s beat's series halved their resolution at the
//! same points. `MSMEMSCOPE_HOST_BEAT_MS` fixes the beat: it is taken every period, and only
//! the series' resolution is halved when they fill.
//!
//! Positions are kept in starting beats (whole numbers for beats, a fraction for the closing
//! sample) and handed to the LSI in configured beats, the report's unit for slopes.
//!
//! Beats are driven by the program's own allocations: the first allocation after a beat falls
//! due takes it, on its own thread, under the reentrancy guard. Beats add no thread to the
//! program (the only one msmemscope adds is the attach listener, which
//! `MSMEMSCOPE_NO_CONTROL=1` turns off). A window whose program stops allocating gets no beats
//! until the closing sample.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use msmemscope_core::host_leak::lsi::{
    Degradation, Series as LsiSeries, SeriesPoint, WindowFacts, MIN_POINTS,
};
use msmemscope_core::host_leak::{knobs, CountBytes};

/// Stacks sampled per beat.
pub const TOP_K: usize = 256;
/// Series kept at most; more stacks evict the one with the least live memory now.
pub const MAX_SERIES: usize = 1024;
/// Points per series before its resolution is halved.
pub const SERIES_CAPACITY: usize = 128;
/// An adaptive beat starts at the configured beat divided by 2^this: 62.5 ms of 1 s, so that a
/// window of 1 s has 16 beats, and four doublings (at 64 s) reach the configured beat exactly.
pub const ADAPTIVE_START_SHIFT: u32 = 4;
/// After a beat's pass over the stacks, the next one waits this many times as long as the pass
/// took: beats cost the program at most 1/(1 + this) of its time (2.5 %).
pub const BEAT_COST_RATIO: u64 = 39;
/// Doublings at most: 62.5 ms · 2^32 is 8.5 years, so this bounds only the arithmetic.
const MAX_LEVEL: u32 = 32;
/// The beat state packs the level (doublings so far) above the next beat's index.
const LEVEL_SHIFT: u32 = 56;
const INDEX_MASK: u64 = (1 << LEVEL_SHIFT) - 1;

/// Keeps the top-k of `live` by live bytes (in no order). A beat calls it as the pass goes,
/// whenever `live` holds twice as many, so its memory stays bounded however many stacks live.
/// Returns the least live bytes kept once it kept TOP_K of more (0 otherwise): a stack with
/// fewer cannot enter the top-k any more, so the pass need not keep it.
pub fn keep_top_k(live: &mut Vec<(u32, CountBytes)>) -> u64 {
    if live.len() > TOP_K {
        live.select_nth_unstable_by(TOP_K - 1, |a, b| b.1.bytes.cmp(&a.1.bytes));
        live.truncate(TOP_K);
        return live[TOP_K - 1].1.bytes;
    }
    0
}

fn pack(level: u32, next: u64) -> u64 {
    ((level as u64) << LEVEL_SHIFT) | next.min(INDEX_MASK)
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    /// Starting beats since the window opened (fractional for the closing sample).
    beat: f64,
    live_bytes: u64,
    live_count: u64,
    /// Starting beats the point stands for.
    weight: u64,
}

#[derive(Debug, Default)]
struct Series {
    points: Vec<Point>,
}

impl Series {
    /// Appends the sample at `beat`, taken when the series' resolution is `level`.
    fn push(&mut self, beat: f64, level: u32, live: CountBytes, closing: bool) {
        let weight = 1u64 << level;
        let point = Point {
            beat,
            live_bytes: live.bytes,
            live_count: live.count,
            weight,
        };
        let full = self.points.len() >= SERIES_CAPACITY;
        match self.points.last_mut() {
            // The closing sample where a beat was just taken (or after the clock stepped back):
            // the newer values end the series.
            Some(last) if beat <= last.beat => {
                if closing {
                    last.live_bytes = point.live_bytes;
                    last.live_count = point.live_count;
                }
            }
            // Finer than the series' resolution (a fixed beat whose series were halved).
            Some(last) if !closing && beat < last.beat + weight as f64 => {}
            // No room left (only a closing sample close after the last beat can find none):
            // it takes the last point's place, and its weight.
            Some(last) if full => {
                *last = Point {
                    weight: last.weight + weight,
                    ..point
                };
            }
            _ => self.points.push(point),
        }
    }

    /// Halves the resolution (or more) in place: the points that fall into one beat of
    /// `level` become its latest sample, standing for all of their beats.
    fn coarsen(&mut self, level: u32) {
        let width = (1u64 << level) as f64;
        let slot = |p: &Point| (p.beat / width).ceil();
        let mut kept = 0;
        for i in 0..self.points.len() {
            let p = self.points[i];
            if kept > 0 && slot(&self.points[kept - 1]) == slot(&p) {
                let merged = &mut self.points[kept - 1];
                *merged = Point {
                    weight: merged.weight + p.weight,
                    ..p
                };
            } else {
                self.points[kept] = p;
                kept += 1;
            }
        }
        self.points.truncate(kept);
    }
}

#[derive(Default)]
struct Store {
    series: HashMap<u32, Series>,
    evicted: HashSet<u32>,
    /// The series' resolution: every point stands for 2^level starting beats.
    level: u32,
    /// The latest beat a program thread took (not the closing sample), in starting beats.
    last_beat: Option<f64>,
    beats_taken: u64,
}

pub struct Beats {
    start_ns: u64,
    /// The configured beat, the unit of positions handed to the LSI.
    beat_ms: u64,
    /// `false` with `MSMEMSCOPE_HOST_BEAT_MS`: the beat stays `beat_ms`.
    adaptive: bool,
    /// Configured beats are 2^shift starting beats.
    shift: u32,
    first_ns: u64,
    /// The level and the next beat index due at it (`pack`).
    next: AtomicU64,
    /// When that beat is due, in ns since the epoch: before it, `due` answers with one load
    /// and one compare (no division on the allocation path). Never later than the truth.
    due_at_ns: AtomicU64,
    store: Mutex<Store>,
}

/// The series metadata for the report.
#[derive(Clone, Copy, Debug)]
pub struct BeatSummary {
    pub beat_ms: u64,
    pub adaptive: bool,
    pub first_beat_ms: f64,
    /// The beat the series hold now (the configured beat when fixed).
    pub last_beat_ms: f64,
    pub beats_taken: u64,
    pub series: usize,
    pub evicted: usize,
}

impl Beats {
    pub fn new(start_ns: u64, beat_ms: u64, fixed: bool) -> Beats {
        let beat_ms = knobs::BEAT_MS.resolve(Some(beat_ms));
        let shift = if fixed { 0 } else { ADAPTIVE_START_SHIFT };
        Beats {
            start_ns,
            beat_ms,
            adaptive: !fixed,
            shift,
            first_ns: ((beat_ms * 1_000_000) >> shift).max(1),
            next: AtomicU64::new(pack(0, 1)),
            due_at_ns: AtomicU64::new(0),
            store: Mutex::new(Store::default()),
        }
    }

    pub fn beat_ms(&self) -> u64 {
        self.beat_ms
    }

    /// The beat due at `now_ns` (its position in starting beats), if this caller won the
    /// right to take it.
    #[inline]
    pub fn due(&self, now_ns: u64) -> Option<f64> {
        if now_ns < self.due_at_ns.load(Ordering::Relaxed) {
            return None;
        }
        let state = self.next.load(Ordering::Relaxed);
        let level = (state >> LEVEL_SHIFT) as u32;
        let next = state & INDEX_MASK;
        let elapsed = now_ns.saturating_sub(self.start_ns);
        let index = elapsed / (self.first_ns << level);
        if index < next {
            return None;
        }
        self.claim(state, level, next, elapsed, index)
    }

    /// Takes the due beat, doubling an adaptive beat first when the window has outgrown what
    /// the series hold at it.
    fn claim(&self, state: u64, level: u32, next: u64, elapsed: u64, index: u64) -> Option<f64> {
        let (mut level, mut next, mut index) = (level, next, index);
        while self.adaptive && index > SERIES_CAPACITY as u64 && level < MAX_LEVEL {
            level += 1;
            index = elapsed / (self.first_ns << level);
            // The next beat at the coarser level lies after every beat already taken.
            next = next.div_ceil(2);
        }
        let (taken, after) = if index >= next {
            (Some(index << level), index + 1)
        } else {
            (None, next)
        };
        self.next
            .compare_exchange(
                state,
                pack(level, after),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .ok()?;
        // Only the winner of the state moves the deadline; a racing older store can only leave
        // it earlier than the truth, which costs a division, not a beat.
        let due = self
            .start_ns
            .saturating_add(after.saturating_mul(self.first_ns << level));
        self.due_at_ns.fetch_max(due, Ordering::Relaxed);
        taken.map(|beat| beat as f64)
    }

    /// The series' level for a sample at `beat`: the coarsest they need to hold it in
    /// `SERIES_CAPACITY` points.
    fn level_for(from: u32, beat: f64) -> u32 {
        let mut level = from;
        while level < MAX_LEVEL && beat > (SERIES_CAPACITY as u64 * (1u64 << level)) as f64 {
            level += 1;
        }
        level
    }

    /// Records the beat at `beat` (starting beats: a whole number, or the closing sample's
    /// fraction) from `live`, every stack's live memory now.
    pub fn record(&self, beat: f64, live: &mut Vec<(u32, CountBytes)>, closing: bool) {
        let Ok(mut store) = self.store.try_lock() else {
            return;
        };
        let level = Self::level_for(store.level, beat);
        if level > store.level {
            for series in store.series.values_mut() {
                series.coarsen(level);
            }
            store.level = level;
        }
        let _ = keep_top_k(live);
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
            store
                .series
                .entry(id)
                .or_default()
                .push(beat, level, cb, closing);
        }
        store.beats_taken += 1;
        if !closing {
            store.last_beat = Some(store.last_beat.map_or(beat, |b| b.max(beat)));
        }
    }

    /// Takes no beat before `until_ns`: a beat is a pass over every stack, which in a window
    /// of a million stacks (a Python process) takes tens of milliseconds on the program's own
    /// thread; after each pass the next waits [`BEAT_COST_RATIO`] times as long as it took.
    pub fn hold_off(&self, until_ns: u64) {
        self.due_at_ns.fetch_max(until_ns, Ordering::Relaxed);
    }

    /// Starting beats since the window opened at `now_ns`, fractional.
    pub fn beat_at(&self, now_ns: u64) -> f64 {
        now_ns.saturating_sub(self.start_ns) as f64 / self.first_ns as f64
    }

    /// `beat` (starting beats) in configured beats.
    fn configured(&self, beat: f64) -> f64 {
        beat / (1u64 << self.shift) as f64
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

    /// The series of stack `id` for the LSI, or why there is none.
    pub fn series_of(&self, id: Option<u32>, window: &WindowFacts) -> LsiSeries {
        let Ok(store) = self.store.lock() else {
            return LsiSeries::Missing(Degradation::NoSeries);
        };
        let warmup = window.warmup_beats();
        // The window must leave room for the points of a slope after the warm-up, at the beat
        // it started with.
        if window.beats() - warmup < MIN_POINTS as f64 * self.configured(1.0) {
            return LsiSeries::Missing(Degradation::InsufficientSeries);
        }
        if !store
            .last_beat
            .is_some_and(|beat| self.configured(beat) >= warmup)
        {
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
                        beat: self.configured(p.beat),
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
        let (beats_taken, series, evicted, level) = match &store {
            Ok(s) => (s.beats_taken, s.series.len(), s.evicted.len(), s.level),
            Err(_) => (0, 0, 0, 0),
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        let (first_beat_ms, last_beat_ms) = if self.adaptive {
            (ms(self.first_ns), ms(self.first_ns << level))
        } else {
            (self.beat_ms as f64, self.beat_ms as f64)
        };
        BeatSummary {
            beat_ms: self.beat_ms,
            adaptive: self.adaptive,
            first_beat_ms,
            last_beat_ms,
            beats_taken,
            series,
            evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msmemscope_core::host_leak::lsi::{self, SiteFacts};

    fn cb(bytes: u64) -> CountBytes {
        CountBytes { count: 1, bytes }
    }

    fn window(ms: u64, beats: &Beats) -> WindowFacts {
        WindowFacts {
            start_ns: 0,
            end_ns: ms * 1_000_000,
            beat_ms: beats.beat_ms(),
            sampled_ms: beats.summary().last_beat_ms,
        }
    }

    fn points(beats: &Beats, id: u32) -> Vec<Point> {
        beats.store.lock().unwrap().series[&id].points.clone()
    }

    fn point(beat: f64, weight: u64) -> Point {
        Point {
            beat,
            live_bytes: beat as u64,
            live_count: 1,
            weight,
        }
    }

    #[test]
    fn halves_resolution_when_full() {
        let beats = Beats::new(0, 1000, true);
        for b in 1..=(SERIES_CAPACITY as u64) {
            beats.record(b as f64, &mut vec![(1, cb(b))], false);
        }
        assert_eq!(points(&beats, 1).len(), SERIES_CAPACITY);
        beats.record(129.0, &mut vec![(1, cb(129))], false);
        // Every second point is kept, standing for two beats; beat 129 is finer than that.
        let p = points(&beats, 1);
        assert_eq!(p.len(), SERIES_CAPACITY / 2);
        assert_eq!((p[0].beat, p[0].live_bytes, p[0].weight), (2.0, 2, 2));
        assert_eq!((p[63].beat, p[63].weight), (128.0, 2));
        // Beat 130 is kept, 131 is not; the closing sample always is.
        beats.record(130.0, &mut vec![(1, cb(130))], false);
        beats.record(131.0, &mut vec![(1, cb(131))], false);
        beats.record(131.5, &mut vec![(1, cb(132))], true);
        let p = points(&beats, 1);
        assert_eq!(p.len(), SERIES_CAPACITY / 2 + 2);
        assert_eq!((p[64].beat, p[64].weight), (130.0, 2));
        assert_eq!((p[65].beat, p[65].live_bytes), (131.5, 132));
        // A fixed beat stays what it was set to.
        let s = beats.summary();
        assert_eq!(
            (s.adaptive, s.first_beat_ms, s.last_beat_ms),
            (false, 1000.0, 1000.0)
        );
        assert_eq!(s.beats_taken, 132);
    }

    #[test]
    fn coarsening_keeps_each_slots_latest_sample() {
        let mut s = Series {
            points: vec![point(1.0, 1), point(3.0, 1), point(4.0, 1), point(7.0, 1)],
        };
        s.coarsen(1);
        assert_eq!(s.points, vec![point(1.0, 1), point(4.0, 2), point(7.0, 1)]);
        // Several doublings at once (a program that allocated nothing for a while).
        s.coarsen(3);
        assert_eq!(s.points, vec![point(7.0, 4)]);
    }

    #[test]
    fn a_closing_sample_always_ends_the_series() {
        let mut s = Series {
            points: (1..=SERIES_CAPACITY).map(|b| point(b as f64, 1)).collect(),
        };
        // Where the last beat was taken: its values are replaced.
        s.push(128.0, 0, cb(7), true);
        assert_eq!(s.points.len(), SERIES_CAPACITY);
        assert_eq!((s.points[127].live_bytes, s.points[127].weight), (7, 1));
        // Full, and just after it: it takes the last point's place.
        s.push(128.25, 0, cb(9), true);
        assert_eq!(s.points.len(), SERIES_CAPACITY);
        assert_eq!(
            s.points[127],
            Point {
                beat: 128.25,
                live_bytes: 9,
                live_count: 1,
                weight: 2
            }
        );
    }

    #[test]
    fn a_held_off_beat_is_skipped_until_the_pause_ends() {
        let beats = Beats::new(0, 1000, true);
        assert_eq!(beats.due(1_200_000_000), Some(1.0));
        beats.hold_off(5_500_000_000);
        assert_eq!(beats.due(2_100_000_000), None);
        assert_eq!(beats.due(5_000_000_000), None);
        assert_eq!(beats.due(5_600_000_000), Some(5.0));
    }

    #[test]
    fn top_k_kept_as_the_pass_goes_is_the_top_k() {
        let bytes = |i: u32| u64::from(i.wrapping_mul(2_654_435_761) % 100_003);
        let mut all: Vec<(u32, CountBytes)> = (0..5000).map(|i| (i, cb(bytes(i)))).collect();
        let mut kept = Vec::new();
        let mut floor = 0;
        for &entry in &all {
            if entry.1.bytes < floor {
                continue;
            }
            if kept.len() == 2 * TOP_K {
                floor = keep_top_k(&mut kept);
            }
            kept.push(entry);
        }
        assert!(floor > 0);
        keep_top_k(&mut kept);
        keep_top_k(&mut all);
        let ids = |v: &[(u32, CountBytes)]| {
            let mut ids: Vec<u32> = v.iter().map(|e| e.0).collect();
            ids.sort_unstable();
            ids
        };
        assert_eq!(kept.len(), TOP_K);
        assert_eq!(ids(&kept), ids(&all));
    }

    #[test]
    fn due_once_per_beat() {
        let beats = Beats::new(0, 1000, true);
        assert_eq!(beats.due(500_000_000), None);
        assert_eq!(beats.due(1_200_000_000), Some(1.0));
        assert_eq!(beats.due(1_900_000_000), None);
        assert_eq!(beats.due(4_100_000_000), Some(4.0));
        // A fixed beat never doubles, however long the window.
        assert_eq!(beats.due(1_000_000_000_000), Some(1000.0));
    }

    #[test]
    fn an_adaptive_beat_doubles_when_the_series_fill() {
        let ms = 1_000_000;
        let beats = Beats::new(0, 1000, false);
        assert_eq!(beats.summary().first_beat_ms, 62.5);
        assert_eq!(beats.due(50 * ms), None);
        assert_eq!(beats.due(62_500_000), Some(1.0));
        assert_eq!(beats.due(100 * ms), None);
        assert_eq!(beats.due(8000 * ms), Some(128.0));
        // Beat 129 of 62.5 ms would overfill the series: the beat is 125 ms from here, and
        // its next one (at 8.125 s, 130 starting beats) lies after beat 128.
        assert_eq!(beats.due(8070 * ms), None);
        assert_eq!(beats.due(8125 * ms), Some(130.0));
        assert_eq!(beats.due(8200 * ms), None);
        // Nothing allocated until 100 s: three more doublings, to 1 s.
        assert_eq!(beats.due(100_000 * ms), Some(1600.0));
        assert_eq!(beats.due(100_500 * ms), None);
        assert_eq!(beats.due(101_000 * ms), Some(1616.0));
    }

    /// A window of `ms` with the adaptive beat: stack 1 leaks 1000 B every 10 ms, stack 2 is a
    /// 64 KiB table allocated at start; the beats their allocations take, and the closing one.
    fn run_window(ms: u64) -> Beats {
        let beats = Beats::new(0, 1000, false);
        for t in (10..=ms).step_by(10) {
            let leak = CountBytes {
                count: t / 10,
                bytes: t * 100,
            };
            if let Some(beat) = beats.due(t * 1_000_000) {
                beats.record(beat, &mut vec![(1, leak), (2, cb(65_536))], false);
            }
        }
        let leak = CountBytes {
            count: ms / 10,
            bytes: ms * 100,
        };
        let end = beats.beat_at(ms * 1_000_000);
        beats.record(end, &mut vec![(1, leak), (2, cb(65_536))], true);
        beats
    }

    fn assess(beats: &Beats, w: &WindowFacts, id: u32, facts: SiteFacts) -> lsi::Assessment {
        lsi::assess(&beats.series_of(Some(id), w), &facts, w)
    }

    #[test]
    fn windows_of_a_second_and_more_classify() {
        // (window ms, points, points after the warm-up, beat at the end, beats taken)
        let cases = [
            (1000, 16, 13, 62.5, 17),
            (3000, 48, 37, 62.5, 49),
            (10_000, 80, 61, 125.0, 145),
            (100_000, 100, 96, 1000.0, 357),
            (1_000_000, 125, 125, 8000.0, 574),
        ];
        for (ms, total, after, last_ms, taken) in cases {
            let beats = run_window(ms);
            let w = window(ms, &beats);
            let summary = beats.summary();
            assert_eq!(
                (summary.last_beat_ms, summary.beats_taken),
                (last_ms, taken),
                "{ms} ms"
            );
            assert_eq!(points(&beats, 1).len(), total, "{ms} ms");
            let blocks = ms / 10;
            let leak = SiteFacts {
                unfreed: CountBytes {
                    count: blocks,
                    bytes: blocks * 1000,
                },
                allocated: CountBytes {
                    count: blocks,
                    bytes: blocks * 1000,
                },
                freed_count: 0,
                mean_live_age_ms: ms as f64 / 2.0,
                mean_freed_lifetime_ms: 0.0,
                last_alloc_ns: ms * 1_000_000,
                first_alloc_ns: 0,
            };
            let a = assess(&beats, &w, 1, leak);
            assert_eq!((a.beats, a.degraded), (after, None), "{ms} ms");
            assert_eq!(a.class_label(), "suspected_leak", "{ms} ms: {a:?}");
            let table = SiteFacts {
                unfreed: cb(65_536),
                allocated: cb(65_536),
                last_alloc_ns: 1_000_000,
                ..leak
            };
            let a = assess(&beats, &w, 2, table);
            assert_eq!(a.degraded, None, "{ms} ms");
            assert_eq!(a.class_label(), "resident/early", "{ms} ms: {a:?}");
        }
        // From 64 s on the series hold what the fixed 1 s beat gave: a point per second.
        let beats = run_window(100_000);
        let w = window(100_000, &beats);
        let LsiSeries::Points(p) = beats.series_of(Some(1), &w) else {
            panic!("no series");
        };
        let at: Vec<f64> = p.iter().map(|p| p.beat).collect();
        assert_eq!(at, (1..=100).map(|b| b as f64).collect::<Vec<_>>());
        assert!(p.iter().all(|p| p.weight == 16.0));
    }

    #[test]
    fn reasons_for_a_missing_series() {
        let missing = |s: LsiSeries| match s {
            LsiSeries::Missing(reason) => Some(reason),
            LsiSeries::Points(_) => None,
        };
        let beats = Beats::new(0, 1000, true);
        // A window with no room for 3 beats after its warm-up (3.9 s - 0.975 s).
        assert_eq!(
            missing(beats.series_of(Some(1), &window(3900, &beats))),
            Some(Degradation::InsufficientSeries)
        );
        // Long enough, but only beats inside the warm-up and the closing sample were taken.
        let w = window(30_500, &beats);
        beats.record(3.0, &mut vec![(1, cb(10))], false);
        beats.record(30.5, &mut vec![(1, cb(10))], true);
        assert_eq!(
            missing(beats.series_of(Some(1), &w)),
            Some(Degradation::NoWarmupThread)
        );
        // A beat after the warm-up: stack 1 has a series, stack 2 never made the top-k.
        beats.record(6.0, &mut vec![(1, cb(10))], false);
        assert_eq!(missing(beats.series_of(Some(1), &w)), None);
        assert_eq!(
            missing(beats.series_of(Some(2), &w)),
            Some(Degradation::NoSeries)
        );
        assert_eq!(
            missing(beats.series_of(None, &w)),
            Some(Degradation::NoSeries)
        );
        // A recycled stack's series is gone with it.
        beats.forget(&[1]);
        assert_eq!(
            missing(beats.series_of(Some(1), &w)),
            Some(Degradation::NoSeries)
        );
        // The adaptive beat: a window of 0.2 s has no room for 3 beats of 62.5 ms after its
        // 50 ms warm-up; 0.25 s has.
        let beats = Beats::new(0, 1000, false);
        beats.record(3.0, &mut vec![(1, cb(10))], false);
        assert_eq!(
            missing(beats.series_of(Some(1), &window(200, &beats))),
            Some(Degradation::InsufficientSeries)
        );
        assert_eq!(
            missing(beats.series_of(Some(1), &window(250, &beats))),
            None
        );
    }

    #[test]
    fn keeps_the_top_k_by_live_bytes() {
        let beats = Beats::new(0, 1000, true);
        let mut live: Vec<(u32, CountBytes)> = (0..(TOP_K as u32 + 10))
            .map(|i| (i, cb(i as u64)))
            .collect();
        beats.record(6.0, &mut live, false);
        assert_eq!(beats.summary().series, TOP_K);
        let w = window(20_000, &beats);
        // The 10 smallest were left out.
        for id in 0..10 {
            assert!(matches!(
                beats.series_of(Some(id), &w),
                LsiSeries::Missing(_)
            ));
        }
        assert!(matches!(
            beats.series_of(Some(10), &w),
            LsiSeries::Points(_)
        ));
    }

    #[test]
    fn evicts_the_smallest_series_beyond_the_limit() {
        let beats = Beats::new(0, 1000, true);
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
        let w = window(20_000, &beats);
        assert!(matches!(
            beats.series_of(Some(0), &w),
            LsiSeries::Missing(Degradation::SeriesEvicted)
        ));
        assert!(matches!(
            beats.series_of(Some(40_000), &w),
            LsiSeries::Points(_)
        ));
    }
}
