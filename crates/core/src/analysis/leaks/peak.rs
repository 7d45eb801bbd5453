//! What the peak is made of: for each device, the moment its tensors' live bytes (the `PTA`
//! pool) were highest, when it was (step, op, phase), the split by owner, and the user's lines
//! whose blocks were live then, largest first. Each step's own peak (bytes, op, phase) too.
//!
//! Fed by the leaks analysis, which keeps each site's live bytes: a snapshot reads them. A
//! snapshot is taken lazily, at the first FREE (or step end, or end of input) after a MALLOC
//! that set a new high: the blocks live then are those of the high, and a forward pass that
//! climbs through a thousand new highs between frees pays one snapshot per climb.
//!
//! # `leaks/peak.json` (schema `msmemscope.leaks.peak/1`; keys are stable)
//! ```text
//! { "schema": "msmemscope.leaks.peak/1",
//!   "devices": [ {
//!       "device": "cpu", "pool": "PTA",
//!       "peak": {                              // the run's highest live bytes
//!         "bytes": 1688256, "step": 2, "row_id": 5121,   // the MALLOC that reached it
//!         "op": "aten::_softmax",              // that block's op, or null
//!         "phase": "forward",                  // forward, backward, optimizer, or null (unknown)
//!         "owners": [ {"owner": "activation", "bytes": 900000}, ... ],  // adds up to bytes
//!         "lines": [ {                         // live blocks by the user's line, largest first
//!             "site": "/w/train.py:42 (forward)", "file", "line", "function", "source",
//!             "frame", "ops": ["aten::_softmax"], "owner": "activation",
//!             "modules": ["model.0.attn", "model.1.attn"],  // where in the model (the
//!             "more_modules": false,           // blocks' `module` Attr; at most 3 named)
//!             "bytes": 524288, "blocks": 2 } ],
//!         "other_lines": {"bytes": 1024, "blocks": 3} },  // the lines past those listed
//!       "steps": [ {"step": 2, "bytes": 1688256, "op": "aten::_softmax", "phase": "forward"} ],
//!       "steps_left_out": 0 } ] }              // the oldest steps' peaks past the list's bound
//! ```

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Value};

use super::findings::{human, source_of, split_site, SourceLine};
use super::sites::{self, SiteBook};
use crate::events::{DeviceId, EventRow, EventType};

/// The file, relative to the run directory.
pub const PEAK_FILE: &str = "leaks/peak.json";
/// The schema name the file carries.
pub const SCHEMA: &str = "msmemscope.leaks.peak/1";
/// Lines kept of the run's peak; the console shows fewer.
const PEAK_LINES: usize = 20;
/// Lines printed per device.
const CONSOLE_LINES: usize = 3;
/// Ops named per line on the console.
const CONSOLE_OPS: usize = 3;
/// Step peaks kept per device (the newest): a run of 10,000 steps keeps this many.
const STEPS_KEPT: usize = 512;
/// Owner categories told apart; more share the last slot.
const MAX_OWNERS: usize = 32;
/// The owner of blocks whose row names no category (the decompose labels are off).
pub const UNLABELLED: &str = "unlabelled";

/// One user line's live blocks at a peak.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Line {
    pub site: Option<String>,
    pub frame: Option<String>,
    pub ops: Vec<String>,
    pub owner: Option<String>,
    /// The modules its blocks were allocated in (at most [`sites::MAX_MODULES`]), and whether
    /// there were more.
    pub modules: Vec<String>,
    pub more_modules: bool,
    pub bytes: u64,
    pub blocks: u64,
}

/// A high of a device's live tensor bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Peak {
    pub bytes: u64,
    pub step: u64,
    pub row_id: u64,
    pub op: Option<String>,
    pub phase: Option<&'static str>,
    /// Bytes by owner category, largest first (run peak only).
    pub owners: Vec<(String, u64)>,
    /// By line, largest first (run peak only).
    pub lines: Vec<Line>,
    /// (bytes, blocks) of the lines past `lines`.
    pub other: (u64, u64),
}

#[derive(Default)]
struct DevicePeak {
    live: u64,
    /// Live bytes per owner id.
    owners: Vec<u64>,
    run: Peak,
    /// A new run high waits for its snapshot.
    pending: bool,
    this_step: Peak,
    steps: VecDeque<Peak>,
    steps_left_out: u64,
}

/// Each device's peaks.
#[derive(Default)]
pub struct PeakWatch {
    devices: BTreeMap<DeviceId, DevicePeak>,
    /// Owner category names by id.
    owner_names: Vec<String>,
}

/// Where a block made at a peak was made, from its owner category.
fn phase_of(owner: Option<&str>) -> Option<&'static str> {
    match owner? {
        "activation" => Some("forward"),
        "temporary" | "gradient" => Some("backward"),
        "optimizer_state" => Some("optimizer"),
        _ => None,
    }
}

impl PeakWatch {
    /// The id of an owner category (`None`: unlabelled).
    pub fn owner_id(&mut self, category: Option<&str>) -> u8 {
        let name = category.unwrap_or(UNLABELLED);
        if let Some(i) = self.owner_names.iter().position(|n| n == name) {
            return i as u8;
        }
        if self.owner_names.len() >= MAX_OWNERS {
            return (MAX_OWNERS - 1) as u8;
        }
        self.owner_names.push(name.to_string());
        (self.owner_names.len() - 1) as u8
    }

    /// A tensor block was allocated (other pools are not watched).
    pub fn malloc(&mut self, row: &EventRow, size: u64, owner: u8, step: u64) {
        if row.event_type != EventType::Pta {
            return;
        }
        let d = self.devices.entry(row.device).or_default();
        d.live += size;
        add(&mut d.owners, owner, size as i64);
        if d.live > d.this_step.bytes {
            let category = self.owner_names.get(owner as usize).map(String::as_str);
            d.this_step = Peak {
                bytes: d.live,
                step,
                row_id: row.id,
                op: row.attr_str("op").map(str::to_string),
                phase: phase_of(category),
                ..Peak::default()
            };
            if d.live > d.run.bytes {
                d.run = d.this_step.clone();
                d.pending = true;
            }
        }
    }

    /// A tensor block leaves (before its site's bytes are taken off `book`).
    pub fn free(
        &mut self,
        device: DeviceId,
        pool: EventType,
        size: u64,
        owner: u8,
        book: &SiteBook,
    ) {
        if pool != EventType::Pta {
            return;
        }
        self.snapshot(device, book);
        if let Some(d) = self.devices.get_mut(&device) {
            d.live = d.live.saturating_sub(size);
            add(&mut d.owners, owner, -(size as i64));
        }
    }

    /// A block moves to another owner (an OWNER row).
    pub fn relabel(&mut self, device: DeviceId, size: u64, from: u8, to: u8) {
        if let Some(d) = self.devices.get_mut(&device) {
            add(&mut d.owners, from, -(size as i64));
            add(&mut d.owners, to, size as i64);
        }
    }

    /// A step ended: its peak is kept, the next starts from what is live.
    pub fn step_ended(&mut self, book: &SiteBook) {
        let devices: Vec<DeviceId> = self.devices.keys().copied().collect();
        for device in devices {
            self.snapshot(device, book);
            let Some(d) = self.devices.get_mut(&device) else {
                continue;
            };
            let ended = std::mem::take(&mut d.this_step);
            if ended.bytes > 0 {
                if d.steps.len() >= STEPS_KEPT {
                    d.steps.pop_front();
                    d.steps_left_out += 1;
                }
                d.steps.push_back(ended);
            }
            d.this_step.bytes = d.live;
        }
    }

    /// The input ended.
    pub fn finish(&mut self, book: &SiteBook) {
        self.step_ended(book);
    }

    /// The blocks live at a new run high, by line and owner, if one waits.
    fn snapshot(&mut self, device: DeviceId, book: &SiteBook) {
        let Some(d) = self.devices.get_mut(&device).filter(|d| d.pending) else {
            return;
        };
        d.pending = false;
        let mut by_line: BTreeMap<Option<&str>, Line> = BTreeMap::new();
        for s in book.sites() {
            if s.device != device || s.pool != EventType::Pta || s.held_bytes == 0 {
                continue;
            }
            let line = by_line.entry(s.site.as_deref()).or_default();
            line.bytes += s.held_bytes;
            line.blocks += s.held_blocks;
            if let Some(op) = &s.op {
                if !line.ops.contains(op) {
                    line.ops.push(op.clone());
                }
            }
            if line.frame.is_none() {
                line.frame.clone_from(&s.frame);
            }
            if line.owner.is_none() {
                line.owner.clone_from(&s.owner);
            }
            sites::name_module(&mut line.modules, &mut line.more_modules, s.module.as_ref());
        }
        let mut lines: Vec<Line> = by_line
            .into_iter()
            .map(|(site, mut line)| {
                line.site = site.map(str::to_string);
                line
            })
            .collect();
        lines.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
        let rest = lines.split_off(lines.len().min(PEAK_LINES));
        d.run.other = rest
            .iter()
            .fold((0, 0), |(b, n), l| (b + l.bytes, n + l.blocks));
        d.run.lines = lines;
        let mut owners: Vec<(String, u64)> = d
            .owners
            .iter()
            .enumerate()
            .filter(|(_, &b)| b > 0)
            .map(|(i, &b)| (self.owner_names[i].clone(), b))
            .collect();
        owners.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        d.run.owners = owners;
    }

    /// The run's peak of each device.
    pub fn peaks(&self) -> impl Iterator<Item = (DeviceId, &Peak)> {
        self.devices
            .iter()
            .filter(|(_, d)| d.run.bytes > 0)
            .map(|(device, d)| (*device, &d.run))
    }

    /// The console block: per device, the peak and its largest lines, the first followed by its
    /// source text when `source` can read it (as the leak findings quote theirs).
    pub fn render(&self, source: Option<SourceLine>) -> String {
        let mut out = String::new();
        for (device, peak) in self.peaks() {
            let mut when = format!("at step {}", peak.step);
            if let Some(op) = &peak.op {
                when.push_str(&format!(", in {op}"));
            }
            if let Some(phase) = peak.phase {
                when.push_str(&format!(" ({phase})"));
            }
            out.push_str(&format!(
                "====== Peak on device {device}: {} of tensors live {when} ======\n",
                human(peak.bytes)
            ));
            if peak.owners.len() > 1 || peak.owners.iter().any(|(o, _)| o != UNLABELLED) {
                let owners: Vec<String> = peak
                    .owners
                    .iter()
                    .map(|(o, b)| format!("{o} {}", human(*b)))
                    .collect();
                out.push_str(&format!("  by owner: {}\n", owners.join(", ")));
            }
            for (i, line) in peak.lines.iter().take(CONSOLE_LINES).enumerate() {
                let site = line
                    .site
                    .as_deref()
                    .unwrap_or("(no Python line recorded for these blocks)");
                let mut text = format!(
                    "  [{}] {site}: {} in {} block(s)",
                    i + 1,
                    human(line.bytes),
                    line.blocks
                );
                if !line.ops.is_empty() {
                    let shown = line.ops.len().min(CONSOLE_OPS);
                    text.push_str(&format!("; op {}", line.ops[..shown].join(", ")));
                    if line.ops.len() > shown {
                        text.push_str(&format!(" and {} more", line.ops.len() - shown));
                    }
                }
                if !line.modules.is_empty() {
                    let more = if line.more_modules { " and more" } else { "" };
                    text.push_str(&format!("; in {}{more}", line.modules.join(", ")));
                } else if let Some(frame) = &line.frame {
                    text.push_str(&format!("; inside {frame}"));
                }
                out.push_str(&text);
                out.push('\n');
                // The largest line's code: what fills the peak most, without opening the file.
                if i == 0 {
                    if let Some(code) = source_of(line.site.as_deref(), source) {
                        out.push_str(&format!("      {code}\n"));
                    }
                }
            }
            let more = peak.lines.len().saturating_sub(CONSOLE_LINES);
            if more > 0 || peak.other.0 > 0 {
                out.push_str(&format!("  ... the other lines' blocks in {PEAK_FILE}\n"));
            }
        }
        out
    }

    /// `leaks/peak.json`'s text.
    pub fn to_json(&self, source: Option<SourceLine>) -> String {
        let devices: Vec<Value> = self
            .devices
            .iter()
            .filter(|(_, d)| d.run.bytes > 0)
            .map(|(device, d)| {
                json!({
                    "device": device.to_string(),
                    "pool": "PTA",
                    "peak": peak_json(&d.run, source),
                    "steps": d.steps.iter().map(|p| json!({
                        "step": p.step, "bytes": p.bytes, "op": p.op, "phase": p.phase,
                    })).collect::<Vec<_>>(),
                    "steps_left_out": d.steps_left_out,
                })
            })
            .collect();
        let mut text =
            serde_json::to_string_pretty(&json!({ "schema": SCHEMA, "devices": devices }))
                .unwrap_or_else(|_| "{}".into());
        text.push('\n');
        text
    }
}

/// What each device's peak is made of in the dump at `path` (any format the readers take):
/// `leaks/peak.json`'s document, the leaks analysis run over its rows as it runs online.
pub fn check_peak(path: &std::path::Path) -> Result<String, crate::events::reader::ReadError> {
    use crate::analysis::Analysis;
    let mut analysis = super::Leaks::new().with_source(crate::source_line::read);
    let mut rows = crate::events::reader::open_rows(path)?;
    while let Some(row) = rows.next_row()? {
        analysis.feed(row);
    }
    let out = analysis.finish();
    Ok(out
        .files
        .into_iter()
        .find(|(name, _)| name == PEAK_FILE)
        .map(|(_, text)| text)
        .unwrap_or_default())
}

fn add(owners: &mut Vec<u64>, owner: u8, by: i64) {
    let i = owner as usize;
    if owners.len() <= i {
        owners.resize(i + 1, 0);
    }
    owners[i] = owners[i].saturating_add_signed(by);
}

fn peak_json(p: &Peak, source: Option<SourceLine>) -> Value {
    json!({
        "bytes": p.bytes,
        "step": p.step,
        "row_id": p.row_id,
        "op": p.op,
        "phase": p.phase,
        "owners": p.owners.iter().map(|(o, b)| json!({"owner": o, "bytes": b})).collect::<Vec<_>>(),
        "lines": p.lines.iter().map(|l| {
            let (file, line, function) = match l.site.as_deref().and_then(split_site) {
                Some((f, n, func)) => (json!(f), json!(n), json!(func)),
                None => (Value::Null, Value::Null, Value::Null),
            };
            json!({
                "site": l.site, "file": file, "line": line, "function": function,
                "source": source_of(l.site.as_deref(), source),
                "frame": l.frame, "ops": l.ops, "owner": l.owner,
                "modules": l.modules, "more_modules": l.more_modules,
                "bytes": l.bytes, "blocks": l.blocks,
            })
        }).collect::<Vec<_>>(),
        "other_lines": {"bytes": p.other.0, "blocks": p.other.1},
    })
}
