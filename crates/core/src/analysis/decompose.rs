//! Decompose: what memory is made of, per step — bytes by `owner` (docs/analyses.md#decompose).
//!
//! Every MALLOC row carries an `owner` (`PTA@weight`, `PTA@activation@mine`, `PTA@fsdp2@all_gather`;
//! the bare pool name when nothing labelled it). SYSTEM/OWNER rows move a live block to a new
//! owner (the tracker learns that a tensor is a parameter, a gradient or an optimizer state
//! after its MALLOC row was written). Per device and pool, this keeps the live bytes of each
//! owner; at every step's end it records, per owner:
//!
//! - `Current`: the live bytes when the step ended;
//! - `Peak`: the live bytes at the moment the pool's total was highest in the step, with the
//!   owners known at that moment (as PyTorch's `MemTracker` takes its peak snapshot: a later
//!   relabel moves bytes but changes no total, so it does not rewrite the peak);
//! - `Max`: the owner's own highest live bytes in the step.
//!
//! Steps come from SYSTEM/STEP rows (`step()` or `step start` ranges): rows before the first
//! are step 0 (model construction), the end of the input ends the last step. Pools are kept
//! apart because CUDA's HAL segments hold the PTA blocks: adding them would count bytes twice.
//!
//! The whole table goes to `device_{id}/dump/memscope_decompose.csv`; the console gets, per
//! device and pool, the last step and the step with the highest peak.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::fast_map::FastMap;
use super::live_blocks::{is_pool, BlockChange, BlockKey, LiveBlocks};
use super::{Analysis, AnalysisOutput};
use crate::events::reader::{self, ReadError};
use crate::events::{DeviceId, Event, EventRow, EventType};

/// The table's header (the file is written next to each device's dump).
pub const TABLE_HEADER: &str = "Step,Device Id,Pool,Owner,Current(byte),Peak(byte),Max(byte)";
/// The `Owner` of each (step, device, pool)'s sum row.
pub const TOTAL_OWNER: &str = "total";

/// The table file of one device, relative to the run directory.
pub fn table_path(device: DeviceId) -> String {
    format!("{}/dump/memscope_decompose.csv", device.dir_name())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct PoolKey {
    device: DeviceId,
    pool: EventType,
}

impl PoolKey {
    fn of(key: BlockKey) -> PoolKey {
        PoolKey {
            device: key.device,
            pool: key.pool,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Block {
    owner: usize,
    size: u64,
}

/// Live bytes per owner of one (device, pool), and this step's extremes.
#[derive(Default)]
struct PoolState {
    current: Vec<u64>,
    total: u64,
    peak_total: u64,
    at_peak: Vec<u64>,
    max: Vec<u64>,
}

impl PoolState {
    fn grow(&mut self, owners: usize) {
        if self.current.len() < owners {
            self.current.resize(owners, 0);
            self.at_peak.resize(owners, 0);
            self.max.resize(owners, 0);
        }
    }

    fn add(&mut self, owner: usize, size: u64) {
        self.current[owner] += size;
        self.total += size;
        if self.current[owner] > self.max[owner] {
            self.max[owner] = self.current[owner];
        }
        if self.total > self.peak_total {
            self.peak_total = self.total;
            self.at_peak.copy_from_slice(&self.current);
        }
    }

    fn remove(&mut self, owner: usize, size: u64) {
        self.current[owner] = self.current[owner].saturating_sub(size);
        self.total = self.total.saturating_sub(size);
    }

    /// A new step starts from what is live now.
    fn restart(&mut self) {
        self.peak_total = self.total;
        self.at_peak.copy_from_slice(&self.current);
        self.max.copy_from_slice(&self.current);
    }
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerBytes {
    pub step: u64,
    pub device: DeviceId,
    pub pool: EventType,
    /// An owner, or [`TOTAL_OWNER`].
    pub owner: String,
    pub current: u64,
    pub peak: u64,
    pub max: u64,
}

#[derive(Default)]
pub struct Decompose {
    owners: Vec<String>,
    owner_ids: FastMap<String, usize>,
    blocks: LiveBlocks<Block>,
    pools: BTreeMap<PoolKey, PoolState>,
    step: u64,
    /// The ended steps' lines, in step order.
    table: Vec<OwnerBytes>,
}

impl Decompose {
    pub fn new() -> Decompose {
        Decompose::default()
    }

    /// The table so far (complete after [`Analysis::finish`]).
    pub fn table(&self) -> &[OwnerBytes] {
        &self.table
    }

    fn owner_id(&mut self, owner: &str) -> usize {
        if let Some(&id) = self.owner_ids.get(owner) {
            return id;
        }
        let id = self.owners.len();
        self.owners.push(owner.to_string());
        self.owner_ids.insert(owner.to_string(), id);
        id
    }

    fn pool(&mut self, key: PoolKey) -> &mut PoolState {
        let owners = self.owners.len();
        let state = self.pools.entry(key).or_default();
        state.grow(owners);
        state
    }

    /// A MALLOC or FREE row of a pool (live_blocks' rules: a MALLOC replaces a block whose
    /// FREE was lost).
    fn malloc_or_free(&mut self, row: &EventRow) {
        let size = row.attr_u64("size").unwrap_or(0);
        let owner = match row.event {
            Event::Malloc => {
                let owner = owner_of(row).unwrap_or_else(|| row.event_type.as_str().to_string());
                Some(self.owner_id(&owner))
            }
            _ => None,
        };
        let block = || Block {
            owner: owner.unwrap_or_default(),
            size,
        };
        let Some((change, gone)) = self.blocks.apply(row, block) else {
            return;
        };
        if let Some(old) = gone {
            self.pool(PoolKey::of(change.key()))
                .remove(old.owner, old.size);
        }
        if let (BlockChange::Malloc(key), Some(owner)) = (change, owner) {
            self.pool(PoolKey::of(key)).add(owner, size);
        }
    }

    /// A SYSTEM/OWNER row: the live block at Ptr (in the pool its owner names) changes owner.
    fn relabel(&mut self, row: &EventRow) {
        let (Some(ptr), Some(owner)) = (row.ptr, owner_of(row)) else {
            return;
        };
        let pool_name = owner.split('@').next().unwrap_or_default();
        let Some(pool) = EventType::parse(pool_name).filter(|t| is_pool(*t)) else {
            return;
        };
        let key = BlockKey {
            device: row.device,
            pool,
            ptr,
        };
        let Some(&block) = self.blocks.get(&key) else {
            return;
        };
        let new_owner = self.owner_id(&owner);
        if new_owner == block.owner {
            return;
        }
        if let Some(live) = self.blocks.get_mut(&key) {
            live.owner = new_owner;
        }
        let state = self.pool(PoolKey::of(key));
        state.remove(block.owner, block.size);
        state.add(new_owner, block.size);
    }

    /// Records the step that just ended and starts the next from what is live.
    fn end_step(&mut self) {
        let step = self.step;
        for (key, state) in &mut self.pools {
            state.grow(self.owners.len());
            let mut any = false;
            for (id, owner) in self.owners.iter().enumerate() {
                let (current, peak, max) = (state.current[id], state.at_peak[id], state.max[id]);
                if current == 0 && peak == 0 && max == 0 {
                    continue;
                }
                any = true;
                self.table.push(OwnerBytes {
                    step,
                    device: key.device,
                    pool: key.pool,
                    owner: owner.clone(),
                    current,
                    peak,
                    max,
                });
            }
            if any {
                self.table.push(OwnerBytes {
                    step,
                    device: key.device,
                    pool: key.pool,
                    owner: TOTAL_OWNER.to_string(),
                    current: state.total,
                    peak: state.peak_total,
                    max: state.peak_total,
                });
            }
            state.restart();
        }
    }
}

/// Offline: the table of a CSV or SQLite dump (one device's file).
pub fn check_decompose(path: &Path) -> Result<Vec<OwnerBytes>, ReadError> {
    let mut analysis = Decompose::new();
    let mut rows = reader::open_rows(path)?;
    while let Some(row) = rows.next_row()? {
        analysis.feed(row);
    }
    analysis.end_step();
    Ok(std::mem::take(&mut analysis.table))
}

/// The row's `owner` Attr (parsed when it has escapes).
fn owner_of(row: &EventRow) -> Option<String> {
    if let Some(owner) = row.attr_str("owner") {
        return Some(owner.to_string());
    }
    let raw = row.attrs_json.as_deref()?;
    let parsed: serde_json::Value = serde_json::from_str(raw).ok()?;
    parsed.get("owner")?.as_str().map(str::to_string)
}

impl Analysis for Decompose {
    fn name(&self) -> &'static str {
        "decompose"
    }

    fn feed(&mut self, row: &EventRow) {
        match (row.event, row.event_type) {
            (Event::System, EventType::Step) => {
                self.end_step();
                self.step = row.name.trim().parse().unwrap_or(self.step + 1);
            }
            (Event::System, EventType::Owner) => self.relabel(row),
            (Event::Malloc | Event::Free, _) => self.malloc_or_free(row),
            _ => {}
        }
    }

    fn finish(&mut self) -> AnalysisOutput {
        self.end_step();
        let mut files: BTreeMap<DeviceId, String> = BTreeMap::new();
        for line in &self.table {
            let file = files
                .entry(line.device)
                .or_insert_with(|| format!("{TABLE_HEADER}\n"));
            let _ = writeln!(
                file,
                "{},{},{},{},{},{},{}",
                line.step,
                line.device,
                line.pool.as_str(),
                csv_field(&line.owner),
                line.current,
                line.peak,
                line.max
            );
        }
        AnalysisOutput {
            console: render_console(&self.table),
            files: files
                .into_iter()
                .map(|(device, text)| (table_path(device), text))
                .collect(),
        }
    }
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// Per (device, pool): the last step's breakdown and, when another step peaked higher, that
/// step's peak breakdown.
fn render_console(table: &[OwnerBytes]) -> String {
    let mut groups: BTreeMap<(DeviceId, EventType), Vec<&OwnerBytes>> = BTreeMap::new();
    for line in table {
        groups
            .entry((line.device, line.pool))
            .or_default()
            .push(line);
    }
    let mut out = String::new();
    for ((device, pool), lines) in groups {
        let totals: Vec<&&OwnerBytes> = lines.iter().filter(|l| l.owner == TOTAL_OWNER).collect();
        let last_step = lines.iter().map(|l| l.step).max().unwrap_or(0);
        let last_peak = totals
            .iter()
            .find(|l| l.step == last_step)
            .map_or(0, |l| l.peak);
        // The first step that peaked higher than the last one, if any.
        let peak_step = totals
            .iter()
            .filter(|l| l.peak > last_peak)
            .max_by_key(|l| (l.peak, std::cmp::Reverse(l.step)))
            .map_or(last_step, |l| l.step);
        let _ = writeln!(
            out,
            "====== Memory decomposition on device {device} ({} pool) ======",
            pool.as_str()
        );
        let mut steps = vec![last_step];
        if peak_step != last_step {
            steps.push(peak_step);
        }
        for step in steps {
            let rows: Vec<&&OwnerBytes> = lines.iter().filter(|l| l.step == step).collect();
            let width = rows.iter().map(|l| l.owner.len()).max().unwrap_or(5).max(5);
            let what = if step == last_step {
                "last step"
            } else {
                "highest peak"
            };
            let _ = writeln!(out, "Step {step} ({what}):");
            let _ = writeln!(
                out,
                "  {:<width$}  {:>16}  {:>16}",
                "Owner", "Current(byte)", "Peak(byte)"
            );
            for line in rows {
                let _ = writeln!(
                    out,
                    "  {:<width$}  {:>16}  {:>16}",
                    line.owner, line.current, line.peak
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(event: Event, ptr: u64, size: u64, owner: Option<&str>) -> EventRow {
        let mut row = EventRow::new(event, EventType::Pta, "N/A");
        row.device = DeviceId::Cpu;
        row.ptr = Some(ptr);
        row.attrs.insert("size".into(), size.into());
        if let Some(owner) = owner {
            row.attrs.insert("owner".into(), owner.into());
        }
        row
    }

    fn relabel(ptr: u64, owner: &str) -> EventRow {
        let mut row = EventRow::new(Event::System, EventType::Owner, owner);
        row.device = DeviceId::Cpu;
        row.ptr = Some(ptr);
        row.attrs.insert("owner".into(), owner.into());
        row
    }

    fn step(n: u64) -> EventRow {
        EventRow::new(Event::System, EventType::Step, n.to_string())
    }

    fn line(table: &[OwnerBytes], step: u64, owner: &str) -> (u64, u64, u64) {
        let l = table
            .iter()
            .find(|l| l.step == step && l.owner == owner)
            .unwrap_or_else(|| panic!("no line for step {step} owner {owner}: {table:#?}"));
        (l.current, l.peak, l.max)
    }

    #[test]
    fn owners_relabels_and_step_peaks() {
        let mut d = Decompose::new();
        let rows = [
            block(Event::Malloc, 0x10, 100, Some("PTA@activation")),
            relabel(0x10, "PTA@weight"),
            step(1),
            block(Event::Malloc, 0x20, 40, Some("PTA@activation")),
            block(Event::Malloc, 0x30, 60, Some("PTA@temporary")),
            block(Event::Free, 0x20, 40, None),
            relabel(0x30, "PTA@gradient"),
            block(Event::Malloc, 0x40, 30, Some("PTA@optimizer_state")),
            block(Event::Free, 0x30, 60, None),
            step(2),
        ];
        for row in &rows {
            d.feed(row);
        }
        d.finish();
        let t = d.table();
        // The peak came before the block was known to be a weight.
        assert_eq!(line(t, 0, "PTA@weight"), (100, 0, 100));
        assert_eq!(line(t, 0, "PTA@activation"), (0, 100, 100));
        assert_eq!(line(t, 0, TOTAL_OWNER), (100, 100, 100));
        // Step 1 peaks at 200 (weight 100, activation 40, temporary 60); the temporary then
        // becomes a gradient (its bytes move, the total stays) and is freed after the state came.
        assert_eq!(line(t, 1, TOTAL_OWNER), (130, 200, 200));
        assert_eq!(line(t, 1, "PTA@weight"), (100, 100, 100));
        assert_eq!(line(t, 1, "PTA@activation"), (0, 40, 40));
        assert_eq!(line(t, 1, "PTA@temporary"), (0, 60, 60));
        assert_eq!(line(t, 1, "PTA@gradient"), (0, 0, 60));
        assert_eq!(line(t, 1, "PTA@optimizer_state"), (30, 0, 30));
        // Step 2 starts from what is live and has no rows: its extremes are its start.
        assert_eq!(line(t, 2, TOTAL_OWNER), (130, 130, 130));
        assert_eq!(line(t, 2, "PTA@optimizer_state"), (30, 30, 30));
    }

    #[test]
    fn unlabelled_blocks_belong_to_their_pool_and_unknown_relabels_are_ignored() {
        let mut d = Decompose::new();
        d.feed(&block(Event::Malloc, 0x10, 8, None));
        d.feed(&relabel(0x99, "PTA@weight"));
        d.feed(&relabel(0x10, "HAL@weight"));
        let out = d.finish();
        assert_eq!(line(d.table(), 0, "PTA"), (8, 8, 8));
        assert_eq!(
            out.files,
            vec![(
                "device_cpu/dump/memscope_decompose.csv".to_string(),
                format!("{TABLE_HEADER}\n0,cpu,PTA,PTA,8,8,8\n0,cpu,PTA,total,8,8,8\n")
            )]
        );
        assert!(out.console.starts_with(
            "====== Memory decomposition on device cpu (PTA pool) ======\nStep 0 (last step):\n"
        ));
    }
}
