//! The ranks table: its rows (whichever engine made them) and how they print.

use msmemscope_core::analysis::rank_summary::{median, RankSummary};
use serde::{Deserialize, Serialize};

use super::discover::Dump;
use super::OutputFormat;

/// One dump's line. The SQL engines return the same fields (`ranks.sql`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub rank: Option<u64>,
    pub run: String,
    pub device: String,
    pub dump: String,
    pub rows: u64,
    pub peak_allocated: Option<u64>,
    pub peak_step: Option<u64>,
    pub reserved_peak: Option<u64>,
    pub leaked_bytes: u64,
    pub leaked_blocks: u64,
    pub top_owner: Option<String>,
    pub top_owner_bytes: Option<u64>,
    /// Why the line stands out: `peak`, `leaks`, both (`peak,leaks`) or nothing.
    pub stands_out: String,
}

impl Row {
    pub fn from_summary(dump: &Dump, s: RankSummary) -> Row {
        let (top_owner, top_owner_bytes) = match s.top_owner {
            Some((owner, bytes)) => (Some(owner), Some(bytes)),
            None => (None, None),
        };
        Row {
            rank: dump.rank,
            run: dump.run.clone(),
            device: dump.device.clone(),
            dump: dump.stem(),
            rows: s.rows,
            peak_allocated: s.peak_allocated,
            peak_step: s.peak_step,
            reserved_peak: s.reserved_peak,
            leaked_bytes: s.leaked_bytes,
            leaked_blocks: s.leaked_blocks,
            top_owner,
            top_owner_bytes,
            stands_out: String::new(),
        }
    }
}

pub struct Table {
    rows: Vec<Row>,
    threshold_pct: u32,
}

const CSV_HEADER: &str = "rank,run,device,dump,rows,peak_allocated,peak_step,reserved_peak,\
    leaked_bytes,leaked_blocks,top_owner,top_owner_bytes,stands_out";

impl Table {
    pub fn new(rows: Vec<Row>, threshold_pct: u32) -> Table {
        Table {
            rows,
            threshold_pct,
        }
    }

    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Table => self.text(),
            OutputFormat::Csv => self.csv(),
            OutputFormat::Json => self.json(),
        }
    }

    fn json(&self) -> String {
        let value = serde_json::json!({
            "threshold_pct": self.threshold_pct,
            "rows": self.rows,
        });
        let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
        text.push('\n');
        text
    }

    fn csv(&self) -> String {
        let mut out = String::from(CSV_HEADER);
        out.push('\n');
        for r in &self.rows {
            let fields = [
                opt(r.rank),
                csv_field(&r.run),
                csv_field(&r.device),
                csv_field(&r.dump),
                r.rows.to_string(),
                opt(r.peak_allocated),
                opt(r.peak_step),
                opt(r.reserved_peak),
                r.leaked_bytes.to_string(),
                r.leaked_blocks.to_string(),
                r.top_owner.as_deref().map(csv_field).unwrap_or_default(),
                opt(r.top_owner_bytes),
                csv_field(&r.stands_out),
            ];
            out.push_str(&fields.join(","));
            out.push('\n');
        }
        out
    }

    fn text(&self) -> String {
        let header = [
            "rank",
            "device",
            "peak allocated",
            "at step",
            "reserved peak",
            "leaked",
            "blocks",
            "top owner at peak",
            "stands out",
            "run",
        ];
        let lines: Vec<[String; 10]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.rank.map_or_else(|| "-".into(), |k| k.to_string()),
                    r.device.clone(),
                    r.peak_allocated.map_or_else(|| "-".into(), bytes),
                    r.peak_step.map_or_else(|| "-".into(), |s| s.to_string()),
                    r.reserved_peak.map_or_else(|| "-".into(), bytes),
                    bytes(r.leaked_bytes),
                    r.leaked_blocks.to_string(),
                    match (&r.top_owner, r.top_owner_bytes) {
                        (Some(o), Some(b)) => format!("{o} ({})", bytes(b)),
                        _ => "-".into(),
                    },
                    if r.stands_out.is_empty() {
                        "-".into()
                    } else {
                        r.stands_out.clone()
                    },
                    r.run.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for line in &lines {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut push_line = |cells: &[String]| {
            let text: Vec<String> = cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            out.push_str(text.join("  ").trim_end());
            out.push('\n');
        };
        push_line(&header.map(String::from));
        for line in &lines {
            push_line(line);
        }
        let mut peaks: Vec<u64> = self.rows.iter().filter_map(|r| r.peak_allocated).collect();
        let mut leaks: Vec<u64> = self.rows.iter().map(|r| r.leaked_bytes).collect();
        let show = |m: Option<f64>| m.map_or_else(|| "-".into(), |m| bytes(m.round() as u64));
        out.push_str(&format!(
            "median of {} line(s): peak allocated {}, leaked {}; a line stands out more than {}% above it\n",
            self.rows.len(),
            show(median(&mut peaks)),
            show(median(&mut leaks)),
            self.threshold_pct
        ));
        let standing: Vec<String> = self
            .rows
            .iter()
            .filter(|r| !r.stands_out.is_empty())
            .map(|r| {
                let rank = r
                    .rank
                    .map_or_else(|| r.run.clone(), |k| format!("rank {k}"));
                format!("{rank} on {} ({})", r.device, r.stands_out)
            })
            .collect();
        if standing.is_empty() {
            out.push_str("no rank stands out\n");
        } else {
            out.push_str(&format!("stands out: {}\n", standing.join("; ")));
        }
        out
    }
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// Bytes for people: B, KiB, MiB, GiB with two decimals.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}
