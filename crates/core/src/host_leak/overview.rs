//! `leak_overview_{stage}.txt`: the human-readable report of one window.

use std::fmt::Write;

use super::model::{
    truncation, AllocDomain, AllocatorPath, CountBytes, HostLeakReport, LeakSite, PythonObjects,
};
use super::{SizeHistogram, SIZE_BUCKETS};
use crate::config::HostLeakMode;
use crate::time_fmt::{human_bytes, utc_timestamp};

/// Renders the whole overview. Pure: the same report always gives the same text.
pub fn render_overview(report: &HostLeakReport) -> String {
    let mut out = String::new();
    let interim = if report.interim {
        " (interim snapshot)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "====== Host Leak Overview{interim}: stage={}, pid={} ======",
        report.stage, report.pid
    );
    let w = report.window;
    let seconds = w.end_ns.saturating_sub(w.start_ns) as f64 / 1e9;
    let open = if w.still_open {
        " (interim snapshot, window open)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "Window: {} -> {} ({seconds:.3} s){open}",
        utc_timestamp(w.start_ns),
        utc_timestamp(w.end_ns)
    );
    out.push('\n');
    data_health(&mut out, report);
    out.push('\n');

    let _ = writeln!(out, "--- Total Unfreed ---");
    let _ = writeln!(
        out,
        "{} blocks, {} bytes ({})",
        report.unfreed.count,
        report.unfreed.bytes,
        human_bytes(report.unfreed.bytes)
    );
    if report.overflow_unfreed.count > 0 {
        let _ = writeln!(
            out,
            "of which in the overflow channel (no stack): {} blocks, {} bytes",
            report.overflow_unfreed.count, report.overflow_unfreed.bytes
        );
    }
    out.push('\n');

    let _ = writeln!(out, "--- Unfreed Block Size Distribution ---");
    histogram(&mut out, &report.unfreed_sizes);
    out.push('\n');
    let _ = writeln!(out, "--- Pre-Window Free Size Distribution ---");
    histogram(&mut out, &report.prewindow_free_sizes);
    if report.prewindow_free_sizes.total_bytes() * 2 > report.health.allocations.bytes
        && report.prewindow_free_sizes.total_count() > 0
    {
        let _ = writeln!(
            out,
            "NOTE: pre-window frees exceed half of the window's allocated bytes: a cache built \
             before the window is turning over; blocks it replaces may look unfreed here."
        );
    }
    out.push('\n');

    top_sites(&mut out, report);
    out.push('\n');
    resident(&mut out, report);
    out
}

fn data_health(out: &mut String, report: &HostLeakReport) {
    let h = &report.health;
    let _ = writeln!(out, "--- Data Health Analysis ---");
    let mode = match h.mode {
        HostLeakMode::Summary => "summary",
        HostLeakMode::Event if report.interim => {
            "event (no block_detail CSV for an interim snapshot)"
        }
        HostLeakMode::Event => "event (block_detail CSV written)",
    };
    let _ = writeln!(out, "Report mode: {mode}");
    let allocator = match &h.allocator {
        AllocatorPath::Glibc => "glibc's, through the hooks".to_string(),
        AllocatorPath::Forwarded { file, .. } => format!("{file}, through the hooks"),
        AllocatorPath::Bypassed(who) => {
            format!("{who}, NOT through the hooks (found before the runtime)")
        }
    };
    let _ = writeln!(out, "Allocator: {allocator}");
    if let AllocatorPath::Forwarded {
        own_operator_new: true,
        ..
    } = h.allocator
    {
        let _ = writeln!(
            out,
            "C++ operator new/delete: the allocator's own, not seen by the hooks"
        );
    }
    let _ = writeln!(out, "Allocations tracked: {}", count_bytes(h.allocations));
    let _ = writeln!(out, "Frees tracked: {}", count_bytes(h.frees));
    let _ = writeln!(
        out,
        "Distinct stacks (key = first {} frames): {}",
        super::model::STACK_KEY_FRAMES,
        h.distinct_stacks
    );
    let _ = writeln!(
        out,
        "Unattributed allocations (unknown bucket): {}",
        h.unknown_bucket_allocations
    );
    let _ = writeln!(
        out,
        "Dead-stack recycling: {} stacks recycled, their history folded into the unknown bucket",
        h.recycled_stacks
    );
    let _ = writeln!(
        out,
        "Truncation: {}",
        truncation_text(h.truncation_bits, h.stopped_at_ns)
    );
    let _ = writeln!(
        out,
        "Overflow channel: {} allocations, {} frees (no stacks)",
        count_bytes(h.overflow_allocations),
        count_bytes(h.overflow_frees)
    );
    let _ = writeln!(
        out,
        "Pre-window frees: {} (allocated before the window, freed in it; not part of the leak verdict)",
        count_bytes(h.prewindow_frees)
    );
    if h.sample_rate == 1 {
        let _ = writeln!(out, "Sample rate: 1 (every allocation tracked)");
    } else {
        let requested = if h.sample_rate_requested != h.sample_rate {
            format!(", requested {}", h.sample_rate_requested)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "Sample rate: {}{requested} -- SAMPLED VIEW: about 1/{} of allocations tracked; untracked: {}, {} frees",
            h.sample_rate,
            h.sample_rate,
            count_bytes(h.untracked_sampled),
            h.frees_untracked
        );
    }
    if h.block_size_threshold == 0 {
        let _ = writeln!(out, "Block size threshold: 0 (all sizes tracked)");
    } else {
        let _ = writeln!(
            out,
            "Block size threshold: {} bytes -- untracked below threshold: {}",
            h.block_size_threshold,
            count_bytes(h.untracked_below_threshold)
        );
    }
    let coverage = if h.total_frames == 0 {
        "no frames to symbolize".to_string()
    } else {
        format!(
            "{:.1}% ({}/{} reported frames resolved to a function)",
            100.0 * h.symbolized_frames as f64 / h.total_frames as f64,
            h.symbolized_frames,
            h.total_frames
        )
    };
    let _ = writeln!(out, "Symbolization coverage: {coverage}");
    let python = match h.python_version {
        Some((major, minor)) if h.python_depth > 0 => format!(
            "CPython {major}.{minor}, up to {} per stack (--call-stack=python:N)",
            h.python_depth
        ),
        Some((major, minor)) => format!("off (CPython {major}.{minor}; --call-stack=python:0)"),
        None => "none (no CPython whose frames can be read in this process)".to_string(),
    };
    let _ = writeln!(out, "Python frames: {python}");
    let objects = match &h.python_objects {
        PythonObjects::NoInterpreter => None,
        PythonObjects::Off => Some(
            "off (--python-objects=off, or no Python frames with --call-stack=python:0): only \
             the C heap"
                .to_string(),
        ),
        PythonObjects::NotInstalled => Some(
            "NOT tracked: the interpreter did not load msmemscope's start-up module (python -S \
             or -I, or PYTHONPATH replaced), so its own allocators were not wrapped; Python \
             objects are invisible, only the C heap is accounted"
                .to_string(),
        ),
        PythonObjects::Tracked { allocations } => Some(format!(
            "tracked (pymalloc, the interpreter's own allocators): {}; their sites are marked \
             [.., pymalloc] and carry Python frames only",
            count_bytes(*allocations)
        )),
    };
    if let Some(objects) = objects {
        let _ = writeln!(out, "Python objects: {objects}");
    }
    let _ = writeln!(
        out,
        "Deep stacks: {} of {} stacks cut at the key's depth (callers further out share their site)",
        h.cut_stacks, h.distinct_stacks
    );
    let _ = writeln!(
        out,
        "Ledger caps: block table {}, overflow ledger {}, stack table {}",
        h.block_cap, h.overflow_cap, h.stack_cap
    );
    if report.interim && report.snapshot_freeze.count > 0 {
        let _ = writeln!(
            out,
            "Snapshot freeze: {} allocations ({} bytes) arrived while the snapshot was taken \
             (counted in the window, possibly missing from this snapshot)",
            report.snapshot_freeze.count, report.snapshot_freeze.bytes
        );
    }
    if report.interim && h.unread_shards > 0 {
        let _ = writeln!(
            out,
            "Snapshot degraded: {} ledger part(s) could not be read within the snapshot deadline; \
             their blocks are missing from this snapshot",
            h.unread_shards
        );
    }
    let reasons = report.unusable_reasons();
    if reasons.is_empty() {
        let _ = writeln!(out, "Verdict: complete window data");
    } else {
        let _ = writeln!(
            out,
            "Verdict: INCOMPLETE, not usable as a leak conclusion: {}",
            reasons.join("; ")
        );
    }
}

fn truncation_text(bits: u32, stopped_at: Option<u64>) -> String {
    if bits == 0 {
        return "bits=0 (none)".to_string();
    }
    let mut parts = Vec::new();
    if bits & truncation::BLOCK_TABLE_FULL != 0 {
        parts.push("bit0 block table full, later blocks in the overflow channel".to_string());
    }
    if bits & truncation::STACK_TABLE_FULL != 0 {
        parts.push(
            "bit1 stack table full with no dead stack to recycle, new stacks in the unknown bucket"
                .to_string(),
        );
    }
    if bits & truncation::RUNTIME_OUT_OF_MEMORY != 0 {
        let at = stopped_at.map(utc_timestamp).unwrap_or_else(|| "?".into());
        parts.push(format!(
            "bit3 the runtime's own memory ran out (the program's allocations went on), \
             accounting stopped at {at}"
        ));
    } else if bits & truncation::ACCOUNTING_STOPPED != 0 {
        let at = stopped_at.map(utc_timestamp).unwrap_or_else(|| "?".into());
        parts.push(format!(
            "bit2 overflow ledger full, accounting stopped at {at}"
        ));
    }
    format!("bits={bits} ({})", parts.join("; "))
}

fn count_bytes(cb: CountBytes) -> String {
    format!("{} ({} bytes)", cb.count, cb.bytes)
}

fn histogram(out: &mut String, h: &SizeHistogram) {
    let total = h.total_bytes();
    let _ = writeln!(
        out,
        "{:<12} {:>12} {:>16} {:>7}",
        "Size", "Blocks", "Bytes", "Share"
    );
    for (i, bucket) in SIZE_BUCKETS.iter().enumerate() {
        let share = if total == 0 {
            0.0
        } else {
            100.0 * h.bytes[i] as f64 / total as f64
        };
        let _ = writeln!(
            out,
            "{:<12} {:>12} {:>16} {:>6.1}%",
            bucket.label, h.count[i], h.bytes[i], share
        );
    }
}

fn top_sites(out: &mut String, report: &HostLeakReport) {
    let shown = report.sites.len().min(report.top_n);
    let _ = writeln!(
        out,
        "--- TOP {} Leak Sites (by LSI; {} of {} sites with unfreed blocks shown) ---",
        report.top_n,
        shown,
        report.sites.len()
    );
    let m = &report.series;
    // An adaptive beat is not the unit of the window and the slopes, so both are named.
    let beats = if m.adaptive {
        format!(
            "beats={} (start {} ms, now {} ms each), window={:.1} beats of {} ms",
            m.beats_taken,
            ms(m.first_beat_ms),
            ms(m.last_beat_ms),
            m.window_beats,
            m.beat_ms
        )
    } else {
        format!(
            "beats={} ({} ms each), window={:.1} beats",
            m.beats_taken, m.beat_ms, m.window_beats
        )
    };
    let _ = writeln!(
        out,
        "Series: top-k={}, max-stacks={}, {beats}, series={}, evicted={}",
        m.top_k, m.max_series, m.series, m.evicted
    );
    for (rank, site) in report.sites.iter().take(shown).enumerate() {
        site_block(out, &format!("#{}", rank + 1), site);
    }
}

/// `62.5`, `1000`: whole milliseconds without a fraction.
fn ms(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn resident(out: &mut String, report: &HostLeakReport) {
    let shown = report.resident_shown();
    let _ = writeln!(
        out,
        "--- Resident Baselines ({} of {} sites shown; caches, pools and rings: not in the TOP N) ---",
        shown,
        report.resident.len()
    );
    for (rank, site) in report.resident.iter().take(shown).enumerate() {
        site_block(out, &format!("#R{}", rank + 1), site);
    }
    let rest = &report.resident[shown..];
    if rest.is_empty() {
        return;
    }
    let mut held = CountBytes::default();
    for site in rest {
        held.merge(site.unfreed);
    }
    let why = if report.interim {
        "an interim snapshot lists the TOP N".to_string()
    } else {
        format!(
            "each holds less than 1/{} of the unfreed bytes",
            super::RESIDENT_LISTED_SHARE
        )
    };
    let _ = writeln!(
        out,
        "(and {} smaller resident sites, not listed: {} blocks / {} bytes in all; {why})",
        rest.len(),
        held.count,
        held.bytes
    );
}

fn factor(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

fn site_block(out: &mut String, rank: &str, site: &LeakSite) {
    let mut id = match site.stack_id {
        Some(id) => format!("stack {id}"),
        None => "unknown bucket".to_string(),
    };
    if site.domain == AllocDomain::Pymalloc {
        id.push_str(", pymalloc");
    }
    let _ = writeln!(
        out,
        "{rank} [{id}] unfreed {} blocks / {} bytes; allocated {} / {} bytes; freed {} / {} bytes",
        site.unfreed.count,
        site.unfreed.bytes,
        site.allocated.count,
        site.allocated.bytes,
        site.freed.count,
        site.freed.bytes
    );
    let a = &site.assessment;
    let f = &a.factors;
    let slope = a
        .slope
        .map_or_else(|| "-".to_string(), |s| format!("{s:+.1}"));
    let degraded = a
        .degraded
        .map(|d| format!(" degraded={}", d.label()))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  {} LSI={:.1} Growth={} Release={} Lifetime={} Pattern={} Scale={} slope={slope} B/beat beats={}{degraded}",
        a.class_label(),
        a.lsi,
        factor(f.growth),
        factor(Some(f.release)),
        factor(Some(f.lifetime)),
        factor(f.pattern),
        factor(Some(f.scale)),
        a.beats,
    );
    if site.frames.is_empty() && site.python_frames.is_empty() {
        let text = match site.stack_id {
            Some(id) => format!("(unresolved stack {id})"),
            None => "(unresolved stack: unknown bucket)".to_string(),
        };
        let _ = writeln!(out, "    {text}");
    }
    for frame in &site.frames {
        let _ = writeln!(out, "    {frame}");
    }
    // One hybrid stack, innermost first: the C frames above the interpreter (the extension's,
    // the libraries'), then the Python frames that called them.
    for frame in &site.python_frames {
        let _ = writeln!(out, "    py {frame}");
    }
    if site.cut {
        let _ = writeln!(
            out,
            "    (stack cut at the key's depth: callers further out share this site)"
        );
    }
}

#[cfg(test)]
mod tests {
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
        assert!(render_overview(&r).contains(
            "beats=384 (start 62.5 ms, now 1000 ms each), window=128.0 beats of 1000 ms,"
        ));
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
        assert!(text
            .starts_with("====== Host Leak Overview (interim snapshot): stage=2, pid=77 ======\n"));
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
        assert!(text.contains("Snapshot degraded: 2 ledger part(s) could not be read within the snapshot deadline"), "{text}");
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
            text.contains(
                "Verdict: INCOMPLETE, not usable as a leak conclusion: accounting stopped"
            ),
            "{text}"
        );
    }
}
