//! The leaks analysis's findings by site: the console block after the original msMemScope's lines,
//! and `leaks/findings.json` for scripts.
//!
//! Sites judged the same ([`super::sites`]) that share a user line (device, pool and
//! `file:line (function)`) are one finding: a line whose tensors come from several ops is one
//! place to fix.
//!
//! # `leaks/findings.json` (schema `msmemscope.leaks.findings/1`; keys are stable)
//! ```text
//! { "schema": "msmemscope.leaks.findings/1",
//!   "steps_marked": 12,                   // STEP rows the analysis saw
//!   "steps_source": "program",            // or "optimizer.step": the program marked none
//!   "leaks": [ {                          // largest growth first
//!       "device": "cpu", "pool": "PTA",
//!       "site": "/w/train.py:42 (main)",  // null: the dump has no site for these blocks
//!       "file": "/w/train.py", "line": 42, "function": "main",
//!       "source": "all_logits.append(logits)",   // the line's text, null when unreadable
//!       "frame": ".../modeling_gpt2.py:120 (forward)",  // innermost line outside torch, or null
//!       "ops": ["aten::addmm"], "owner": "activation",  // owner: null when not known
//!       "modules": ["model.lm_head"],     // the modules it allocated in (at most 3; [] unknown)
//!       "growth": "new_blocks",           // or "replaced": one block replaced by a larger one
//!       "bytes_per_step": 256000, "blocks_per_step": 1.0,
//!       "first_step": 3, "last_step": 11,  // the step ends it grew at, first and last
//!       "steps": [2, 3, 4],               // the steps its leaked blocks were allocated in
//!       "more_steps": 0,                  // steps past the first 512 listed (a long leak)
//!       "leaked_bytes": 2304000, "leaked_blocks": 9,  // the `Direct ... leak` blocks
//!       "series": [[3, 256000], [4, 512000]],        // its live leaked bytes at each step end
//!       "holders": [ {                    // what keeps its live blocks (at exit, or on demand)
//!           "chain": "all_logits (global of train.py) -> list[8] -> Tensor 4x64x1000 float32",
//!           "blocks": 9 } ]               // blocks held the same way (indices aside)
//!   } ],
//!   "resident": [ {                       // kept but not growing; largest first
//!       "device", "pool", "site", "file", "line", "function", "source", "frame", "ops",
//!       "owner", "bytes": 4718592, "blocks": 18, "since_step": 3,
//!       "bounded": false,                 // true: it grew, then stayed flat (a window, a cache)
//!       "stopped_at_step": null,          // bounded: the step end it last grew at
//!       "growth": null } ],               // bounded: as a leak's; made once: null
//!   "unjudged_blocks": 3 }                // blocks that only outlived the last step
//! ```

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::sites::{Growth, Site, SiteBook, Verdict};
use super::Leak;
use crate::events::{DeviceId, EventType};

/// The findings file, relative to the run directory.
pub const FINDINGS_FILE: &str = "leaks/findings.json";
/// The schema name `leaks/findings.json` carries.
pub const SCHEMA: &str = "msmemscope.leaks.findings/1";
/// Marked steps needed before a leak can be judged: candidates start at the end of step 3
/// (step 2's blocks) and growth needs a second step end after that.
pub const STEPS_TO_JUDGE: u64 = 5;
/// Findings printed per kind; the JSON file has them all.
const SHOWN_LEAKS: usize = 20;
const SHOWN_RESIDENTS: usize = 10;

/// Reads line `line` (1-based) of `file`, trimmed; `None` when it cannot.
pub type SourceLine = fn(&str, u32) -> Option<String>;

/// One finding: a user line and what it leaked or keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub verdict: Verdict,
    pub device: DeviceId,
    pub pool: EventType,
    pub site: Option<String>,
    pub source: Option<String>,
    pub frame: Option<String>,
    pub ops: Vec<String>,
    pub owner: Option<String>,
    /// The modules its blocks were allocated in (at most three), and whether there were more.
    pub modules: Vec<String>,
    pub more_modules: bool,
    /// Leaks and bounded sites: how they grew.
    pub growth: Option<Growth>,
    /// Leaks: growth per step; residents: what is kept.
    pub bytes_per_step: u64,
    pub blocks_per_step: f64,
    pub first_step: u64,
    pub last_step: u64,
    /// The first [`super::sites::MAX_SERIES`] steps its blocks were allocated in.
    pub steps: Vec<u64>,
    /// Steps past those listed (a long leak).
    pub more_steps: u64,
    pub leaked_bytes: u64,
    pub leaked_blocks: u64,
    pub series: Vec<(u64, u64)>,
    /// (chain, blocks held that way).
    pub holders: Vec<(String, u64)>,
    /// Residents: bytes and blocks kept (their high).
    pub bytes: u64,
    pub blocks: u64,
}

/// `file:line (function)` split into its parts.
pub fn split_site(site: &str) -> Option<(&str, u32, &str)> {
    let (place, function) = match site.rsplit_once(" (") {
        Some((place, rest)) => (place, rest.strip_suffix(')').unwrap_or(rest)),
        None => (site, ""),
    };
    let (file, line) = place.rsplit_once(':')?;
    Some((file, line.parse().ok()?, function))
}

/// The source text of a site's line, read by `source` (none without either).
pub fn source_of(site: Option<&str>, source: Option<SourceLine>) -> Option<String> {
    let (file, line, _) = split_site(site?)?;
    source?(file, line)
}

/// Bytes for people: `512 B`, `62.5 KiB`, `4.50 MiB`, `1.25 GiB` (up to PiB).
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, f64); 5] = [
        ("PiB", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("TiB", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("GiB", 1024.0 * 1024.0 * 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("KiB", 1024.0),
    ];
    for (unit, size) in UNITS {
        let v = bytes as f64 / size;
        if v >= 1.0 {
            return if v >= 100.0 {
                format!("{v:.0} {unit}")
            } else if v >= 10.0 {
                format!("{v:.1} {unit}")
            } else {
                format!("{v:.2} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

/// The findings of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Findings {
    pub leaks: Vec<Finding>,
    pub residents: Vec<Finding>,
    pub steps_marked: u64,
    /// Where the steps came from when the program marked none (`optimizer.step`).
    pub steps_source: Option<String>,
    pub unjudged_blocks: u64,
}

type Group = (DeviceId, EventType, Option<String>);

impl Findings {
    /// The findings of `book`'s sites; `leaks` are the judged blocks (the original msMemScope's
    /// lines).
    pub fn build(
        book: &SiteBook,
        leaks: &[Leak],
        steps_marked: u64,
        source: Option<SourceLine>,
    ) -> Findings {
        let mut groups: BTreeMap<(Verdict, Group), Vec<u32>> = BTreeMap::new();
        let mut unjudged_blocks = 0;
        for (id, site) in book.sites().iter().enumerate() {
            match book.verdict(id as u32) {
                Verdict::LastStepOnly => unjudged_blocks += site.late_blocks,
                verdict => groups
                    .entry((verdict, (site.device, site.pool, site.site.clone())))
                    .or_default()
                    .push(id as u32),
            }
        }
        let mut leaked: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for l in leaks {
            let e = leaked.entry(l.site).or_default();
            e.0 += l.size;
            e.1 += 1;
        }
        let mut out = Findings {
            steps_marked,
            unjudged_blocks,
            ..Findings::default()
        };
        for ((verdict, (device, pool, site)), ids) in groups {
            let members: Vec<&Site> = ids.iter().map(|&id| book.get(id)).collect();
            let mut f = Finding {
                verdict,
                device,
                pool,
                source: source_of(site.as_deref(), source),
                site,
                frame: members.iter().find_map(|s| s.frame.clone()),
                ops: Vec::new(),
                owner: members.iter().find_map(|s| s.owner.clone()),
                modules: Vec::new(),
                more_modules: false,
                // New blocks where any member grows by them (a line is one place to fix).
                growth: members
                    .iter()
                    .filter_map(|s| s.growth())
                    .min_by_key(|g| *g as u8),
                bytes_per_step: 0,
                blocks_per_step: 0.0,
                first_step: u64::MAX,
                last_step: 0,
                steps: Vec::new(),
                more_steps: 0,
                leaked_bytes: 0,
                leaked_blocks: 0,
                series: Vec::new(),
                holders: Vec::new(),
                bytes: 0,
                blocks: 0,
            };
            let mut series: BTreeMap<u64, u64> = BTreeMap::new();
            for (s, id) in members.iter().zip(&ids) {
                if let Some(op) = &s.op {
                    if !f.ops.contains(op) {
                        f.ops.push(op.clone());
                    }
                }
                super::sites::name_module(&mut f.modules, &mut f.more_modules, s.module.as_ref());
                let rises = s.rises_of(s.growth().unwrap_or(Growth::NewBlocks));
                if let Some(first) = rises.first {
                    f.first_step = f.first_step.min(first.step);
                }
                if let Some(last) = rises.last {
                    f.last_step = f.last_step.max(last.step);
                    f.bytes += last.bytes;
                    f.blocks += last.blocks;
                }
                let (bytes, blocks) = s.per_step();
                f.bytes_per_step += bytes;
                f.blocks_per_step += blocks;
                for step in s.steps.listed() {
                    if !f.steps.contains(step) && f.steps.len() < super::sites::MAX_SERIES {
                        f.steps.push(*step);
                    }
                }
                f.more_steps += s.steps.more();
                for (step, bytes) in s.judged_series() {
                    *series.entry(*step).or_default() += bytes;
                }
                for (chain, blocks) in &s.holders {
                    let shape = super::sites::chain_shape(chain);
                    let full = f.holders.len() >= super::sites::MAX_HOLDERS;
                    match f
                        .holders
                        .iter_mut()
                        .find(|h| super::sites::chain_shape(&h.0) == shape)
                    {
                        Some(h) => h.1 += blocks,
                        None if !full => f.holders.push((chain.clone(), *blocks)),
                        None => {}
                    }
                }
                if let Some((bytes, blocks)) = leaked.get(id) {
                    f.leaked_bytes += bytes;
                    f.leaked_blocks += blocks;
                }
            }
            f.steps.sort_unstable();
            f.series = series.into_iter().collect();
            match verdict {
                Verdict::Leak => out.leaks.push(f),
                _ => out.residents.push(f),
            }
        }
        out.leaks.sort_by(|a, b| {
            b.bytes_per_step
                .cmp(&a.bytes_per_step)
                .then_with(|| a.site.cmp(&b.site))
        });
        out.residents
            .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
        out
    }

    /// The by-site block of the report (empty with no finding).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for device in self.devices() {
            let leaks: Vec<&Finding> = self.leaks.iter().filter(|f| f.device == device).collect();
            if !leaks.is_empty() {
                out.push_str(&format!(
                    "====== Leaking sites on device {device}: {} (live memory that grows step over step) ======\n",
                    leaks.len()
                ));
                for (i, f) in leaks.iter().take(SHOWN_LEAKS).enumerate() {
                    render_leak(&mut out, i + 1, f);
                }
                more(&mut out, leaks.len(), SHOWN_LEAKS);
            }
            let residents: Vec<&Finding> = self
                .residents
                .iter()
                .filter(|f| f.device == device)
                .collect();
            if !residents.is_empty() {
                out.push_str(&format!(
                    "====== Resident on device {device}: {} site(s) kept but not growing (not leaks) ======\n",
                    residents.len()
                ));
                for f in residents.iter().take(SHOWN_RESIDENTS) {
                    render_resident(&mut out, f);
                }
                more(&mut out, residents.len(), SHOWN_RESIDENTS);
            }
        }
        out
    }

    /// A line for the console when the run could not be judged (too few steps) or its steps
    /// were inferred, else empty.
    pub fn notice(&self) -> String {
        let mut out = match &self.steps_source {
            Some(source) => format!(
                "msmemscope: the program marks no steps, so each {source}() call ended one \
                 ({} steps); msmemscope.step() marks them yourself\n",
                self.steps_marked
            ),
            None => String::new(),
        };
        out.push_str(&self.judging_notice());
        out
    }

    fn judging_notice(&self) -> String {
        if self.steps_marked == 0 {
            "msmemscope: the leaks analysis saw no steps, so it judged nothing: call \
             msmemscope.step() once per training step (or open an MSTX/NVTX range named \
             'step start'); a leak is memory that grows from step to step\n"
                .to_string()
        } else if self.steps_marked < STEPS_TO_JUDGE && self.leaks.is_empty() {
            format!(
                "msmemscope: the leaks analysis saw {} step(s); a leak is judged by growth at two \
                 step ends from step 2 on, which takes {STEPS_TO_JUDGE} steps\n",
                self.steps_marked
            )
        } else {
            String::new()
        }
    }

    fn devices(&self) -> Vec<DeviceId> {
        let mut devices: Vec<DeviceId> = self
            .leaks
            .iter()
            .chain(&self.residents)
            .map(|f| f.device)
            .collect();
        devices.sort();
        devices.dedup();
        devices
    }

    /// `leaks/findings.json`'s text.
    pub fn to_json(&self) -> String {
        let doc = json!({
            "schema": SCHEMA,
            "steps_marked": self.steps_marked,
            "steps_source": self.steps_source.as_deref().unwrap_or("program"),
            "leaks": self.leaks.iter().map(leak_json).collect::<Vec<_>>(),
            "resident": self.residents.iter().map(resident_json).collect::<Vec<_>>(),
            "unjudged_blocks": self.unjudged_blocks,
        });
        let mut text = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into());
        text.push('\n');
        text
    }
}

fn more(out: &mut String, total: usize, shown: usize) {
    if total > shown {
        out.push_str(&format!(
            "  ... and {} more in leaks/findings.json\n",
            total - shown
        ));
    }
}

fn site_text(f: &Finding) -> &str {
    f.site
        .as_deref()
        .unwrap_or("(no Python line recorded for these blocks)")
}

/// `op aten::addmm, owner activation, inside lib.py:12 (forward)`.
fn details(f: &Finding) -> String {
    let mut parts = Vec::new();
    if !f.ops.is_empty() {
        parts.push(format!("op {}", f.ops.join(", ")));
    }
    if let Some(owner) = &f.owner {
        parts.push(format!("owner {owner}"));
    }
    if !f.modules.is_empty() {
        let more = if f.more_modules { " and more" } else { "" };
        parts.push(format!("module {}{more}", f.modules.join(", ")));
    }
    if let Some(frame) = &f.frame {
        parts.push(format!("inside {frame}"));
    }
    parts.join("; ")
}

fn render_leak(out: &mut String, n: usize, f: &Finding) {
    let how = if f.growth == Some(Growth::Replaced) {
        "in one block replaced by a larger one".to_string()
    } else if (f.blocks_per_step - f.blocks_per_step.round()).abs() < 1e-9 {
        format!("in {} block(s)", f.blocks_per_step.round() as u64)
    } else {
        format!("in {:.1} block(s)", f.blocks_per_step)
    };
    out.push_str(&format!(
        "[{n}] {}: +{} ({} bytes) {how} per step, growing from step {} to step {}; \
         {} leaked in {} block(s)\n",
        site_text(f),
        human(f.bytes_per_step),
        f.bytes_per_step,
        f.first_step,
        f.last_step,
        human(f.leaked_bytes),
        f.leaked_blocks
    ));
    if let Some(source) = &f.source {
        out.push_str(&format!("      {source}\n"));
    }
    let details = details(f);
    if !details.is_empty() {
        out.push_str(&format!("    {details}\n"));
    }
    for (chain, blocks) in &f.holders {
        let more = match blocks {
            0 | 1 => String::new(),
            n => format!(" (and {} more block(s) held the same way)", n - 1),
        };
        out.push_str(&format!("    held by: {chain}{more}\n"));
    }
}

fn render_resident(out: &mut String, f: &Finding) {
    let when = if f.verdict == Verdict::Bounded {
        format!(
            "grew from step {}, bounded: stopped growing at step {}",
            f.first_step, f.last_step
        )
    } else {
        format!("since step {}", f.first_step)
    };
    out.push_str(&format!(
        "  {}: {} ({} bytes) in {} block(s) {when}",
        site_text(f),
        human(f.bytes),
        f.bytes,
        f.blocks,
    ));
    let details = details(f);
    if !details.is_empty() {
        out.push_str(&format!("; {details}"));
    }
    out.push('\n');
}

fn place(f: &Finding) -> Value {
    let (file, line, function) = match f.site.as_deref().and_then(split_site) {
        Some((file, line, function)) => (json!(file), json!(line), json!(function)),
        None => (Value::Null, Value::Null, Value::Null),
    };
    json!({
        "device": f.device.to_string(),
        "pool": f.pool.as_str(),
        "site": f.site,
        "file": file,
        "line": line,
        "function": function,
        "source": f.source,
        "frame": f.frame,
        "ops": f.ops,
        "owner": f.owner,
        "modules": f.modules,
    })
}

fn leak_json(f: &Finding) -> Value {
    let mut v = place(f);
    let extra = json!({
        "growth": growth_name(f.growth),
        "bytes_per_step": f.bytes_per_step,
        "blocks_per_step": f.blocks_per_step,
        "first_step": f.first_step,
        "last_step": f.last_step,
        "steps": f.steps,
        "more_steps": f.more_steps,
        "leaked_bytes": f.leaked_bytes,
        "leaked_blocks": f.leaked_blocks,
        "series": f.series.iter().map(|(s, b)| json!([s, b])).collect::<Vec<_>>(),
        "holders": f
            .holders
            .iter()
            .map(|(chain, blocks)| json!({ "chain": chain, "blocks": blocks }))
            .collect::<Vec<_>>(),
    });
    merge(&mut v, extra);
    v
}

fn resident_json(f: &Finding) -> Value {
    let mut v = place(f);
    merge(
        &mut v,
        json!({
            "bytes": f.bytes,
            "blocks": f.blocks,
            "since_step": f.first_step,
            "bounded": f.verdict == Verdict::Bounded,
            "stopped_at_step": (f.verdict == Verdict::Bounded).then_some(f.last_step),
            "growth": growth_name(f.growth),
        }),
    );
    v
}

/// `new_blocks`, `replaced` or null (made once).
fn growth_name(growth: Option<Growth>) -> Option<&'static str> {
    growth.map(|g| match g {
        Growth::NewBlocks => "new_blocks",
        Growth::Replaced => "replaced",
    })
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}
