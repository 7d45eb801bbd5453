//! `leaks`, the default analysis (docs/analyses.md#leaks): blocks that outlive the step they were
//! allocated in, judged per allocation site by whether they keep growing.
//!
//! # Rules
//! - Steps: a `SYSTEM STEP` row starts the next step (its Name is the step number; the runtime
//!   writes one for `msmemscope.step()` and for each MSTX/NVTX range named `step start`, so the
//!   `MSTX Range_start` rows themselves are not counted again). Rows before the first STEP row
//!   are step 0. The end of the input ends the last step, but it is not a step end the program
//!   marked: see [`sites`].
//! - Blocks: `MALLOC` rows of every pool (`PTA`, `HAL`, `HOST`) add a live block keyed by
//!   (Device Id, pool, Ptr); the `FREE` row with the same key removes it.
//! - Candidates (the original msMemScope's rule): when a step ends, every block allocated in the
//!   step before it (so at least one step old), in step 2 or later, and still live is a candidate.
//! - Leaks: a candidate is a leak when its allocation site keeps growing ([`sites`]: the site's
//!   live candidate bytes reach a new high at two step ends or more). The other sites' blocks
//!   are resident (made once and kept) and listed apart. A leak found stays reported even if
//!   the program frees the block later (Python frees everything at interpreter exit).
//! - `HAL` blocks still live at the end of the input are leaks too, whatever their step.
//! - `kernel_N`: launches (`OP_LAUNCH ATEN_START` and `KERNEL_LAUNCH` rows) are numbered from 0
//!   per device in row order; a launch row without a device (Device Id `N/A`) counts for every
//!   device, as it is written to every device's dump file. N is the number of the last launch
//!   before the allocation; a block allocated before any launch is reported `in kernel_N/A`.
//! - Holders: a `SYSTEM HOLDER` row (Ptr: a live block; Name: the chain of references that
//!   keeps it) is kept with the block's site.
//! - Sizes: `Mb` = bytes / 1024 / 1024, printed with 3 decimals, rounded to the nearest (Rust's
//!   `{:.3}` on the `f64` quotient; an exact tie rounds to even). The summary converts the summed
//!   bytes once (it is not the sum of the rounded lines).
//!
//! # Report (console and `leaks/leak_report.txt`)
//! One block per device that has leaks, devices in the order `N/A`, `cpu`, `0`, `1`, …; lines in
//! allocation order (row ID), then the findings by site ([`findings`]):
//! ```text
//! ====== ERROR: Detected memory leaks on device cpu ======
//! Direct PTA leak of 0.015 Mb(s) at 0x00007f0000001000 in kernel_42 at step 2.
//! Direct HAL leak of 2.000 Mb(s) at 0x00007f0000200000 in kernel_N/A at step 0.
//! ====== SUMMARY: 2.015 Mb(s) leaked in 2 allocation(s) ======
//! ```
//! With neither leaks nor resident sites the console text is empty (as the original msMemScope's:
//! nothing is printed) and `leaks/leak_report.txt` holds `====== No memory leaks detected ======`.
//! `leaks/findings.json` holds the same findings for scripts ([`findings::FINDINGS_FILE`]).

pub mod findings;
pub mod peak;
mod report;
pub mod sites;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;

use super::fast_map::FastMap;
use super::live_blocks::{BlockChange, BlockKey, LiveBlocks};
use super::{Analysis, AnalysisOutput};
use crate::events::{DeviceId, Event, EventRow, EventType};
use report::render_lines;
pub use report::{render, CONSOLE_BLOCKS};
use sites::{SiteBook, Verdict};

/// The report file, relative to the run directory.
pub const REPORT_FILE: &str = "leaks/leak_report.txt";

/// The numeric Attr keys of a MALLOC/FREE row the analyses read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct BlockAttrs {
    pub size: Option<u64>,
    pub used: Option<u64>,
}

/// Reads `size` and `used` from a row's Attr, whether parsed (`attrs`) or still raw
/// (`attrs_json`, as the online writer hands rows over). Missing or malformed keys are `None`.
pub fn block_attrs(row: &EventRow) -> BlockAttrs {
    BlockAttrs {
        size: row.attr_u64("size"),
        used: row.attr_u64("used"),
    }
}

/// Bytes as the original msMemScope's `Mb(s)`: bytes / 1024 / 1024 with 3 decimals.
pub fn mb(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / (1024.0 * 1024.0))
}

/// A live block: 40 bytes, since a run keeps hundreds of thousands and every lookup in a map
/// that size misses the cache.
#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    step: u64,
    /// Launches before the allocation: the block's kernel is the last of them (none at 0).
    launches: u64,
    row_id: u64,
    /// Its site in the [`SiteBook`].
    site: u32,
    /// It became a candidate (counted in its site's live candidate bytes).
    candidate: bool,
    /// Its owner category's id in the [`peak::PeakWatch`].
    owner: u8,
}

impl Block {
    fn kernel(&self) -> Option<u64> {
        self.launches.checked_sub(1)
    }

    /// This block, at `key`, as a reported leak (`late`: found at the end of the input).
    fn leak(&self, key: BlockKey, late: bool) -> Leak {
        Leak {
            device: key.device,
            pool: key.pool,
            ptr: key.ptr,
            size: self.size,
            kernel: self.kernel(),
            step: self.step,
            row_id: self.row_id,
            site: self.site,
            late,
        }
    }
}

/// One reported leak (or candidate, before the sites are judged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak {
    pub device: DeviceId,
    pub pool: EventType,
    pub ptr: u64,
    pub size: u64,
    /// The number of the last launch before the allocation (`None`: no launch yet).
    pub kernel: Option<u64>,
    /// The step the block was allocated in.
    pub step: u64,
    /// The ID of its MALLOC row.
    pub row_id: u64,
    /// Its site in the analysis's [`SiteBook`] (`Leaks::sites`).
    pub site: u32,
    /// Found at the end of the input (it outlived only the last step).
    pub late: bool,
}

#[derive(Default)]
pub struct Leaks {
    step: u64,
    /// STEP rows seen.
    steps_marked: u64,
    /// Some STEP row was inferred by the tracker (its Attr `source`, e.g. `optimizer.step`).
    steps_source: Option<String>,
    /// Launches without a device (they count for every device).
    launches_anywhere: u64,
    launches: FastMap<DeviceId, u64>,
    live: LiveBlocks<Block>,
    /// Blocks allocated in the current / the previous step (step ≥ 2), with their row IDs.
    this_step: Vec<(BlockKey, u64)>,
    last_step: Vec<(BlockKey, u64)>,
    /// Every candidate so far, in the order found.
    candidates: Vec<Leak>,
    /// HAL blocks live at the end of the input (leaks whatever their site).
    hal_at_exit: Vec<Leak>,
    sites: SiteBook,
    /// The judged leaks, once `finish` has run.
    leaks: Vec<Leak>,
    /// Reads a source line for the findings (`file`, 1-based line); none: no source text.
    source: Option<findings::SourceLine>,
    /// The findings by site, once `finish` has run.
    findings: findings::Findings,
    /// At the last step end: the sites that rose, and their bytes' growth.
    growth: (u64, u64),
    /// What each device's peak is made of.
    peak: peak::PeakWatch,
}

/// Leak sites whose first and latest steps a bounded dump keeps in full.
const SITES_KEPT_IN_DETAIL: usize = 4;

impl Leaks {
    pub fn new() -> Leaks {
        Leaks::default()
    }

    /// With the findings' source lines read by `source` (the analysis itself does no I/O).
    pub fn with_source(mut self, source: findings::SourceLine) -> Leaks {
        self.source = Some(source);
        self
    }

    /// The leaks found (the judged ones once `finish` has run).
    pub fn leaks(&self) -> &[Leak] {
        &self.leaks
    }

    /// The findings by site (once `finish` has run).
    pub fn findings(&self) -> &findings::Findings {
        &self.findings
    }

    /// The sites met, with their verdicts' inputs.
    pub fn sites(&self) -> &SiteBook {
        &self.sites
    }

    /// The blocks of leaking sites that are live now, largest site first: what the Python side
    /// looks for holders of. (device, Ptr, size, site text) per block, at most `per_site`
    /// blocks (the newest) of at most `max_sites` sites.
    pub fn suspects(&self, max_sites: usize, per_site: usize) -> Vec<(DeviceId, u64, u64, String)> {
        // (row ID, device, Ptr, size) of each live block of a leaking site.
        type Blocks = Vec<(u64, DeviceId, u64, u64)>;
        let mut by_site: BTreeMap<u32, Blocks> = BTreeMap::new();
        for c in &self.candidates {
            if self.sites.verdict(c.site) != Verdict::Leak {
                continue;
            }
            let key = BlockKey {
                device: c.device,
                pool: c.pool,
                ptr: c.ptr,
            };
            if self.live.get(&key).is_some_and(|b| b.row_id == c.row_id) {
                by_site
                    .entry(c.site)
                    .or_default()
                    .push((c.row_id, c.device, c.ptr, c.size));
            }
        }
        // A block that grows is never a candidate: its site's live blocks are what leaks.
        let replaced = |id: u32| {
            self.sites.get(id).growth() == Some(sites::Growth::Replaced)
                && self.sites.verdict(id) == Verdict::Leak
        };
        for (key, b) in self.live.iter() {
            if !b.candidate && replaced(b.site) {
                by_site
                    .entry(b.site)
                    .or_default()
                    .push((b.row_id, key.device, key.ptr, b.size));
            }
        }
        let mut sites: Vec<(u32, Blocks)> = by_site.into_iter().collect();
        sites.sort_by_key(|(id, _)| {
            let s = self.sites.get(*id);
            std::cmp::Reverse(s.live_bytes.max(s.held_bytes))
        });
        let mut out = Vec::new();
        for (id, mut blocks) in sites.into_iter().take(max_sites) {
            blocks.sort_unstable_by_key(|b| b.0);
            let text = self.sites.get(id).site.clone().unwrap_or_default();
            for (_, device, ptr, size) in blocks.iter().rev().take(per_site) {
                out.push((*device, *ptr, *size, text.clone()));
            }
        }
        out
    }

    /// The current step ends (`marked`: by a STEP row, not the end of the input): the previous
    /// step's blocks still live become candidates.
    fn end_step(&mut self, marked: bool) {
        let last = std::mem::take(&mut self.last_step);
        for (key, row_id) in &last {
            let Some(block) = self.live.get_mut(key) else {
                continue;
            };
            if block.row_id != *row_id || block.candidate {
                continue;
            }
            block.candidate = true;
            let b = *block;
            self.sites.candidate(b.site, b.size, b.step, !marked);
            self.candidates.push(b.leak(*key, !marked));
        }
        if marked {
            self.growth = self.sites.step_ended(self.step);
            self.peak.step_ended(&self.sites);
        } else {
            self.peak.finish(&self.sites);
        }
        self.last_step = std::mem::take(&mut self.this_step);
        // Reuse the old vector's allocation for the new step.
        self.this_step = last;
        self.this_step.clear();
    }

    /// An OWNER row: the block at its Ptr moves to the owner it names.
    fn relabel(&mut self, row: &EventRow) {
        let Some(ptr) = row.ptr else { return };
        let owner = row.attr_str("owner").unwrap_or(row.name.trim());
        let mut labels = owner.split('@');
        let Some(pool) = labels.next().and_then(EventType::parse) else {
            return;
        };
        let to = self.peak.owner_id(labels.next());
        let key = BlockKey {
            device: row.device,
            pool,
            ptr,
        };
        if let Some(block) = self.live.get_mut(&key) {
            let (from, size) = (block.owner, block.size);
            block.owner = to;
            if pool == EventType::Pta && from != to {
                self.peak.relabel(row.device, size, from, to);
            }
        }
    }

    /// Launches so far that count for `device`.
    fn launches_of(&self, device: DeviceId) -> u64 {
        self.launches_anywhere + self.launches.get(&device).copied().unwrap_or(0)
    }
}

impl Analysis for Leaks {
    fn name(&self) -> &'static str {
        "leaks"
    }

    fn feed(&mut self, row: &EventRow) {
        match (row.event, row.event_type) {
            (Event::System, EventType::Step) => {
                self.end_step(true);
                self.steps_marked += 1;
                if self.steps_source.is_none() {
                    self.steps_source = row.attr_str("source").map(str::to_string);
                }
                self.step = row.name.trim().parse().unwrap_or(self.step + 1);
            }
            (Event::OpLaunch, EventType::AtenStart) | (Event::KernelLaunch, _) => {
                if row.device == DeviceId::None {
                    self.launches_anywhere += 1;
                } else {
                    *self.launches.entry(row.device).or_insert(0) += 1;
                }
            }
            (Event::Malloc | Event::Free, _) => {
                let (step, launches) = (self.step, self.launches_of(row.device));
                let sites = &mut self.sites;
                let peak = &mut self.peak;
                let mut made = None;
                let Some((change, gone)) = self.live.apply(row, || {
                    let block = Block {
                        size: block_attrs(row).size.unwrap_or(0),
                        step,
                        launches,
                        row_id: row.id,
                        site: sites.site_of(row, row.event_type),
                        candidate: false,
                        owner: peak.owner_id(sites::owner_category(row)),
                    };
                    made = Some(block);
                    block
                }) else {
                    return;
                };
                // The old block leaves first: a MALLOC over a live block replaces it.
                if let Some(old) = gone {
                    let key = change.key();
                    self.peak
                        .free(key.device, key.pool, old.size, old.owner, &self.sites);
                    self.sites.freed(old.site, old.size, old.candidate);
                }
                if let Some(b) = made {
                    self.sites.allocated(b.site, b.size);
                    self.peak.malloc(row, b.size, b.owner, self.step);
                }
                if let BlockChange::Malloc(key) = change {
                    if self.step >= 2 {
                        self.this_step.push((key, row.id));
                    }
                }
            }
            (Event::System, EventType::Owner) => self.relabel(row),
            (Event::System, EventType::Holder) => {
                let Some(ptr) = row.ptr else { return };
                let pools = [EventType::Pta, EventType::Host, EventType::Hal];
                if let Some((_, block)) = self.live.at_address(row.device, ptr, &pools) {
                    self.sites.holder(block.site, row.name.trim());
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self) -> AnalysisOutput {
        self.end_step(false);
        let mut hal: Vec<(BlockKey, Block)> = self
            .live
            .iter()
            .filter(|(k, b)| k.pool == EventType::Hal && !b.candidate)
            .map(|(k, b)| (k, *b))
            .collect();
        hal.sort_by_key(|(_, b)| b.row_id);
        self.hal_at_exit = hal.into_iter().map(|(key, b)| b.leak(key, false)).collect();
        let sites = &self.sites;
        // A block that grows (replaced by a larger one each step) is never a candidate: the
        // one live at the end is what it leaked.
        let mut grown: Vec<Leak> = self
            .live
            .iter()
            .filter(|(k, b)| {
                k.pool != EventType::Hal
                    && !b.candidate
                    && sites.get(b.site).growth() == Some(sites::Growth::Replaced)
                    && sites.verdict(b.site) == Verdict::Leak
            })
            .map(|(k, b)| b.leak(k, false))
            .collect();
        grown.sort_by_key(|l| l.row_id);
        self.live.clear();
        self.leaks = self
            .candidates
            .iter()
            .filter(|c| c.pool == EventType::Hal || sites.verdict(c.site) == Verdict::Leak)
            .chain(&self.hal_at_exit)
            .chain(&grown)
            .cloned()
            .collect();
        let mut found =
            findings::Findings::build(&self.sites, &self.leaks, self.steps_marked, self.source);
        found.steps_source = self.steps_source.clone();
        let mut text = render(&self.leaks);
        text.push_str(&found.render());
        let file = if text.is_empty() {
            "====== No memory leaks detected ======\n".to_string()
        } else {
            text
        };
        let mut console = render_lines(&self.leaks, CONSOLE_BLOCKS);
        console.push_str(&found.render());
        console.push_str(&self.peak.render(self.source));
        console.push_str(&found.notice());
        let json = found.to_json();
        self.findings = found;
        AnalysisOutput {
            console,
            files: vec![
                (REPORT_FILE.to_string(), file),
                (findings::FINDINGS_FILE.to_string(), json),
                (peak::PEAK_FILE.to_string(), self.peak.to_json(self.source)),
            ],
        }
    }

    fn leak_suspects(&self) -> Vec<(DeviceId, u64, u64, String)> {
        self.suspects(10, 3)
    }

    fn findings_now(&self, steps: u64) -> Option<serde_json::Value> {
        let found = findings::Findings::build(&self.sites, &[], steps, None);
        let mut bytes_per_step = 0u64;
        let mut sites = Vec::new();
        for f in found.leaks.iter().filter(|f| f.verdict == Verdict::Leak) {
            bytes_per_step += f.bytes_per_step;
            let (file, line, function) = match f.site.as_deref().and_then(findings::split_site) {
                Some((file, line, function)) => (Some(file), Some(line), Some(function)),
                None => (None, None, None),
            };
            sites.push(serde_json::json!({
                "site": f.site,
                "file": file,
                "line": line,
                "function": function,
                "device": f.device.to_string(),
                "pool": f.pool.as_str(),
                "bytes_per_step": f.bytes_per_step,
                "blocks_per_step": f.blocks_per_step,
                "first_step": (f.first_step != u64::MAX).then_some(f.first_step),
                "last_step": f.last_step,
                "bytes": f.bytes,
                "blocks": f.blocks,
            }));
        }
        Some(serde_json::json!({"leak_sites": sites, "leak_bytes_per_step": bytes_per_step}))
    }

    /// The steps where the largest leak sites' first and latest candidate blocks were
    /// allocated: where their rows show what leaks and how it started.
    fn step_notes(&self) -> Option<crate::recorder::StepNotes> {
        let mut leaking: Vec<&sites::Site> = self
            .sites
            .sites()
            .iter()
            .filter(|s| s.verdict(self.sites.last_end()) == Verdict::Leak)
            .collect();
        leaking.sort_by_key(|s| std::cmp::Reverse(s.live_bytes));
        let keep = leaking
            .iter()
            .take(SITES_KEPT_IN_DETAIL)
            .flat_map(|s| [s.steps.first(), s.steps.last()])
            .flatten()
            .copied()
            .collect();
        Some(crate::recorder::StepNotes {
            keep,
            sites_grown: self.growth.0,
            bytes_grown: self.growth.1,
        })
    }
}
