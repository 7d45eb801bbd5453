//! The report's views besides the timeline, each from what the run directory already holds:
//! the `leaks` analysis re-run over the dump (core's implementation), OOM_DETAIL rows with the
//! OOM summary re-run over the dump (core's too), the compare CSVs, the watch checksums and the
//! host-leak sites file.

use std::path::Path;

use msmemscope_core::analysis::decompose::{Decompose, OwnerBytes};
use msmemscope_core::analysis::leaks::{self, Leak, Leaks};
use msmemscope_core::analysis::oom_summary::OomSummary;
use msmemscope_core::analysis::Analysis;
use msmemscope_core::events::row::format_ptr;
use msmemscope_core::events::{Event, EventRow};
use serde_json::{json, Value};

use super::run_file;

/// OOM_DETAIL rows kept for the page (the first ones; the rest are counted).
pub const MAX_OOM_ROWS: usize = 10_000;
/// Compare rows kept per file: the first ones as they are, then only ops whose memory differs
/// (or that one side lacks), up to the second cap; every row is counted.
pub const COMPARE_HEAD_ROWS: u64 = 2_000;
pub const MAX_COMPARE_ROWS: usize = 5_000;
/// Leak rows kept for the page: the largest per step, up to the total; every leak is counted
/// in its step's line, and the report text is kept whole up to `MAX_LEAK_TEXT_LINES`.
pub const MAX_LEAK_ROWS_PER_STEP: usize = 100;
pub const MAX_LEAK_ROWS: usize = 2_000;
pub const MAX_LEAK_TEXT_LINES: usize = 2_000;
/// Watch rows kept per file (changes first are what the view shows).
pub const MAX_WATCH_ROWS: usize = 20_000;

/// The leaks analysis over a run's rows, as the runtime runs it online.
pub struct LeakSection {
    analysis: Leaks,
}

impl LeakSection {
    pub fn new() -> LeakSection {
        LeakSection {
            analysis: Leaks::new().with_source(msmemscope_core::source_line::read),
        }
    }

    pub fn feed(&mut self, row: &EventRow) {
        self.analysis.feed(row);
    }

    /// The judged leaks (the original msMemScope's report lines) and the findings by site
    /// (`leaks/findings.json`'s document) with the report text that goes with them.
    pub fn finish(mut self) -> LeakOutcome {
        // The text `leaks/leak_report.txt` holds (the console adds only its notices).
        let files = self.analysis.finish().files;
        let file = |wanted: &str| {
            files
                .iter()
                .find(|(name, _)| name == wanted)
                .map(|(_, text)| text.clone())
        };
        let text = file(leaks::REPORT_FILE).unwrap_or_default();
        let peak = file(leaks::peak::PEAK_FILE)
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let findings =
            serde_json::from_str(&self.analysis.findings().to_json()).unwrap_or(Value::Null);
        LeakOutcome {
            leaks: self.analysis.leaks().to_vec(),
            findings,
            peak,
            text,
        }
    }
}

/// What the leaks analysis found over a run's rows.
pub struct LeakOutcome {
    pub leaks: Vec<Leak>,
    pub findings: Value,
    /// `leaks/peak.json`'s document: what each device's peak is made of.
    pub peak: Value,
    /// `leaks/leak_report.txt`'s text (the original msMemScope's report lines, then the findings by
    /// site).
    pub text: String,
}

/// Decompose table lines kept for the page (the last steps' when there are more).
pub const MAX_DECOMPOSE_LINES: usize = 5_000;

/// The decompose analysis over a run's rows: bytes by owner per step (current, peak, max).
pub struct DecomposeSection {
    analysis: Decompose,
}

impl DecomposeSection {
    pub fn new() -> DecomposeSection {
        DecomposeSection {
            analysis: Decompose::new(),
        }
    }

    pub fn feed(&mut self, row: &EventRow) {
        self.analysis.feed(row);
    }

    /// The table as `[step, device, pool, owner, current, peak, max]` lines; `null` when no
    /// block has a labelled owner (the table would only repeat the pool's total).
    pub fn finish(mut self) -> Value {
        self.analysis.finish();
        let table: &[OwnerBytes] = self.analysis.table();
        if !table.iter().any(|l| l.owner.contains('@')) {
            return Value::Null;
        }
        let skip = table.len().saturating_sub(MAX_DECOMPOSE_LINES);
        let lines: Vec<Value> = table[skip..]
            .iter()
            .map(|l| {
                json!([
                    l.step,
                    l.device.to_string(),
                    l.pool.as_str(),
                    l.owner,
                    l.current,
                    l.peak,
                    l.max
                ])
            })
            .collect();
        json!({"lines": lines, "total": table.len()})
    }
}

/// The run's leaks (the analysis fed every row once, as online), for the page.
pub fn leaks_json(outcome: LeakOutcome) -> Value {
    let LeakOutcome {
        leaks,
        findings,
        peak,
        text,
    } = outcome;
    // Per step: every leak counted, the largest kept.
    let mut steps: std::collections::BTreeMap<u64, (u64, u64, Vec<&Leak>)> = Default::default();
    for leak in &leaks {
        let step = steps.entry(leak.step).or_default();
        step.0 += 1;
        step.1 += leak.size;
        step.2.push(leak);
    }
    let mut kept: Vec<&Leak> = Vec::new();
    for (_, _, mut in_step) in steps.values().cloned() {
        in_step.sort_by(|a, b| b.size.cmp(&a.size).then(a.row_id.cmp(&b.row_id)));
        kept.extend(in_step.into_iter().take(MAX_LEAK_ROWS_PER_STEP));
    }
    kept.sort_by(|a, b| b.size.cmp(&a.size).then(a.row_id.cmp(&b.row_id)));
    kept.truncate(MAX_LEAK_ROWS);
    kept.sort_by_key(|l| l.row_id);
    let rows: Vec<Value> = kept
        .iter()
        .map(|l| {
            json!({
                "device": l.device.to_string(),
                "pool": l.pool.as_str(),
                "ptr": format_ptr(l.ptr),
                "size": l.size,
                "mb": leaks::mb(l.size),
                "kernel": l.kernel.map_or_else(|| "N/A".to_string(), |k| k.to_string()),
                "step": l.step,
                "row_id": l.row_id,
            })
        })
        .collect();
    let mut text = text;
    if text.is_empty() {
        text = "====== No memory leaks detected ======\n".to_string();
    }
    let lines = text.lines().count();
    if lines > MAX_LEAK_TEXT_LINES {
        let mut cut: String = text
            .lines()
            .take(MAX_LEAK_TEXT_LINES)
            .flat_map(|l| [l, "\n"])
            .collect();
        cut.push_str(&format!(
            "... {} more lines (leaks/leak_report.txt of the run has them all)\n",
            lines - MAX_LEAK_TEXT_LINES
        ));
        text = cut;
    }
    json!({
        "rows": rows,
        "total": leaks.len(),
        "findings": findings,
        "peak": peak,
        "steps": steps.iter().map(|(step, (count, bytes, _))| json!({"step": step, "count": count, "bytes": bytes})).collect::<Vec<_>>(),
        // Core's own report text: what `leaks/leak_report.txt` holds for the same rows.
        "text": text,
    })
}

/// OOM_DETAIL rows: triggers, then the recent and largest live blocks written with them; and
/// the OOM summary (`--analysis=oom`'s text: each failure, the op, the user's line, the largest
/// live sites) made offline from every row, as the runtime makes it online.
pub struct OomSection {
    rows: Vec<Value>,
    dropped: u64,
    /// None when the run did not ask for the OOM analysis: then it wrote no trigger, and
    /// following every block for an empty summary would cost a third of the report's time.
    summary: Option<OomSummary>,
}

impl OomSection {
    pub fn new(oom_analysis: bool) -> OomSection {
        OomSection {
            rows: Vec::new(),
            dropped: 0,
            summary: oom_analysis
                .then(|| OomSummary::new().with_source(msmemscope_core::source_line::read)),
        }
    }

    pub fn feed(&mut self, row: &EventRow) {
        if let Some(summary) = &mut self.summary {
            summary.feed(row);
        }
        if row.event != Event::OomDetail {
            return;
        }
        if self.rows.len() >= MAX_OOM_ROWS {
            self.dropped += 1;
            return;
        }
        let mut row = row.clone();
        row.parse_attrs();
        self.rows.push(json!({
            "id": row.id,
            "type": row.event_type.as_str(),
            "name": row.name,
            "ts_ns": row.ts_ns,
            "device": row.device.to_string(),
            "ptr": row.ptr.map(format_ptr),
            "attrs": Value::Object(row.attrs),
            "c_stack": row.c_stack,
            "python_stack": row.python_stack,
        }));
    }

    pub fn finish(mut self) -> Value {
        let summary = self.summary.as_mut().map(|s| s.finish().console);
        json!({"rows": self.rows, "dropped": self.dropped, "summary": summary})
    }
}

/// Splits one CSV record (RFC 4180, no embedded newlines: the compare and watch files write
/// names on one line).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (false, '"') => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}

fn files_in(dir: &Path, prefix: &str, ext: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(ext))
        })
        .collect();
    files.sort();
    files
}

/// `compare/memory_compare_*.csv`: the aligned op sequences with their byte diff.
pub fn compare_json(run: &Path) -> Result<Value, String> {
    let mut out = Vec::new();
    for path in files_in(&run.join("compare"), "memory_compare_", ".csv") {
        let text = run_file::read(&path, run_file::MAX_CSV)?;
        let mut lines = text.lines();
        let sides = lines.next().unwrap_or_default();
        let columns = lines.next().unwrap_or_default();
        if sides != msmemscope_core::analysis::compare::HEADER_SIDES
            || columns != msmemscope_core::analysis::compare::HEADER_COLUMNS
        {
            return Err(format!(
                "{}: not a compare file (its header lines are not those --compare writes)",
                path.display()
            ));
        }
        let (mut rows, mut total, mut matched, mut base_only, mut compare_only, mut changed) =
            (Vec::new(), 0u64, 0u64, 0u64, 0u64, 0u64);
        for line in lines {
            let f = csv_fields(line);
            if f.len() != 6 {
                return Err(format!(
                    "{}: a row with {} fields, expected 6: {line}",
                    path.display(),
                    f.len()
                ));
            }
            total += 1;
            match (f[3].as_str(), f[4].as_str()) {
                ("N/A", _) => compare_only += 1,
                (_, "N/A") => base_only += 1,
                _ => matched += 1,
            }
            let differs = f[5] != "0";
            if differs {
                changed += 1;
            }
            let one_sided = f[3] == "N/A" || f[4] == "N/A";
            if rows.len() < MAX_COMPARE_ROWS && (total <= COMPARE_HEAD_ROWS || differs || one_sided)
            {
                rows.push(json!([total - 1, f]));
            }
        }
        out.push(json!({
            "file": path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "rows": rows,
            "total": total,
            "matched": matched,
            "base_only": base_only,
            "compare_only": compare_only,
            "changed": changed,
        }));
    }
    Ok(Value::from(out))
}

/// `watch_dump/*.csv`: each watched block's checksums in op order; the rows where a block's
/// checksum differs from its previous one are the changes the view lists (with the watch's
/// own `watch_summary.txt`, which says which changes no op's writes explain). The checksum
/// column is found by name, so the view follows the file's own header.
pub fn watch_json(run: &Path) -> Result<Value, String> {
    let mut out = Vec::new();
    let summary = run.join("watch_dump/watch_summary.txt");
    for path in files_in(&run.join("watch_dump"), "", ".csv") {
        let text = run_file::read(&path, run_file::MAX_CSV)?;
        let mut lines = text.lines();
        let header = csv_fields(lines.next().unwrap_or_default());
        // The first word that some column contains wins: the words are in order of preference.
        let find = |words: &[&str]| {
            words.iter().find_map(|w| {
                header
                    .iter()
                    .position(|h| h.to_ascii_lowercase().contains(w))
            })
        };
        let Some(sum) = find(&["check", "sum", "crc"]) else {
            out.push(json!({"file": path.file_name().map(|n| n.to_string_lossy().into_owned()), "header": header, "error": "no checksum column"}));
            continue;
        };
        // The runtime's files name a block in `Tensor info` as
        // `{device}_{tid}_{op}_{call}-{watched name}_{outid}_{before|after}`: the block is what
        // follows the first `-` (op names have none), less the phase.
        let tensor_info = header.iter().position(|h| h == "Tensor info");
        let key = tensor_info.or_else(|| find(&["watched", "name", "addr", "ptr"]));
        let block_of = |field: &str| -> String {
            if tensor_info.is_none() {
                return field.to_owned();
            }
            let block = field.split_once('-').map_or(field, |(_, rest)| rest);
            block
                .rsplit_once('_')
                .map_or(block, |(name, _phase)| name)
                .to_owned()
        };
        let mut last: std::collections::HashMap<String, String> = Default::default();
        let (mut rows, mut total, mut changes) = (Vec::new(), 0u64, 0u64);
        for line in lines {
            let f = csv_fields(line);
            total += 1;
            let k = key
                .and_then(|k| f.get(k))
                .map(|v| block_of(v))
                .unwrap_or_default();
            let value = f.get(sum).cloned().unwrap_or_default();
            let changed = last
                .insert(k.clone(), value.clone())
                .is_some_and(|prev| prev != value);
            if changed {
                changes += 1;
            }
            if rows.len() < MAX_WATCH_ROWS {
                rows.push(json!({"fields": f, "block": k, "changed": changed}));
            }
        }
        out.push(json!({
            "file": path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "header": header,
            "summary": run_file::read(&summary, run_file::MAX_TEXT).ok(),
            "checksum_column": sum,
            "rows": rows,
            "total": total,
            "changes": changes,
        }));
    }
    Ok(Value::from(out))
}

/// `host_leak/leak_sites_*.json` (one per window), or the overview text when a run predates it.
pub fn host_leak_json(run: &Path) -> Result<Value, String> {
    let dir = run.join("host_leak");
    let mut windows = Vec::new();
    for path in files_in(&dir, "leak_sites_", ".json") {
        let text = run_file::read(&path, run_file::MAX_TEXT)?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not valid JSON: {e}", path.display()))?;
        windows.push(value);
    }
    let overviews: Vec<Value> = files_in(&dir, "leak_overview_", ".txt")
        .into_iter()
        .filter_map(|p| {
            let text = run_file::read(&p, run_file::MAX_TEXT).ok()?;
            Some(json!({"file": p.file_name()?.to_string_lossy(), "text": text}))
        })
        .collect();
    Ok(json!({"windows": windows, "overviews": overviews}))
}
