//! The allocation sites of the leaks analysis and the growth rules that judge them.
//!
//! A site is where a block was allocated: the Attr's `site` (the user's `file:line
//! (function)`), `frame` (the innermost line outside torch when it is another), `op` and
//! `module` (the `nn.Module` whose forward ran: one line run by two layers is two sites, so a
//! layer that leaks is told from one that does not), with the block's device and pool. Rows
//! without `site` (dumps of other producers, older dumps) take the first line of
//! `Call Stack(Python)`, else they share the device's "unknown" site.
//!
//! The rules, judged at every step end the program marked:
//! - **New blocks that stay.** A site's *candidate bytes* are the bytes of its blocks that
//!   became candidates (allocated in step 2 or later, live when the step after theirs ends) and
//!   are still live. A site whose candidate bytes exceed every earlier step end's has **risen**.
//!   Two rises or more make it grow; one rise makes it resident (made once and kept: optimizer
//!   state, late-unfrozen parameters, gradients within an accumulation window, compile caches).
//! - **One block that grows.** A site's *held bytes* are the bytes of all its live blocks,
//!   candidates or not: a tensor replaced each step by a larger one (`x = torch.cat([x, y])`)
//!   frees every old block, so it never has a candidate. From its first step end at or after
//!   step 2 with held bytes, a site whose held bytes never fall and pass their high at two step
//!   ends or more grows too.
//! - **Bounded.** Growth that stopped and stayed flat for at least as many steps as it grew (and
//!   for [`FLAT_STEPS`] at least) is a window or a cache that filled up (`deque(maxlen=3)`, an
//!   evicting cache): resident, said as bounded, not a leak. A site still growing is a leak.
//!
//! The end of the input is no step end: blocks that only outlived the last step are counted for
//! a leak site that was already growing, and judge nothing on their own.

use super::super::fast_map::FastMap;
use crate::events::{DeviceId, EventRow, EventType};

/// Points kept per site of its bytes at each step end (for the page's chart).
pub const MAX_SERIES: usize = 512;
/// Holder chains kept per site.
pub const MAX_HOLDERS: usize = 3;
/// Modules named per finding or peak line (a line run by many layers names the first ones).
pub const MAX_MODULES: usize = 3;

/// Adds a site's module to a line's `modules` (the first [`MAX_MODULES`]; `more` past them).
pub fn name_module(modules: &mut Vec<String>, more: &mut bool, module: Option<&String>) {
    let Some(module) = module else { return };
    if modules.contains(module) {
        return;
    }
    if modules.len() < MAX_MODULES {
        modules.push(module.clone());
    } else {
        *more = true;
    }
}
/// Step ends a site must stay flat after its growth, at least, to be judged bounded.
pub const FLAT_STEPS: u64 = 3;

/// What a site was judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// It grew at two step ends or more, and is growing still.
    Leak,
    /// Made once (one rise) and kept.
    Resident,
    /// It grew, then stayed flat at least as long: a window or a cache that filled up.
    Bounded,
    /// Its blocks only outlived the last step (the input ended): not judged.
    LastStepOnly,
}

/// How a site grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// New blocks that stay live (its candidate bytes rise).
    NewBlocks,
    /// Its live bytes rise while its old blocks are freed: one block replaced by a larger one.
    Replaced,
}

/// A step end at which a site's bytes reached a new high.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rise {
    /// The step that ended.
    pub step: u64,
    pub bytes: u64,
    pub blocks: u64,
}

/// The new highs of one of a site's byte counts at step ends: the first, the latest and how
/// many (a site that leaks for 10,000 steps keeps three numbers, not 10,000).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rises {
    pub first: Option<Rise>,
    pub last: Option<Rise>,
    pub count: u64,
}

impl Rises {
    fn push(&mut self, rise: Rise) {
        self.first.get_or_insert(rise);
        self.last = Some(rise);
        self.count += 1;
    }

    /// The high so far (0 before any rise).
    pub fn high(&self) -> u64 {
        self.last.map_or(0, |r| r.bytes)
    }

    /// Growth that stopped at its last rise and stayed flat since for at least as many step
    /// ends as it grew over, and at least [`FLAT_STEPS`]; `last_end` is the latest step end.
    pub fn bounded(&self, last_end: u64) -> bool {
        match (self.first, self.last) {
            (Some(first), Some(last)) => {
                let flat = last_end.saturating_sub(last.step);
                flat >= FLAT_STEPS && flat >= last.step - first.step
            }
            _ => false,
        }
    }
}

/// The steps a site's candidate blocks were allocated in: the first [`MAX_SERIES`] in order,
/// then only the latest and how many more, so a site leaking every step of a long run holds a
/// bounded list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepList {
    listed: Vec<u64>,
    latest: Option<u64>,
    more: u64,
}

impl StepList {
    pub fn add(&mut self, step: u64) {
        if let Err(at) = self.listed.binary_search(&step) {
            if self.listed.len() < MAX_SERIES {
                self.listed.insert(at, step);
            } else if self.latest.is_none_or(|l| step > l) && at == self.listed.len() {
                // Steps arrive in order: one past the list and past the latest is a new one.
                self.more += 1;
                self.latest = Some(step);
            }
        }
    }

    /// The steps listed, ascending (the first [`MAX_SERIES`]).
    pub fn listed(&self) -> &[u64] {
        &self.listed
    }

    /// Steps past the listed ones (not kept, but for the latest).
    pub fn more(&self) -> u64 {
        self.more
    }

    pub fn first(&self) -> Option<&u64> {
        self.listed.first()
    }

    /// The latest step, listed or not.
    pub fn last(&self) -> Option<&u64> {
        self.latest.as_ref().or(self.listed.last())
    }
}

/// A site's held bytes (all its live blocks) at step ends, for the rule of one block that grows.
#[derive(Clone, Debug, Default)]
pub struct Held {
    /// The first step end (from step 2) it had live blocks at: where its growth is measured
    /// from (step, bytes, blocks).
    pub base: Option<Rise>,
    pub rises: Rises,
    /// Its held bytes fell at some step end since the base: not one block that grows.
    pub fell: bool,
    /// Held bytes at the previous step end.
    previous: u64,
    /// Held bytes at each step end from the base, while it may still grow this way.
    pub series: Vec<(u64, u64)>,
}

/// One site's record.
#[derive(Clone, Debug)]
pub struct Site {
    pub device: DeviceId,
    pub pool: EventType,
    /// The user's line, `file:line (function)` (None: unknown).
    pub site: Option<String>,
    /// The innermost line outside torch, when it differs from `site`.
    pub frame: Option<String>,
    /// The op that allocated (`aten::addmm`).
    pub op: Option<String>,
    /// The owner category of its first block (`activation`, `optimizer_state`, ...).
    pub owner: Option<String>,
    /// Its candidate blocks still live, and their bytes.
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// All its blocks live now, candidates or not, and their bytes.
    pub held_blocks: u64,
    pub held_bytes: u64,
    /// New highs of its candidate bytes.
    pub rises: Rises,
    /// Candidate bytes at each step end since the site's first candidate.
    pub series: Vec<(u64, u64)>,
    pub held: Held,
    /// Candidate blocks found at the end of the input only.
    pub late_blocks: u64,
    /// The steps its candidate blocks were allocated in (the first [`MAX_SERIES`] and the latest).
    pub steps: StepList,
    /// The module whose forward allocated its blocks (`model.layers.3.attn`; None: outside
    /// any, or not recorded).
    pub module: Option<String>,
    /// Reference chains that hold its blocks (`SYSTEM HOLDER` rows), at most [`MAX_HOLDERS`]
    /// different ones: chains that differ only in container indices count as one, with the
    /// number of blocks held that way.
    pub holders: Vec<(String, u64)>,
}

impl Site {
    /// Its verdict when the latest step end is `last_end`.
    pub fn verdict(&self, last_end: u64) -> Verdict {
        let Some(growth) = self.growth() else {
            return match self.rises.count {
                0 => Verdict::LastStepOnly,
                _ => Verdict::Resident,
            };
        };
        if self.rises_of(growth).bounded(last_end) {
            Verdict::Bounded
        } else {
            Verdict::Leak
        }
    }

    /// How it grew (at two step ends or more), if it did: by new blocks first.
    pub fn growth(&self) -> Option<Growth> {
        if self.rises.count >= 2 {
            Some(Growth::NewBlocks)
        } else if self.held.rises.count >= 2 && !self.held.fell {
            Some(Growth::Replaced)
        } else {
            None
        }
    }

    /// The rises of the count that `growth` judges.
    pub fn rises_of(&self, growth: Growth) -> &Rises {
        match growth {
            Growth::NewBlocks => &self.rises,
            Growth::Replaced => &self.held.rises,
        }
    }

    /// Growth per step, (bytes, blocks), between where it started and its last rise.
    pub fn per_step(&self) -> (u64, f64) {
        let (from, last) = match self.growth() {
            Some(Growth::Replaced) => (self.held.base, self.held.rises.last),
            _ => (self.rises.first, self.rises.last),
        };
        match (from, last) {
            (Some(first), Some(last)) if last.step > first.step => {
                let steps = last.step - first.step;
                (
                    last.bytes.saturating_sub(first.bytes) / steps,
                    (last.blocks.saturating_sub(first.blocks)) as f64 / steps as f64,
                )
            }
            (Some(first), _) => (first.bytes, first.blocks as f64),
            _ => (0, 0.0),
        }
    }

    /// Its bytes at each step end, as the rule that judges it counts them.
    pub fn judged_series(&self) -> &[(u64, u64)] {
        match self.growth() {
            Some(Growth::Replaced) => &self.held.series,
            _ => &self.series,
        }
    }

    fn step_ended(&mut self, step: u64) -> Option<u64> {
        let mut grown = None;
        if self.live_bytes > self.rises.high() {
            grown = Some(self.live_bytes - self.rises.high());
            self.rises.push(Rise {
                step,
                bytes: self.live_bytes,
                blocks: self.live_blocks,
            });
        }
        if self.rises.count > 0 && self.series.len() < MAX_SERIES {
            self.series.push((step, self.live_bytes));
        }
        self.held_step_ended(step);
        grown
    }

    fn held_step_ended(&mut self, step: u64) {
        let held = &mut self.held;
        let now = Rise {
            step,
            bytes: self.held_bytes,
            blocks: self.held_blocks,
        };
        match held.base {
            None if step >= 2 && self.held_bytes > 0 => held.base = Some(now),
            None => {}
            Some(_) if held.fell => {}
            Some(base) => {
                if self.held_bytes < held.previous {
                    held.fell = true;
                    // It is not one block that grows: what was kept for that goes.
                    held.series = Vec::new();
                } else {
                    if self.held_bytes > held.rises.high().max(base.bytes) {
                        if held.rises.count == 0 {
                            held.series.push((base.step, base.bytes));
                        }
                        held.rises.push(now);
                    }
                    // Kept only once it grows: every site with a live block has a base.
                    if held.rises.count > 0 && held.series.len() < MAX_SERIES {
                        held.series.push((step, self.held_bytes));
                    }
                }
            }
        }
        held.previous = self.held_bytes;
    }
}

/// The sites met so far, each under one id.
#[derive(Default)]
pub struct SiteBook {
    /// Hash of the key -> ids with that hash (almost always one).
    index: FastMap<u64, Vec<u32>>,
    sites: Vec<Site>,
    last_end: u64,
}

/// The parts of a MALLOC row that name its site.
struct Key<'a> {
    device: DeviceId,
    pool: EventType,
    site: Option<std::borrow::Cow<'a, str>>,
    frame: Option<&'a str>,
    op: Option<&'a str>,
    module: Option<&'a str>,
}

impl Key<'_> {
    fn hash(&self) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        // A fixed seed: the ids only have to be stable within one map, but a fixed hasher
        // lets every map share it.
        let mut h = foldhash::fast::FixedState::with_seed(0x6d73_6d65_6d73).build_hasher();
        self.device.hash(&mut h);
        self.pool.hash(&mut h);
        self.site.as_deref().hash(&mut h);
        self.frame.hash(&mut h);
        self.op.hash(&mut h);
        self.module.hash(&mut h);
        h.finish()
    }

    fn matches(&self, s: &Site) -> bool {
        s.device == self.device
            && s.pool == self.pool
            && s.site.as_deref() == self.site.as_deref()
            && s.frame.as_deref() == self.frame
            && s.op.as_deref() == self.op
            && s.module.as_deref() == self.module
    }
}

/// The first frame of a `Call Stack(Python)` cell (`file(line): function`) as a site text.
fn site_from_stack(stack: &str) -> Option<String> {
    let first = stack.lines().next()?.trim();
    let (place, function) = first.split_once("): ")?;
    let (file, line) = place.rsplit_once('(')?;
    Some(format!("{file}:{line} ({function})"))
}

/// A row's allocation site: its `site` Attr, else the first frame of its Python stack.
pub fn row_site(row: &EventRow) -> Option<std::borrow::Cow<'_, str>> {
    row.attr_string("site")
        .or_else(|| site_from_stack(&row.python_stack).map(Into::into))
}

/// The category of a row's `owner` (`activation` of `PTA@activation`), if it has one.
pub fn owner_category(row: &EventRow) -> Option<&str> {
    row.attr_str("owner").and_then(|o| o.split('@').nth(1))
}

impl SiteBook {
    /// The id of the site of a MALLOC row (made on first sight).
    pub fn site_of(&mut self, row: &EventRow, pool: EventType) -> u32 {
        let site = row_site(row);
        let key = Key {
            device: row.device,
            pool,
            site,
            frame: row.attr_str("frame"),
            op: row.attr_str("op"),
            module: row.attr_str("module"),
        };
        let hash = key.hash();
        let ids = self.index.entry(hash).or_default();
        if let Some(&id) = ids
            .iter()
            .find(|&&id| key.matches(&self.sites[id as usize]))
        {
            return id;
        }
        let id = self.sites.len() as u32;
        ids.push(id);
        let owner = owner_category(row).map(str::to_string);
        self.sites.push(Site {
            device: key.device,
            pool,
            site: key.site.map(|s| s.into_owned()),
            frame: key.frame.map(str::to_string),
            op: key.op.map(str::to_string),
            owner,
            live_blocks: 0,
            live_bytes: 0,
            held_blocks: 0,
            held_bytes: 0,
            rises: Rises::default(),
            series: Vec::new(),
            held: Held::default(),
            late_blocks: 0,
            steps: StepList::default(),
            module: key.module.map(str::to_string),
            holders: Vec::new(),
        });
        id
    }

    pub fn get(&self, id: u32) -> &Site {
        &self.sites[id as usize]
    }

    pub fn sites(&self) -> &[Site] {
        &self.sites
    }

    /// A block of site `id`, allocated in `step`, became a candidate (`late`: at the end of
    /// the input).
    pub fn candidate(&mut self, id: u32, size: u64, step: u64, late: bool) {
        let s = &mut self.sites[id as usize];
        s.live_blocks += 1;
        s.live_bytes += size;
        if late {
            s.late_blocks += 1;
        }
        s.steps.add(step);
    }

    /// A block of site `id` was allocated.
    pub fn allocated(&mut self, id: u32, size: u64) {
        let s = &mut self.sites[id as usize];
        s.held_blocks += 1;
        s.held_bytes += size;
    }

    /// A block of site `id` was freed (`candidate`: it had become one).
    pub fn freed(&mut self, id: u32, size: u64, candidate: bool) {
        let s = &mut self.sites[id as usize];
        s.held_blocks = s.held_blocks.saturating_sub(1);
        s.held_bytes = s.held_bytes.saturating_sub(size);
        if candidate {
            s.live_blocks = s.live_blocks.saturating_sub(1);
            s.live_bytes = s.live_bytes.saturating_sub(size);
        }
    }

    /// Step `step` ended (a step the program marked): new highs are rises. The sites whose
    /// candidate bytes rose, and by how many bytes in all.
    pub fn step_ended(&mut self, step: u64) -> (u64, u64) {
        self.last_end = step;
        let (mut grown, mut bytes) = (0, 0);
        for s in &mut self.sites {
            if let Some(by) = s.step_ended(step) {
                grown += 1;
                bytes += by;
            }
        }
        (grown, bytes)
    }

    /// The latest step end the program marked (0: none yet).
    pub fn last_end(&self) -> u64 {
        self.last_end
    }

    /// The verdict on site `id` now.
    pub fn verdict(&self, id: u32) -> Verdict {
        self.sites[id as usize].verdict(self.last_end)
    }

    /// A holder chain for a block of site `id`.
    pub fn holder(&mut self, id: u32, chain: &str) {
        let s = &mut self.sites[id as usize];
        let shape = chain_shape(chain);
        if let Some(h) = s.holders.iter_mut().find(|h| chain_shape(&h.0) == shape) {
            h.1 += 1;
        } else if s.holders.len() < MAX_HOLDERS {
            s.holders.push((chain.to_string(), 1));
        }
    }
}

/// A holder chain with the numbers in brackets and in repeat counts blanked (`list[5]` ->
/// `list[*]`, `dict['layer0/7']` -> `dict['layer*/*']`, `(x4)` -> `(x*)`): the blocks a list,
/// a dict keyed by step or a growing autograd graph keeps are one way of holding.
pub fn chain_shape(chain: &str) -> String {
    let mut out = String::with_capacity(chain.len());
    let mut depth = 0usize;
    // In a run of digits being blanked (its `*` already written).
    let mut blanking = false;
    for c in chain.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if c.is_ascii_digit() && (blanking || depth > 0 || out.ends_with("(x")) {
            if !blanking {
                out.push('*');
                blanking = true;
            }
            continue;
        }
        blanking = false;
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{chain_shape, StepList, MAX_SERIES};

    #[test]
    fn a_site_leaking_every_step_lists_a_bounded_number_of_steps() {
        let mut steps = StepList::default();
        for step in (2..10_002).rev().take(3) {
            steps.add(step); // out of order, while the list has room: kept sorted
        }
        assert_eq!(steps.listed(), &[9_999, 10_000, 10_001]);
        let mut steps = StepList::default();
        for step in 2..10_002 {
            steps.add(step);
            steps.add(step); // a second block in the same step
        }
        assert_eq!(steps.listed().len(), MAX_SERIES);
        assert_eq!(steps.first(), Some(&2));
        assert_eq!(steps.listed().last(), Some(&(MAX_SERIES as u64 + 1)));
        assert_eq!(steps.last(), Some(&10_001));
        assert_eq!(steps.more(), 10_000 - MAX_SERIES as u64);
    }

    #[test]
    fn chain_shapes_blank_indices_keys_and_repeats() {
        assert_eq!(
            chain_shape("a (global of t.py) -> list[15] -> Tensor 4x16 float32"),
            "a (global of t.py) -> list[*] -> Tensor 4x16 float32"
        );
        assert_eq!(
            chain_shape("acts -> dict['layer0/17'] -> Tensor"),
            "acts -> dict['layer*/*'] -> Tensor"
        );
        assert_eq!(
            chain_shape("t -> grad_fn AddBackward0 -> AddBackward0 (x12) -> Tensor 64x2"),
            "t -> grad_fn AddBackward0 -> AddBackward0 (x*) -> Tensor 64x2"
        );
    }
}
