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
    if h.sample_bytes > 0 {
        // An unsampled block's free is recognised by a filter miss, never looked up: it cannot
        // be told from the free of a block made before the window.
        let _ = writeln!(
            out,
            "Pre-window frees: not told apart when sampling by bytes (not part of the leak verdict)"
        );
    } else {
        let _ = writeln!(
            out,
            "Pre-window frees: {} (allocated before the window, freed in it; not part of the leak verdict)",
            count_bytes(h.prewindow_frees)
        );
    }
    if h.sample_bytes > 0 {
        let _ = writeln!(
            out,
            "Sampling: by bytes, one sample per {} bytes allocated on average -- ESTIMATES: each \
             sampled block of s bytes counts for s/p bytes (p = 1 - e^(-s/{})); a site resting \
             on fewer than {} samples is marked uncertain",
            h.sample_bytes,
            h.sample_bytes,
            super::sampling::UNCERTAIN_BELOW_SAMPLES
        );
    } else if h.sample_rate == 1 {
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
        site_block(
            out,
            &format!("#{}", rank + 1),
            site,
            report.health.sample_bytes > 0,
        );
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
        site_block(
            out,
            &format!("#R{}", rank + 1),
            site,
            report.health.sample_bytes > 0,
        );
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

/// One site's lines; `sampled`: its figures are estimates from sampling by bytes, and the
/// first line ends with the samples they rest on.
fn site_block(out: &mut String, rank: &str, site: &LeakSite, sampled: bool) {
    let mut id = match site.stack_id {
        Some(id) => format!("stack {id}"),
        None => "unknown bucket".to_string(),
    };
    if site.domain == AllocDomain::Pymalloc {
        id.push_str(", pymalloc");
    }
    let samples = if !sampled {
        String::new()
    } else if site.samples < super::sampling::UNCERTAIN_BELOW_SAMPLES {
        format!("; estimated from {} samples (uncertain)", site.samples)
    } else {
        format!("; estimated from {} samples", site.samples)
    };
    let _ = writeln!(
        out,
        "{rank} [{id}] unfreed {} blocks / {} bytes; allocated {} / {} bytes; freed {} / {} bytes{samples}",
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
mod tests;
