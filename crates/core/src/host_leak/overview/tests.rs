//! The overview's sections, rendered from reports built by hand.

use super::*;
use crate::host_leak::lsi::{assess, Degradation, Series, SeriesPoint, SiteFacts, WindowFacts};
use crate::host_leak::model::{DataHealth, SeriesMeta, WindowSpan};

fn cb(count: u64, bytes: u64) -> CountBytes {
    CountBytes { count, bytes }
}

fn health() -> DataHealth {
    DataHealth {
        mode: HostLeakMode::Summary,
        allocations: cb(1000, 100_000),
        frees: cb(900, 60_000),
        distinct_stacks: 3,
        unknown_bucket_allocations: 0,
        recycled_stacks: 0,
        truncation_bits: 0,
        stopped_at_ns: None,
        overflow_allocations: cb(0, 0),
        overflow_frees: cb(0, 0),
        prewindow_frees: cb(0, 0),
        sample_rate: 1,
        sample_rate_requested: 1,
        sample_bytes: 0,
        untracked_sampled: cb(0, 0),
        frees_untracked: 0,
        block_size_threshold: 0,
        untracked_below_threshold: cb(0, 0),
        symbolized_frames: 2,
        total_frames: 2,
        cut_stacks: 0,
        python_version: None,
        python_depth: 20,
        block_cap: 20_000_000,
        overflow_cap: 5_000_000,
        stack_cap: 400_000,
        unread_shards: 0,
        allocator: AllocatorPath::Glibc,
        python_objects: PythonObjects::NoInterpreter,
    }
}

fn site(id: u32, series: Series, facts: SiteFacts, frame: &str) -> LeakSite {
    let window = WindowFacts {
        start_ns: 0,
        end_ns: 20_000_000_000,
        beat_ms: 1000,
        sampled_ms: 1000.0,
    };
    LeakSite {
        stack_id: Some(id),
        unfreed: facts.unfreed,
        allocated: facts.allocated,
        freed: cb(
            facts.allocated.count - facts.unfreed.count,
            facts.allocated.bytes - facts.unfreed.bytes,
        ),
        assessment: assess(&series, &facts, &window),
        samples: facts.unfreed.count,
        frames: vec![frame.to_string()],
        python_frames: Vec::new(),
        cut: false,
        domain: AllocDomain::Malloc,
        live_series: Vec::new(),
    }
}

fn report(sites: Vec<LeakSite>, interim: bool) -> HostLeakReport {
    let (sites, resident) = HostLeakReport::rank_sites(sites);
    HostLeakReport {
        stage: 2,
        pid: 77,
        interim,
        window: WindowSpan {
            start_ns: 0,
            end_ns: 20_000_000_000,
            still_open: interim,
        },
        health: health(),
        unfreed: cb(100, 40_000),
        overflow_unfreed: cb(0, 0),
        unfreed_sizes: SizeHistogram::default(),
        prewindow_free_sizes: SizeHistogram::default(),
        sites,
        resident,
        series: SeriesMeta {
            top_k: 256,
            max_series: 1024,
            beat_ms: 1000,
            adaptive: false,
            first_beat_ms: 1000.0,
            last_beat_ms: 1000.0,
            beats_taken: 20,
            window_beats: 20.0,
            series: 3,
            evicted: 0,
        },
        top_n: 10,
        snapshot_freeze: cb(0, 0),
    }
}

fn line(values: impl Fn(f64) -> f64) -> Series {
    Series::Points(
        (1..=20)
            .map(|b| SeriesPoint {
                beat: b as f64,
                live_bytes: values(b as f64),
                live_blocks: 1.0,
                weight: 1.0,
            })
            .collect(),
    )
}

fn facts(unfreed: CountBytes, allocated: CountBytes, last_alloc_ns: u64) -> SiteFacts {
    SiteFacts {
        unfreed,
        allocated,
        freed_count: allocated.count - unfreed.count,
        mean_live_age_ms: 0.0,
        mean_freed_lifetime_ms: 0.0,
        last_alloc_ns,
        first_alloc_ns: 0,
    }
}

fn sample() -> Vec<LeakSite> {
    vec![
        site(
            1,
            line(|_| 30_000.0),
            facts(cb(1, 30_000), cb(1, 30_000), 1_000_000),
            "table_init a.c:1",
        ),
        site(
            2,
            line(|b| 500.0 * b),
            facts(cb(99, 10_000), cb(99, 10_000), 19_000_000_000),
            "leak a.c:2",
        ),
        site(
            3,
            Series::Missing(Degradation::SeriesEvicted),
            facts(cb(1, 8), cb(1, 8), 19_000_000_000),
            "rare a.c:3",
        ),
    ]
}

#[test]
fn python_object_sites_say_their_allocator() {
    let mut sites = sample();
    sites[1].domain = AllocDomain::Pymalloc;
    sites[1].frames.clear();
    sites[1].python_frames = vec!["train.py(12): collect".to_string()];
    let mut r = report(sites, false);
    let text = render_overview(&r);
    assert!(!text.contains("Python objects:"), "{text}");
    assert!(
        text.contains("#1 [stack 2, pymalloc] unfreed 99 blocks / 10000 bytes;"),
        "{text}"
    );
    assert!(text.contains("\n    py train.py(12): collect\n"), "{text}");
    r.health.python_objects = PythonObjects::Tracked {
        allocations: cb(5, 500),
    };
    assert!(render_overview(&r).contains(
        "\nPython objects: tracked (pymalloc, the interpreter's own allocators): 5 (500 bytes);"
    ));
    r.health.python_objects = PythonObjects::NotInstalled;
    assert!(render_overview(&r).contains("\nPython objects: NOT tracked: "));
}

#[test]
fn sections_order_and_classes() {
    let text = render_overview(&report(sample(), false));
    assert!(text.starts_with("====== Host Leak Overview: stage=2, pid=77 ======\n"));
    let order: Vec<&str> = text.lines().filter(|l| l.starts_with("--- ")).collect();
    assert_eq!(order.len(), 6, "{text}");
    assert!(order[3].starts_with("--- Pre-Window Free Size Distribution"));
    assert_eq!(
        order[4],
        "--- TOP 10 Leak Sites (by LSI; 2 of 2 sites with unfreed blocks shown) ---"
    );
    assert_eq!(
        order[5],
        "--- Resident Baselines (1 of 1 sites shown; caches, pools and rings: not in the TOP N) ---"
    );
    assert!(text.contains(
        "Series: top-k=256, max-stacks=1024, beats=20 (1000 ms each), window=20.0 beats, series=3, evicted=0\n"
    ));
    // An adaptive beat: 3 s at 62.5 ms; 128 s end at 1 s (128 beats, then 64 per doubling).
    let mut r = report(sample(), false);
    r.series.adaptive = true;
    r.series.first_beat_ms = 62.5;
    r.series.last_beat_ms = 62.5;
    r.series.beats_taken = 48;
    r.series.window_beats = 3.0;
    assert!(render_overview(&r).contains(
        "Series: top-k=256, max-stacks=1024, beats=48 (start 62.5 ms, now 62.5 ms each), window=3.0 beats of 1000 ms, series=3, evicted=0\n"
    ));
    r.series.last_beat_ms = 1000.0;
    r.series.beats_taken = 384;
    r.series.window_beats = 128.0;
    assert!(render_overview(&r)
        .contains("beats=384 (start 62.5 ms, now 1000 ms each), window=128.0 beats of 1000 ms,"));
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(rows[0], "#1 [stack 2] unfreed 99 blocks / 10000 bytes; allocated 99 / 10000 bytes; freed 0 / 0 bytes");
    assert!(rows[1].starts_with("#2 [stack 3]"));
    assert!(rows[2].starts_with("#R1 [stack 1]"));
    assert!(text.contains("\n  suspected_leak LSI=94.0 Growth=1.00 Release=1.00 Lifetime=0.50 Pattern=1.00 Scale=1.00 slope=+500.0 B/beat beats=16\n    leak a.c:2\n"), "{text}");
    assert!(text.contains("Growth=- Release=1.00 Lifetime=0.50 Pattern=- Scale=0.15 slope=- B/beat beats=0 degraded=series_evicted\n"), "{text}");
    assert!(text.contains("\n  resident/early LSI="), "{text}");
    assert!(!text.contains("NOTE:"));
}

#[test]
fn closed_window_lists_the_largest_and_the_considerable_residents() {
    let mut r = report(sample(), false);
    r.top_n = 1;
    let template = r.resident[0].clone();
    let sized = |id: u32, bytes: u64| {
        let mut s = template.clone();
        s.stack_id = Some(id);
        s.unfreed = cb(2, bytes);
        s
    };
    // Unfreed 40,000 bytes: 200 bytes is 1/200 of it, 199 is less.
    r.resident = vec![
        sized(10, 5_000),
        sized(11, 300),
        sized(12, 200),
        sized(13, 199),
        sized(14, 50),
    ];
    assert_eq!(r.resident_shown(), 3);
    let text = render_overview(&r);
    assert!(
        text.contains("--- Resident Baselines (3 of 5 sites shown;"),
        "{text}"
    );
    assert!(
        text.contains("\n#R3 [stack 12] unfreed 2 blocks / 200 bytes;"),
        "{text}"
    );
    assert!(!text.contains("#R4"), "{text}");
    assert!(text.ends_with(
        "(and 2 smaller resident sites, not listed: 4 blocks / 249 bytes in all; each holds less than 1/200 of the unfreed bytes)\n"
    ), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&super::super::sites_json::render_sites_json(&r)).unwrap();
    assert_eq!(json["resident"].as_array().unwrap().len(), 3);
    assert_eq!(json["resident_total"], 5);
    // The TOP N largest are listed whatever their share.
    r.top_n = 4;
    assert_eq!(r.resident_shown(), 4);
}

#[test]
fn interim_snapshot_is_marked_and_caps_residents() {
    let mut r = report(sample(), true);
    r.top_n = 1;
    r.resident.push(r.resident[0].clone());
    let text = render_overview(&r);
    assert!(
        text.starts_with("====== Host Leak Overview (interim snapshot): stage=2, pid=77 ======\n")
    );
    assert!(
        text.contains("(20.000 s) (interim snapshot, window open)\n"),
        "{text}"
    );
    assert!(
        text.contains("--- Resident Baselines (1 of 2 sites shown;"),
        "{text}"
    );
    assert!(!text.contains("Snapshot freeze"), "{text}");
    assert!(!text.contains("Snapshot degraded"), "{text}");
    // The freeze and degraded notes.
    r.snapshot_freeze = cb(3, 300);
    r.health.unread_shards = 2;
    let text = render_overview(&r);
    assert!(
        text.contains(
            "Snapshot freeze: 3 allocations (300 bytes) arrived while the snapshot was taken"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "Snapshot degraded: 2 ledger part(s) could not be read within the snapshot deadline"
        ),
        "{text}"
    );
    // A closed window never carries them.
    r.interim = false;
    assert!(!render_overview(&r).contains("Snapshot "));
}

#[test]
fn cache_turnover_note_when_prewindow_frees_dominate() {
    let mut r = report(sample(), false);
    r.prewindow_free_sizes.add(50_001); // more than half of 100_000 allocated bytes
    assert!(render_overview(&r).contains("NOTE: pre-window frees exceed half"));
    let mut r = report(sample(), false);
    r.prewindow_free_sizes.add(50_000);
    assert!(!render_overview(&r).contains("NOTE:"));
}

#[test]
fn incomplete_data_is_not_a_conclusion() {
    let mut r = report(sample(), false);
    r.health.truncation_bits = 0b101;
    r.health.stopped_at_ns = Some(5_000_000_000);
    let text = render_overview(&r);
    assert!(
        text.contains("Truncation: bits=5 (bit0 block table full"),
        "{text}"
    );
    assert!(
        text.contains("Verdict: INCOMPLETE, not usable as a leak conclusion: accounting stopped"),
        "{text}"
    );
}

#[test]
fn sampling_by_bytes_says_estimates_and_marks_thin_sites() {
    let mut sites = sample();
    sites[0].samples = 3;
    sites[1].samples = 40;
    let mut r = report(sites, false);
    r.health.sample_bytes = 524288;
    let text = render_overview(&r);
    assert!(
        text.contains(
            "Sampling: by bytes, one sample per 524288 bytes allocated on average -- ESTIMATES"
        ),
        "{text}"
    );
    assert!(text.contains("Pre-window frees: not told apart"), "{text}");
    assert!(
        text.contains("; estimated from 3 samples (uncertain)\n"),
        "{text}"
    );
    assert!(text.contains("; estimated from 40 samples\n"), "{text}");
    // An exact window says nothing of samples.
    assert!(!render_overview(&report(sample(), false)).contains("samples"));
}
