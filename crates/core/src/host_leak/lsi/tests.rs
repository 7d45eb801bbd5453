//! The LSI's factors and classes on series and facts built by hand.

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
