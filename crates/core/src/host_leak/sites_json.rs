//! `leak_sites_{stage}.json`: the sites the overview shows, machine-readable, with each site's
//! live-bytes beat series (which the text cannot carry). The report page reads it; the
//! overview stays the human-facing report, and both come from the same model.

use serde_json::{json, Value};

use super::{HostLeakReport, LeakSite};

fn site_json(rank: String, site: &LeakSite) -> Value {
    let a = &site.assessment;
    let f = &a.factors;
    let count_bytes = |cb: super::CountBytes| json!({"count": cb.count, "bytes": cb.bytes});
    json!({
        "rank": rank,
        "stack_id": site.stack_id,
        "class": a.class_label(),
        "lsi": a.lsi,
        // The overview's rounding, so a reader can match the two files line by line.
        "lsi_text": format!("{:.1}", a.lsi),
        "factors": {
            "growth": f.growth,
            "release": f.release,
            "lifetime": f.lifetime,
            "pattern": f.pattern,
            "scale": f.scale,
        },
        "slope": a.slope,
        "beats": a.beats,
        "degraded": a.degraded.map(|d| d.label()),
        "unfreed": count_bytes(site.unfreed),
        "allocated": count_bytes(site.allocated),
        "freed": count_bytes(site.freed),
        "frames": site.frames,
        "python_frames": site.python_frames,
        "domain": site.domain.label(),
        // With sampling by bytes the figures above are estimates resting on this many samples.
        "samples": site.samples,
        "series": site.live_series.iter().map(|&(beat, bytes)| json!([beat, bytes])).collect::<Vec<_>>(),
    })
}

/// The TOP N sites (`#1`…) and the resident sites (`#R1`…) the overview lists, in its order.
pub fn render_sites_json(report: &HostLeakReport) -> String {
    let resident_shown = report.resident_shown();
    let value = json!({
        "stage": report.stage,
        "pid": report.pid,
        "interim": report.interim,
        "window": {"start_ns": report.window.start_ns, "end_ns": report.window.end_ns},
        // The unit of the series' positions; the beat they were sampled at may differ.
        "beat_ms": report.series.beat_ms,
        "beat_adaptive": report.series.adaptive,
        "beat_first_ms": report.series.first_beat_ms,
        "beat_last_ms": report.series.last_beat_ms,
        "top_n": report.top_n,
        // 0: exact; else the mean bytes between samples, and every figure is an estimate.
        "sample_bytes": report.health.sample_bytes,
        "unfreed": {"count": report.unfreed.count, "bytes": report.unfreed.bytes},
        "sites_total": report.sites.len(),
        "sites": report.sites.iter().take(report.top_n).enumerate()
            .map(|(i, s)| site_json(format!("#{}", i + 1), s)).collect::<Vec<_>>(),
        "resident_total": report.resident.len(),
        "resident": report.resident.iter().take(resident_shown).enumerate()
            .map(|(i, s)| site_json(format!("#R{}", i + 1), s)).collect::<Vec<_>>(),
        "unusable": report.unusable_reasons(),
    });
    let mut text = value.to_string();
    text.push('\n');
    text
}
