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
pub mod sites;

use std::collections::BTreeMap;

use super::fast_map::FastMap;
use super::live_blocks::{BlockChange, BlockKey, LiveBlocks};
use super::{Analysis, AnalysisOutput};
use crate::events::row::format_ptr;
use crate::events::{DeviceId, Event, EventRow, EventType};
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

/// The original msMemScope's report text for `leaks` (empty when there are none).
pub fn render(leaks: &[Leak]) -> String {
    render_lines(leaks, usize::MAX)
}

/// Blocks listed per device on the console, at each end of the list: a leak of a block a step
/// would otherwise print a line per step of the run (the whole list is in [`REPORT_FILE`]).
pub const CONSOLE_BLOCKS: usize = 5;

/// [`render`] with at most `shown` blocks from each end of a device's list, the rest counted
/// in one line; the summary line counts them all.
fn render_lines(leaks: &[Leak], shown: usize) -> String {
    let mut by_device: BTreeMap<DeviceId, Vec<&Leak>> = BTreeMap::new();
    for leak in leaks {
        by_device.entry(leak.device).or_default().push(leak);
    }
    let mut out = String::new();
    for (device, mut leaks) in by_device {
        leaks.sort_by_key(|l| l.row_id);
        out.push_str(&format!(
            "====== ERROR: Detected memory leaks on device {device} ======\n"
        ));
        let total: u64 = leaks.iter().map(|l| l.size).sum();
        let cut = leaks.len() > shown.saturating_mul(2).saturating_add(1);
        for (i, leak) in leaks.iter().enumerate() {
            if cut && i >= shown && i < leaks.len() - shown {
                if i == shown {
                    out.push_str(&format!(
                        "... {} more block(s) (all of them in {REPORT_FILE})\n",
                        leaks.len() - 2 * shown
                    ));
                }
                continue;
            }
            let kernel = leak
                .kernel
                .map_or_else(|| "N/A".to_string(), |k| k.to_string());
            out.push_str(&format!(
                "Direct {} leak of {} Mb(s) at {} in kernel_{kernel} at step {}.\n",
                leak.pool.as_str(),
                mb(leak.size),
                format_ptr(leak.ptr),
                leak.step
            ));
        }
        out.push_str(&format!(
            "====== SUMMARY: {} Mb(s) leaked in {} allocation(s) ======\n",
            mb(total),
            leaks.len()
        ));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The console lists a device's first and last five blocks and counts the others; the
    /// summary line counts them all; eleven blocks or fewer are all listed.
    #[test]
    fn a_long_block_list_is_cut_on_the_console() {
        let leak = |i: u64| Leak {
            device: DeviceId::Cpu,
            pool: EventType::Pta,
            ptr: 0x1000 + i,
            size: 1 << 20,
            kernel: Some(i),
            step: i,
            row_id: i,
            site: 0,
            late: false,
        };
        let leaks: Vec<Leak> = (2..14).map(leak).collect();
        let line = |i: u64| {
            format!(
                "Direct PTA leak of 1.000 Mb(s) at 0x{:016x} in kernel_{i} at step {i}.\n",
                0x1000 + i
            )
        };
        let mut want = "====== ERROR: Detected memory leaks on device cpu ======\n".to_string();
        (2..7).for_each(|i| want.push_str(&line(i)));
        want.push_str("... 2 more block(s) (all of them in leaks/leak_report.txt)\n");
        (9..14).for_each(|i| want.push_str(&line(i)));
        want.push_str("====== SUMMARY: 12.000 Mb(s) leaked in 12 allocation(s) ======\n");
        assert_eq!(render_lines(&leaks, CONSOLE_BLOCKS), want);
        let whole = render(&leaks);
        assert_eq!(whole.lines().count(), 14);
        assert_eq!(
            render_lines(&leaks[..11], CONSOLE_BLOCKS),
            render(&leaks[..11])
        );
    }

    pub fn step(n: u64) -> EventRow {
        EventRow::new(Event::System, EventType::Step, n.to_string())
    }

    pub fn launch(name: &str, device: DeviceId) -> EventRow {
        let mut r = EventRow::new(Event::OpLaunch, EventType::AtenStart, name);
        r.device = device;
        r
    }

    /// A MALLOC/FREE row with a raw Attr, as the writer hands it over.
    pub fn block(
        event: Event,
        pool: EventType,
        device: DeviceId,
        ptr: u64,
        size: u64,
        used: u64,
    ) -> EventRow {
        let mut r = EventRow::new(event, pool, "");
        r.device = device;
        r.ptr = Some(ptr);
        r.attrs_json = Some(format!(
            "{{\"allocation_id\":1,\"addr\":\"{}\",\"size\":{size},\"used\":{used},\"owner\":\"PTA\"}}",
            format_ptr(ptr)
        ));
        r
    }

    fn run(rows: Vec<EventRow>) -> (AnalysisOutput, Leaks) {
        let mut leaks = Leaks::new();
        for (i, mut row) in rows.into_iter().enumerate() {
            row.id = i as u64 + 1;
            leaks.feed(&row);
        }
        let out = leaks.finish();
        (out, leaks)
    }

    const CPU: DeviceId = DeviceId::Cpu;

    /// A PTA MALLOC on cpu allocated at `site` (a line of train.py) by `op`.
    fn malloc_at(ptr: u64, size: u64, line: u32, op: &str) -> EventRow {
        let mut r = block(Event::Malloc, EventType::Pta, CPU, ptr, size, 0);
        r.attrs_json = Some(format!(
            "{{\"allocation_id\":1,\"addr\":\"{}\",\"size\":{size},\"owner\":\"PTA@activation\",\
             \"site\":\"/w/train.py:{line} (main)\",\"frame\":\"/lib/model.py:7 (forward)\",\
             \"op\":\"{op}\"}}",
            format_ptr(ptr)
        ));
        r
    }

    fn malloc(ptr: u64, size: u64) -> EventRow {
        block(Event::Malloc, EventType::Pta, CPU, ptr, size, 0)
    }

    fn free(ptr: u64, size: u64) -> EventRow {
        block(Event::Free, EventType::Pta, CPU, ptr, size, 0)
    }

    fn file_text(out: &AnalysisOutput, name: &str) -> String {
        out.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .unwrap()
    }

    /// Steps 1..=7: line 10 keeps a 1 KiB block every step (a leak), line 20 makes 4 KiB once
    /// in step 3 and keeps it (resident), line 30 allocates and frees within two steps.
    fn training(holder: bool) -> Vec<EventRow> {
        let mut rows = Vec::new();
        for s in 1..=7u64 {
            rows.push(step(s));
            rows.push(launch("aten::addmm", DeviceId::None));
            rows.push(malloc_at(0x1000 + s * 0x100, 1024, 10, "aten::addmm"));
            if s == 3 {
                rows.push(malloc_at(0x9000, 4096, 20, "aten::zeros"));
            }
            rows.push(malloc_at(0x5000 + s * 0x100, 512, 30, "aten::mul"));
            if s > 1 {
                rows.push(free(0x5000 + (s - 1) * 0x100, 512));
            }
        }
        if holder {
            let mut h = EventRow::new(
                Event::System,
                EventType::Holder,
                "kept (global of train.py) -> list[3] -> Tensor 256 float32",
            );
            h.device = CPU;
            h.ptr = Some(0x1500);
            rows.push(h);
        }
        rows
    }

    #[test]
    fn a_site_that_grows_leaks_and_one_made_once_is_resident() {
        let (out, leaks) = run(training(true));
        // Line 10's blocks of steps 2..=5 became candidates at the ends of steps 3..=6 (four
        // rises); step 6's only at the end of the input, counted for the growing site.
        let steps: Vec<u64> = leaks.leaks().iter().map(|l| l.step).collect();
        assert_eq!(steps, vec![2, 3, 4, 5, 6]);
        let expected_leaks = "\
====== ERROR: Detected memory leaks on device cpu ======
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001200 in kernel_1 at step 2.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001300 in kernel_2 at step 3.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001400 in kernel_3 at step 4.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001500 in kernel_4 at step 5.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001600 in kernel_5 at step 6.
====== SUMMARY: 0.005 Mb(s) leaked in 5 allocation(s) ======
";
        let expected_sites = "\
====== Leaking sites on device cpu: 1 (live memory that grows step over step) ======
[1] /w/train.py:10 (main): +1.00 KiB (1024 bytes) in 1 block(s) per step, growing from step 3 to step 6; 5.00 KiB leaked in 5 block(s)
    op aten::addmm; owner activation; inside /lib/model.py:7 (forward)
    held by: kept (global of train.py) -> list[3] -> Tensor 256 float32
====== Resident on device cpu: 1 site(s) kept but not growing (not leaks) ======
  /w/train.py:20 (main): 4.00 KiB (4096 bytes) in 1 block(s) since step 4; op aten::zeros; owner activation; inside /lib/model.py:7 (forward)
====== Peak on device cpu: 12.0 KiB of tensors live at step 7, in aten::mul (forward) ======
  by owner: activation 12.0 KiB
  [1] /w/train.py:10 (main): 7.00 KiB in 7 block(s); op aten::addmm; inside /lib/model.py:7 (forward)
  [2] /w/train.py:20 (main): 4.00 KiB in 1 block(s); op aten::zeros; inside /lib/model.py:7 (forward)
  [3] /w/train.py:30 (main): 1.00 KiB in 2 block(s); op aten::mul; inside /lib/model.py:7 (forward)
";
        assert_eq!(out.console, format!("{expected_leaks}{expected_sites}"));
        // The report file is the leaks' (the peak has its own file).
        let (sites_only, _) = expected_sites.split_once("====== Peak").unwrap();
        assert_eq!(
            file_text(&out, REPORT_FILE),
            format!("{expected_leaks}{sites_only}")
        );
        let peak: serde_json::Value =
            serde_json::from_str(&file_text(&out, peak::PEAK_FILE)).unwrap();
        let device = &peak["devices"][0];
        assert_eq!(device["peak"]["bytes"], 12 * 1024);
        assert_eq!(device["peak"]["step"], 7);
        assert_eq!(device["peak"]["op"], "aten::mul");
        assert_eq!(
            device["peak"]["owners"],
            serde_json::json!([{"owner": "activation", "bytes": 12 * 1024}])
        );
        assert_eq!(device["peak"]["lines"][0]["line"], 10);
        assert_eq!(device["peak"]["lines"][0]["blocks"], 7);
        // Each step's peak: step 1 holds line 10's first block and line 30's.
        assert_eq!(
            device["steps"][0],
            serde_json::json!({"step": 1, "bytes": 1536, "op": "aten::mul", "phase": "forward"})
        );
        assert_eq!(device["steps"].as_array().unwrap().len(), 7);
        let json: serde_json::Value =
            serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
        assert_eq!(json["schema"], findings::SCHEMA);
        assert_eq!(json["steps_marked"], 7);
        let leak = &json["leaks"][0];
        assert_eq!(leak["file"], "/w/train.py");
        assert_eq!(leak["line"], 10);
        assert_eq!(leak["function"], "main");
        assert_eq!(leak["bytes_per_step"], 1024);
        assert_eq!(leak["steps"], serde_json::json!([2, 3, 4, 5, 6]));
        assert_eq!(
            leak["series"],
            serde_json::json!([[3, 1024], [4, 2048], [5, 3072], [6, 4096]])
        );
        assert_eq!(leak["leaked_bytes"], 5120);
        assert_eq!(json["resident"][0]["bytes"], 4096);
        assert_eq!(json["resident"][0]["since_step"], 4);
    }

    /// `deque(maxlen=window)` of each step's 1 KiB block, over `steps` steps.
    fn window(steps: u64, window: u64) -> Vec<EventRow> {
        let mut rows = Vec::new();
        for s in 1..=steps {
            rows.push(step(s));
            rows.push(malloc_at(0x1000 + s * 0x100, 1024, 10, "aten::relu"));
            if s > window {
                rows.push(free(0x1000 + (s - window) * 0x100, 1024));
            }
        }
        rows
    }

    /// `recent = deque(maxlen=3)` of each step's block over 12 steps: live bytes rise while the
    /// window fills, then stay flat for the rest of the run.
    #[test]
    fn a_window_that_fills_and_stays_flat_is_bounded_not_a_leak() {
        let (out, leaks) = run(window(12, 3));
        assert!(leaks.leaks().is_empty(), "{}", out.console);
        assert_eq!(
            out.console,
            "====== Resident on device cpu: 1 site(s) kept but not growing (not leaks) ======\n  \
             /w/train.py:10 (main): 2.00 KiB (2048 bytes) in 2 block(s) grew from step 3, \
             bounded: stopped growing at step 4; op aten::relu; owner activation; inside \
             /lib/model.py:7 (forward)\n\
             ====== Peak on device cpu: 4.00 KiB of tensors live at step 4, in aten::relu \
             (forward) ======\n  by owner: activation 4.00 KiB\n  [1] /w/train.py:10 (main): \
             4.00 KiB in 4 block(s); op aten::relu; inside /lib/model.py:7 (forward)\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
        assert_eq!(json["resident"][0]["bounded"], true);
        assert_eq!(json["resident"][0]["stopped_at_step"], 4);
        assert_eq!(json["resident"][0]["growth"], "new_blocks");
    }

    /// The same window, still filling when the run ends (it grew for longer than it has been
    /// flat): a leak.
    #[test]
    fn growth_that_stopped_only_lately_is_still_a_leak() {
        let (out, leaks) = run(window(9, 6));
        // Rises at the ends of steps 3..=7, flat at step end 8: still a leak.
        assert!(!leaks.leaks().is_empty(), "{}", out.console);
        assert!(
            out.console.contains("growing from step 3 to step 7"),
            "{}",
            out.console
        );
    }

    /// `self.seen = torch.cat([self.seen, x])` each step: one live block, 8 KiB larger every
    /// step, each old one freed (never a candidate).
    #[test]
    fn one_block_replaced_by_a_larger_one_each_step_is_a_leak() {
        // The cat's block of step `s`, and the free of step `s - 1`'s.
        let grown = |s: u64| {
            let mut rows = vec![malloc_at(0x1000 + s * 0x10000, s * 8192, 15, "aten::cat")];
            if s > 1 {
                rows.push(free(0x1000 + (s - 1) * 0x10000, (s - 1) * 8192));
            }
            rows
        };
        let mut rows = Vec::new();
        for s in 1..=8u64 {
            rows.push(step(s));
            rows.extend(grown(s));
            // A per-step temporary at another line, alive at the step end with a size that
            // varies: its live bytes fall, so it does not grow this way.
            let size = [4096, 8192, 2048][(s % 3) as usize];
            rows.push(malloc_at(0x90_0000 + s * 0x10000, size, 30, "aten::mul"));
            if s > 1 {
                let before = [4096, 8192, 2048][((s - 1) % 3) as usize];
                rows.push(free(0x90_0000 + (s - 1) * 0x10000, before));
            }
        }
        let (out, leaks) = run(rows);
        // The block live at the end (step 8's) is the leak's `Direct ... leak` line.
        assert_eq!(leaks.leaks().len(), 1, "{}", out.console);
        assert_eq!(leaks.leaks()[0].size, 8 * 8192);
        assert!(
            out.console.contains(
                "[1] /w/train.py:15 (main): +8.00 KiB (8192 bytes) in one block replaced by a \
                 larger one per step, growing from step 3 to step 7; 64.0 KiB leaked in 1 block(s)"
            ),
            "{}",
            out.console
        );
        let json: serde_json::Value =
            serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
        assert_eq!(json["leaks"][0]["growth"], "replaced");
        assert_eq!(json["leaks"][0]["series"][0], serde_json::json!([2, 16384]));
        // Its live block is what the holder search looks for.
        let mut again = Leaks::new();
        let rows = (1..=8u64).flat_map(|s| std::iter::once(step(s)).chain(grown(s)));
        for (i, mut row) in rows.enumerate() {
            row.id = i as u64 + 1;
            again.feed(&row);
        }
        let ptrs: Vec<u64> = again.suspects(10, 3).iter().map(|s| s.1).collect();
        assert_eq!(ptrs, vec![0x1000 + 8 * 0x10000]);
    }

    /// The peak's owner split follows OWNER rows and adds up to the peak.
    #[test]
    fn the_peak_is_split_by_owner_as_relabelled() {
        let with_owner = |mut r: EventRow, owner: &str| {
            let raw = r.attrs_json.take().unwrap();
            r.attrs_json = Some(raw.replace("PTA@activation", owner));
            r
        };
        let mut moved = EventRow::new(Event::System, EventType::Owner, "PTA@gradient");
        moved.device = CPU;
        moved.ptr = Some(0x2000);
        let rows = vec![
            with_owner(malloc_at(0x1000, 4096, 5, "aten::empty"), "PTA@weight"),
            step(1),
            malloc_at(0x2000, 1024, 10, "aten::mm"),
            moved,
            malloc_at(0x3000, 512, 11, "aten::relu"),
            free(0x3000, 512),
            step(2),
        ];
        let (out, _) = run(rows);
        let peak: serde_json::Value =
            serde_json::from_str(&file_text(&out, peak::PEAK_FILE)).unwrap();
        let p = &peak["devices"][0]["peak"];
        assert_eq!(p["bytes"], 4096 + 1024 + 512);
        assert_eq!(
            p["owners"],
            serde_json::json!([
                {"owner": "weight", "bytes": 4096},
                {"owner": "gradient", "bytes": 1024},
                {"owner": "activation", "bytes": 512},
            ])
        );
        assert!(out
            .console
            .contains("  by owner: weight 4.00 KiB, gradient 1.00 KiB, activation 512 B\n"));
    }

    /// A line run by several modules (one layer class, many layers) is one line at the peak,
    /// naming the modules.
    #[test]
    fn the_peaks_lines_name_their_modules() {
        let in_module = |mut r: EventRow, module: &str| {
            let raw = r.attrs_json.take().unwrap();
            r.attrs_json = Some(raw.replace("\"op\"", &format!("\"module\":\"{module}\",\"op\"")));
            r
        };
        let rows = vec![
            step(1),
            in_module(
                malloc_at(0x1000, 4096, 17, "aten::_softmax"),
                "model.0.attn",
            ),
            in_module(
                malloc_at(0x2000, 4096, 17, "aten::_softmax"),
                "model.1.attn",
            ),
            malloc_at(0x3000, 512, 30, "aten::mul"),
            free(0x3000, 512),
            step(2),
        ];
        let (out, _) = run(rows);
        let peak: serde_json::Value =
            serde_json::from_str(&file_text(&out, peak::PEAK_FILE)).unwrap();
        let top = &peak["devices"][0]["peak"]["lines"][0];
        assert_eq!(top["line"], 17);
        assert_eq!(top["bytes"], 8192);
        assert_eq!(
            top["modules"],
            serde_json::json!(["model.0.attn", "model.1.attn"])
        );
        assert!(
            out.console.contains(
                "  [1] /w/train.py:17 (main): 8.00 KiB in 2 block(s); op aten::_softmax; in \
                 model.0.attn, model.1.attn\n"
            ),
            "{}",
            out.console
        );
    }

    #[test]
    fn suspects_are_the_live_blocks_of_leaking_sites() {
        let mut leaks = Leaks::new();
        for (i, mut row) in training(false).into_iter().enumerate() {
            row.id = i as u64 + 1;
            leaks.feed(&row);
        }
        let ptrs: Vec<u64> = leaks.suspects(10, 2).iter().map(|s| s.1).collect();
        // The newest two candidates of line 10 (step 5's, then step 4's); none of line 20.
        assert_eq!(ptrs, vec![0x1500, 0x1400]);
        assert_eq!(leaks.suspects(10, 1)[0].3, "/w/train.py:10 (main)");
    }

    #[test]
    fn an_accumulation_window_that_is_freed_and_made_again_is_resident() {
        // Gradients made in step 2, freed in step 6, made again in step 6 and freed in step 10:
        // the site's live candidate bytes go 4096, 0, 4096 and never pass their first high.
        let mut rows = Vec::new();
        for s in 1..=11u64 {
            rows.push(step(s));
            if s == 6 || s == 10 {
                rows.push(free(0x7000 + (s - 4) * 0x100, 4096));
            }
            if s == 2 || s == 6 {
                rows.push(malloc_at(0x7000 + s * 0x100, 4096, 40, "aten::add"));
            }
        }
        let (out, leaks) = run(rows);
        assert!(leaks.leaks().is_empty(), "{:?}", leaks.leaks());
        assert!(!out.console.contains("Direct"), "{}", out.console);
        assert!(out.console.contains("Resident on device cpu: 1 site(s)"));
    }

    #[test]
    fn blocks_that_only_outlive_the_last_step_judge_nothing() {
        // Step 4's block is live when the input ends (the program's last step): no step the
        // program marked ended after it, so it is neither a leak nor resident.
        let rows = vec![step(1), step(2), step(3), step(4), malloc(0x30, 1024)];
        let (out, leaks) = run(rows.clone());
        assert!(leaks.leaks().is_empty());
        assert_eq!(
            file_text(&out, REPORT_FILE),
            "====== No memory leaks detected ======\n"
        );
        // Too few steps to judge: the console says so.
        assert_eq!(
            out.console,
            "====== Peak on device cpu: 1.00 KiB of tensors live at step 4 ======\n  [1] (no \
             Python line recorded for these blocks): 1.00 KiB in 1 block(s)\n\
             msmemscope: the leaks analysis saw 4 step(s); a leak is judged by growth at two \
             step ends from step 2 on, which takes 5 steps\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
        assert_eq!(json["unjudged_blocks"], 0);
        assert_eq!(json["leaks"], serde_json::json!([]));
    }

    #[test]
    fn a_run_without_steps_says_how_to_give_them() {
        let (out, _) = run(vec![malloc(0x30, 1024)]);
        assert!(out
            .console
            .contains("\nmsmemscope: the leaks analysis saw no steps"));
    }

    #[test]
    fn block_freed_within_a_step_of_its_allocation_is_not_a_leak() {
        let rows = vec![
            step(1),
            step(2),
            malloc(0x30, 1024),
            step(3),
            free(0x30, 1024),
            malloc(0x30, 2048), // the address reused in step 3, freed in step 4
            step(4),
            free(0x30, 2048),
            step(5),
            step(6),
        ];
        let (out, leaks) = run(rows);
        assert!(leaks.leaks().is_empty(), "{:?}", leaks.leaks());
        // Only the peak: step 3's 2 KiB block, the 1 KiB one freed before it.
        assert_eq!(
            out.console,
            "====== Peak on device cpu: 2.00 KiB of tensors live at step 3 ======\n  [1] (no \
             Python line recorded for these blocks): 2.00 KiB in 1 block(s)\n"
        );
    }

    #[test]
    fn hal_blocks_live_at_exit_and_sites_from_python_stacks() {
        let cuda = DeviceId::Cuda(0);
        let mut kernel = EventRow::new(Event::KernelLaunch, EventType::KernelLaunch, "gemm");
        kernel.device = cuda;
        let mut rows = vec![
            block(Event::Malloc, EventType::Hal, cuda, 0x7000, 2 << 20, 0), // HAL, step 0
            step(1),
            kernel.clone(),
        ];
        // A dump without `site` Attrs: the first Python frame names the site.
        for s in 2..=6u64 {
            rows.push(step(s));
            let mut m = block(Event::Malloc, EventType::Pta, cuda, 0x9000 + s, 512, 0);
            m.python_stack = "/w/run.py(12): loop\n/w/run.py(30): <module>".into();
            rows.push(m);
        }
        let (out, leaks) = run(rows);
        assert_eq!(leaks.leaks().len(), 5, "{}", out.console); // 4 PTA + the HAL block
        assert!(out.console.contains(
            "Direct HAL leak of 2.000 Mb(s) at 0x0000000000007000 in kernel_N/A at step 0.\n"
        ));
        assert!(out.console.contains(
            "[1] /w/run.py:12 (loop): +512 B (512 bytes) in 1 block(s) per step, growing from step 3 to step 5"
        ), "{}", out.console);
    }

    #[test]
    fn parsed_attrs_and_step_numbers_from_names() {
        // Rows read back from a dump have `attrs` parsed and no raw JSON.
        let mut rows = Vec::new();
        for s in [5u64, 6, 7, 8, 9] {
            rows.push(step(s));
            let mut m = EventRow::new(Event::Malloc, EventType::Pta, "");
            m.device = CPU;
            m.ptr = Some(0xabc + s);
            m.attrs.insert("size".into(), 3_145_728u64.into());
            m.attrs.insert("site".into(), "/w/a \"q\".py:3 (f)".into());
            rows.push(m);
        }
        let (out, leaks) = run(rows);
        assert_eq!(leaks.leaks()[0].step, 5);
        assert!(out.console.contains("Direct PTA leak of 3.000 Mb(s)"));
        assert!(
            out.console.contains("[1] /w/a \"q\".py:3 (f): +3.00 MiB"),
            "{}",
            out.console
        );
    }

    #[test]
    fn mb_rounding() {
        assert_eq!(mb(0), "0.000");
        assert_eq!(mb(524), "0.000"); // 0.00049…
        assert_eq!(mb(525), "0.001"); // 0.00050…
        assert_eq!(mb(15_728), "0.015");
        assert_eq!(mb(1_048_576 * 3 / 2), "1.500");
    }

    #[test]
    fn human_sizes_and_site_texts() {
        use findings::{human, split_site};
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64_000), "62.5 KiB");
        assert_eq!(human(4_718_592), "4.50 MiB");
        assert_eq!(human(300 << 20), "300 MiB");
        assert_eq!(
            split_site("/a:b/train.py:42 (main)"),
            Some(("/a:b/train.py", 42, "main"))
        );
        assert_eq!(split_site("no line here"), None);
    }
}
