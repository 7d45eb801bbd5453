//! Inefficient memory (docs/analyses.md#inefficient; the original msMemScope's "低效内存识别"):
//! tensor blocks whose allocation, accesses and free are badly timed, judged at operator
//! granularity.
//!
//! # Op granularity
//!
//! An event's *op* is the number of `OP_LAUNCH`/`ATEN_START` rows seen before it on its device
//! (rows without a device — the PyTorch tracker's op rows — count on every device): op `k` is
//! the k-th op started, and an event between op `k`'s end and op `k+1`'s start belongs to op `k`
//! (in PyTorch a tensor is usually freed when Python drops it, right after the op that last
//! used it). Events before the first op belong to op 0. Ops are counted per device, and only
//! events of the same device are compared, so a dump file of one device gives the same answer
//! as the online analysis of the whole run.
//!
//! # Blocks
//!
//! A block is a `MALLOC` row of Event Type `PTA` or `HOST` (tensor storages; `HAL` rows are the
//! driver's pool segments that hold many tensors, so they are not blocks here), keyed by device
//! and `Ptr`. An `ACCESS` row belongs to the live block whose `[Ptr, Ptr + size)` contains its
//! `Ptr` (so a view's offset pointer finds its storage). A `FREE` row ends the live block at its
//! `Ptr`, unless both carry an `allocation_id` and the ids differ. A `MALLOC` at the `Ptr` of a
//! live block replaces it (its free was not recorded; it is not judged for late deallocation).
//!
//! # The three kinds, as the original msMemScope's table 1 defines them
//!
//! With `a` the op of the block's `MALLOC`, `f` and `l` the ops of its first and last `ACCESS`,
//! `r` the op of its `FREE`:
//!
//! - **early_allocation** (过早申请): "between the op that allocates the tensor and the op of its
//!   first access there are other ops that free other tensors": some `FREE` of another block of
//!   the same device has op `i` with `a < i < f`.
//! - **late_deallocation** (过迟释放): "between the op of the tensor's last access and the op that
//!   frees it there are other ops that allocate other tensors": some `MALLOC` of another block of
//!   the same device has op `i` with `l < i < r`.
//! - **temporary_idleness** (临时闲置): "between two accesses of the tensor there are more ops
//!   than a threshold": for two *consecutive* accesses at ops `p < q`, the ops strictly between
//!   them, `q - p - 1`, exceed `idle_threshold` (default 3000). Consecutive, because idleness is
//!   time without accesses: two accesses far apart with others in between are not idle.
//!
//! "Other ops" is read strictly: the allocating op, the accessing op and the freeing op
//! themselves do not count. A block without accesses has no first or last access and is marked
//! for none of the kinds; a block never freed is not judged for late deallocation (that is a
//! leak's question). A block may be marked with several kinds: it then has one result per kind.
//!
//! # Output
//!
//! The original msMemScope writes `inefficient_type` into the MALLOC rows of the dump. Here the
//! dump is written in time order while the program runs, long before a block's fate is known, and
//! rows already written are never rewritten. So the online analysis (`--analysis=inefficient`)
//! writes its marks to `inefficient/inefficient_blocks.csv` in the run directory — one line per
//! (block, kind): the MALLOC row's `ID`, `Ptr`, `size`, `Device Id`, `inefficient_type` — and a
//! summary to the console. Offline, [`check_inefficient`] streams a CSV or DB dump and returns the
//! marks; it writes nothing (the caller may render them with [`render_csv`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::base_index::BaseIndex;
use super::live_blocks::{BlockKey, LiveBlocks};
use super::{Analysis, AnalysisOutput};
use crate::events::reader::{self, ReadError};
use crate::events::row::format_ptr;
use crate::events::{DeviceId, Event, EventRow, EventType};

/// The idle threshold (ops) when none is given.
pub const DEFAULT_IDLE_THRESHOLD: u64 = 3000;

/// Where the online analysis writes its marks, relative to the run directory.
pub const BLOCKS_FILE: &str = "inefficient/inefficient_blocks.csv";

/// The header of [`BLOCKS_FILE`].
pub const BLOCKS_HEADER: &str = "ID,Ptr,size,Device Id,inefficient_type";

/// The kinds of inefficient memory, in the original msMemScope's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InefficientType {
    EarlyAllocation,
    LateDeallocation,
    TemporaryIdleness,
}

impl InefficientType {
    pub const ALL: [InefficientType; 3] = [
        InefficientType::EarlyAllocation,
        InefficientType::LateDeallocation,
        InefficientType::TemporaryIdleness,
    ];

    /// The `inefficient_type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            InefficientType::EarlyAllocation => "early_allocation",
            InefficientType::LateDeallocation => "late_deallocation",
            InefficientType::TemporaryIdleness => "temporary_idleness",
        }
    }

    pub fn parse(s: &str) -> Option<InefficientType> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The accepted values, for error messages.
    pub fn accepted() -> String {
        Self::ALL.map(|k| k.as_str()).join(", ")
    }

    fn label(self) -> &'static str {
        match self {
            InefficientType::EarlyAllocation => "early allocation",
            InefficientType::LateDeallocation => "late deallocation",
            InefficientType::TemporaryIdleness => "temporary idleness",
        }
    }
}

/// One mark: a block and one kind it was found to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InefficientBlock {
    /// The `ID` of the block's MALLOC row.
    pub id: u64,
    pub ptr: u64,
    pub size: u64,
    pub device: DeviceId,
    pub kind: InefficientType,
}

/// The offline check's parameters (`check_inefficient`'s keywords).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Only blocks of at least this many bytes.
    pub mem_size: u64,
    /// Only this kind; all kinds when None.
    pub kind: Option<InefficientType>,
    /// Temporary idleness: more ops than this between two consecutive accesses.
    pub idle_threshold: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            mem_size: 0,
            kind: None,
            idle_threshold: DEFAULT_IDLE_THRESHOLD,
        }
    }
}

impl Options {
    fn keeps(&self, mark: &InefficientBlock) -> bool {
        mark.size >= self.mem_size && self.kind.is_none_or(|k| k == mark.kind)
    }
}

/// Streams the dump at `path` (CSV or DB) and returns its marks, ordered by MALLOC row ID and
/// kind, filtered by `options`. Writes nothing.
pub fn check_inefficient(
    path: &Path,
    options: &Options,
) -> Result<Vec<InefficientBlock>, ReadError> {
    let mut analysis = Inefficient::new(options.idle_threshold);
    let mut rows = reader::open_rows(path)?;
    while let Some(row) = rows.next_row()? {
        analysis.feed(row);
    }
    let mut marks = analysis.take_marks();
    marks.retain(|m| options.keeps(m));
    Ok(marks)
}

/// The marks as [`BLOCKS_FILE`]'s text.
pub fn render_csv(marks: &[InefficientBlock]) -> String {
    let mut out = String::with_capacity(BLOCKS_HEADER.len() + 1 + marks.len() * 64);
    out.push_str(BLOCKS_HEADER);
    out.push('\n');
    for m in marks {
        let _ = writeln!(
            out,
            "{},{},{},{},{}",
            m.id,
            format_ptr(m.ptr),
            m.size,
            m.device,
            m.kind.as_str()
        );
    }
    out
}

/// The console summary: per device and kind, how many blocks and how many bytes.
pub fn render_summary(marks: &[InefficientBlock], idle_threshold: u64) -> String {
    let mut out = format!(
        "====== Inefficient memory (op granularity, idle threshold {idle_threshold} ops) ======\n"
    );
    let mut totals: BTreeMap<DeviceId, [(u64, u64); 3]> = BTreeMap::new();
    for m in marks {
        let t = &mut totals.entry(m.device).or_default()[m.kind as usize];
        t.0 += 1;
        t.1 += m.size;
    }
    if totals.is_empty() {
        out.push_str("No inefficient memory found.\n");
    }
    for (device, kinds) in &totals {
        let parts: Vec<String> = InefficientType::ALL
            .iter()
            .zip(kinds)
            .map(|(k, (n, bytes))| {
                let s = if *n == 1 { "" } else { "s" };
                format!("{} {n} block{s} ({bytes} bytes)", k.label())
            })
            .collect();
        let _ = writeln!(out, "Device {device}: {}.", parts.join(", "));
    }
    let _ = writeln!(out, "Blocks: {BLOCKS_FILE} in the run directory");
    out
}

/// The ops (of one device) in which some event of one kind happened: enough to answer "was
/// there one strictly after op `x` and strictly before the current op?".
#[derive(Default)]
struct OpsWith {
    latest: Option<u64>,
    /// The latest op before `latest` that had one.
    before_latest: Option<u64>,
}

impl OpsWith {
    fn record(&mut self, op: u64) {
        if self.latest != Some(op) {
            self.before_latest = self.latest;
            self.latest = Some(op);
        }
    }

    /// The latest op before `current` (ops only grow, so `latest <= current`).
    fn latest_before(&self, current: u64) -> Option<u64> {
        match self.latest {
            Some(op) if op < current => Some(op),
            _ => self.before_latest,
        }
    }

    /// Whether an op strictly between `after` and `current` had one.
    fn between(&self, after: u64, current: u64) -> bool {
        self.latest_before(current).is_some_and(|op| op > after)
    }
}

/// A live block: 40 bytes, the optional values' presence packed into `flags`, since at a few
/// hundred thousand live blocks every lookup is a cache miss and a smaller entry is fewer.
struct Block {
    id: u64,
    size: u64,
    alloc_op: u64,
    last_access: u64,
    flags: u8,
}

impl Block {
    const ACCESSED: u8 = 2;
    const IDLE: u8 = 4;

    fn new(id: u64, size: u64, alloc_op: u64) -> Block {
        Block {
            id,
            size,
            alloc_op,
            last_access: 0,
            flags: 0,
        }
    }

    /// The op of the latest access.
    fn last_access(&self) -> Option<u64> {
        (self.flags & Block::ACCESSED != 0).then_some(self.last_access)
    }

    fn accessed_at(&mut self, op: u64) {
        self.last_access = op;
        self.flags |= Block::ACCESSED;
    }

    /// Whether it has been marked idle (it is marked once).
    fn idle(&self) -> bool {
        self.flags & Block::IDLE != 0
    }

    fn set_idle(&mut self) {
        self.flags |= Block::IDLE;
    }
}

#[derive(Default)]
struct DeviceState {
    /// ATEN_START rows of this device (rows without a device are counted in `shared_ops`).
    ops: u64,
    /// Live blocks (live_blocks' rules). Most accesses name a block's own Ptr and are found
    /// in its hash map; `bases` finds the block an inner pointer falls in.
    blocks: LiveBlocks<Block>,
    bases: BaseIndex,
    frees: OpsWith,
    mallocs: OpsWith,
}

/// The analysis: online it sees every row the writer writes; [`check_inefficient`] feeds it a
/// dump's rows.
pub struct Inefficient {
    idle_threshold: u64,
    shared_ops: u64,
    /// Per device, in the order first seen: a run has a handful, and a short scan beats
    /// hashing the device on every row.
    devices: Vec<(DeviceId, DeviceState)>,
    marks: Vec<InefficientBlock>,
}

impl Inefficient {
    pub fn new(idle_threshold: u64) -> Inefficient {
        Inefficient {
            idle_threshold,
            shared_ops: 0,
            devices: Vec::new(),
            marks: Vec::new(),
        }
    }

    /// The marks so far, ordered by MALLOC row ID and kind.
    pub fn take_marks(&mut self) -> Vec<InefficientBlock> {
        let mut marks = std::mem::take(&mut self.marks);
        // A block has at most one mark of each kind, so no two keys are equal and the unstable
        // sort gives the stable one's order.
        marks.sort_unstable_by_key(|m| (m.id, m.kind));
        marks
    }

    fn on_malloc(&mut self, row: &EventRow, ptr: u64) {
        let (size, allocation_id) = size_and_id(row);
        let shared = self.shared_ops;
        let dev = device_state(&mut self.devices, row.device);
        let op = shared + dev.ops;
        dev.mallocs.record(op);
        let key = BlockKey {
            device: row.device,
            pool: row.event_type,
            ptr,
        };
        let replaced = dev
            .blocks
            .allocate(key, allocation_id, Block::new(row.id, size, op));
        if replaced.is_none() {
            dev.bases.added(ptr, dev.blocks.len());
        }
    }

    fn on_free(&mut self, row: &EventRow, ptr: u64) {
        let (_, allocation_id) = size_and_id(row);
        let shared = self.shared_ops;
        let dev = device_state(&mut self.devices, row.device);
        let op = shared + dev.ops;
        let key = BlockKey {
            device: row.device,
            pool: row.event_type,
            ptr,
        };
        if let Some(block) = dev.blocks.free(key, allocation_id) {
            // The base stays while a block of the other pool lives there.
            if dev
                .blocks
                .key_at_address(row.device, ptr, &TENSOR_POOLS)
                .is_none()
            {
                dev.bases.removed(ptr, dev.blocks.len());
            }
            if let Some(last) = block.last_access() {
                if dev.mallocs.between(last, op) {
                    self.marks.push(mark(
                        &block,
                        ptr,
                        row.device,
                        InefficientType::LateDeallocation,
                    ));
                }
            }
        }
        dev.frees.record(op);
    }

    fn on_access(&mut self, row: &EventRow, ptr: u64) {
        let shared = self.shared_ops;
        let threshold = self.idle_threshold;
        let dev = device_state(&mut self.devices, row.device);
        let op = shared + dev.ops;
        // Most accesses name the block's own Ptr: one lookup finds it. An inner pointer costs
        // a search of the bases and a second lookup.
        let device = row.device;
        let key = match dev.blocks.key_at_address(device, ptr, &TENSOR_POOLS) {
            Some(key) => key,
            None => {
                let blocks = &dev.blocks;
                let live = || blocks.iter().map(|(key, _)| key.ptr).collect::<Vec<u64>>();
                let Some(base) = dev.bases.at_or_below(ptr, live) else {
                    return;
                };
                match dev.blocks.key_at_address(device, base, &TENSOR_POOLS) {
                    Some(key) => key,
                    None => return,
                }
            }
        };
        let base = key.ptr;
        let Some(block) = dev.blocks.get_mut(&key) else {
            return;
        };
        if ptr - base >= block.size.max(1) {
            return;
        }
        let kind = match block.last_access() {
            None if dev.frees.between(block.alloc_op, op) => Some(InefficientType::EarlyAllocation),
            Some(prev) if !block.idle() && op.saturating_sub(prev + 1) > threshold => {
                block.set_idle();
                Some(InefficientType::TemporaryIdleness)
            }
            _ => None,
        };
        block.accessed_at(op);
        if let Some(kind) = kind {
            let m = mark(block, base, row.device, kind);
            self.marks.push(m);
        }
    }
}

fn device_state(devices: &mut Vec<(DeviceId, DeviceState)>, device: DeviceId) -> &mut DeviceState {
    let index = match devices.iter().position(|(d, _)| *d == device) {
        Some(index) => index,
        None => {
            devices.push((device, DeviceState::default()));
            devices.len() - 1
        }
    };
    &mut devices[index].1
}

fn mark(block: &Block, ptr: u64, device: DeviceId, kind: InefficientType) -> InefficientBlock {
    InefficientBlock {
        id: block.id,
        ptr,
        size: block.size,
        device,
        kind,
    }
}

/// The `size` and `allocation_id` attributes, from the parsed Attr or the producer's JSON.
fn size_and_id(row: &EventRow) -> (u64, Option<u64>) {
    (
        row.attr_u64("size").unwrap_or(0),
        row.attr_u64("allocation_id"),
    )
}

/// The pools whose blocks tensors live in, in the order an address is looked up in.
const TENSOR_POOLS: [EventType; 2] = [EventType::Pta, EventType::Host];

fn is_tensor_block(t: EventType) -> bool {
    TENSOR_POOLS.contains(&t)
}

impl Analysis for Inefficient {
    fn name(&self) -> &'static str {
        "inefficient"
    }

    fn feed(&mut self, row: &EventRow) {
        match (row.event, row.ptr) {
            (Event::OpLaunch, _) if row.event_type == EventType::AtenStart => match row.device {
                DeviceId::None => self.shared_ops += 1,
                d => device_state(&mut self.devices, d).ops += 1,
            },
            (Event::Malloc, Some(ptr)) if is_tensor_block(row.event_type) => {
                self.on_malloc(row, ptr)
            }
            (Event::Free, Some(ptr)) if is_tensor_block(row.event_type) => self.on_free(row, ptr),
            (Event::Access, Some(ptr)) => self.on_access(row, ptr),
            _ => {}
        }
    }

    fn finish(&mut self) -> AnalysisOutput {
        let marks = self.take_marks();
        AnalysisOutput {
            console: render_summary(&marks, self.idle_threshold),
            files: vec![(BLOCKS_FILE.to_string(), render_csv(&marks))],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written event stream: `op` starts an op (device N/A), `m`/`f`/`a` are a MALLOC,
    /// FREE and ACCESS of `ptr` on cpu.
    struct Stream {
        rows: Vec<EventRow>,
    }

    impl Stream {
        fn new() -> Stream {
            Stream { rows: Vec::new() }
        }
        fn push(&mut self, mut row: EventRow) -> u64 {
            row.id = self.rows.len() as u64 + 1;
            self.rows.push(row);
            self.rows.len() as u64
        }
        fn op(&mut self) -> &mut Self {
            self.push(EventRow::new(
                Event::OpLaunch,
                EventType::AtenStart,
                "aten::x",
            ));
            self.push(EventRow::new(
                Event::OpLaunch,
                EventType::AtenEnd,
                "aten::x",
            ));
            self
        }
        fn ops(&mut self, n: u64) -> &mut Self {
            for _ in 0..n {
                self.op();
            }
            self
        }
        fn row(event: Event, t: EventType, ptr: u64) -> EventRow {
            let mut r = EventRow::new(event, t, "");
            r.device = DeviceId::Cpu;
            r.ptr = Some(ptr);
            r
        }
        fn m(&mut self, ptr: u64, size: u64) -> u64 {
            let mut r = Self::row(Event::Malloc, EventType::Pta, ptr);
            r.attrs.insert("size".into(), size.into());
            self.push(r)
        }
        fn f(&mut self, ptr: u64) -> &mut Self {
            self.push(Self::row(Event::Free, EventType::Pta, ptr));
            self
        }
        fn a(&mut self, ptr: u64) -> &mut Self {
            self.push(Self::row(Event::Access, EventType::Read, ptr));
            self
        }
        fn run(&self, threshold: u64) -> Vec<(u64, InefficientType)> {
            let mut analysis = Inefficient::new(threshold);
            for r in &self.rows {
                analysis.feed(r);
            }
            analysis
                .take_marks()
                .into_iter()
                .map(|m| (m.id, m.kind))
                .collect()
        }
    }

    use InefficientType::*;

    #[test]
    fn early_allocation_needs_a_free_in_an_op_strictly_between() {
        let mut s = Stream::new();
        s.op();
        let x = s.m(0x100, 64); // op 1
        s.m(0x200, 8);
        s.op().f(0x200); // op 2: another tensor freed
        s.op().a(0x100); // op 3: first access
        assert_eq!(s.run(3000), vec![(x, EarlyAllocation)]);

        // The free in the allocating op or in the first-access op does not count.
        let mut s = Stream::new();
        s.op();
        s.m(0x200, 8);
        s.m(0x300, 8);
        s.m(0x100, 64);
        s.f(0x200); // op 1, after the malloc
        s.op(); // op 2: nothing
        s.op().f(0x300).a(0x100); // op 3: free, then the first access
        assert_eq!(s.run(3000), vec![]);
    }

    #[test]
    fn early_allocation_ignores_frees_of_other_devices_and_unaccessed_blocks() {
        let mut s = Stream::new();
        s.op();
        s.m(0x100, 64);
        s.m(0x400, 64); // never accessed
        let mut other = Stream::row(Event::Free, EventType::Pta, 0x900);
        other.device = DeviceId::Cuda(0);
        s.op();
        s.push(other);
        s.op().a(0x100);
        s.op().f(0x100); // free of a block in op 4 (after x's first access)
        assert_eq!(s.run(3000), vec![]);
    }

    #[test]
    fn late_deallocation_needs_a_malloc_in_an_op_strictly_between() {
        let mut s = Stream::new();
        s.op();
        let x = s.m(0x100, 64);
        s.a(0x100); // op 1: allocated and last accessed
        s.op();
        s.m(0x200, 8); // op 2: another tensor allocated
        s.op().f(0x100); // op 3: freed
        assert_eq!(s.run(3000), vec![(x, LateDeallocation)]);

        // A malloc in the last-access op or in the freeing op does not count; nor an access
        // after the malloc.
        let mut s = Stream::new();
        s.op();
        s.m(0x100, 64);
        s.a(0x100);
        s.m(0x200, 8); // op 1
        s.op();
        s.m(0x300, 8); // op 2
        s.op().a(0x100); // op 3: last access
        s.op();
        s.m(0x400, 8);
        s.f(0x100); // op 4: malloc, then the free
        assert_eq!(s.run(3000), vec![]);
    }

    #[test]
    fn a_block_never_freed_is_not_late() {
        let mut s = Stream::new();
        s.op();
        s.m(0x100, 64);
        s.a(0x100);
        s.op();
        s.m(0x200, 8);
        s.ops(3);
        assert_eq!(s.run(3000), vec![]);
    }

    #[test]
    fn temporary_idleness_counts_ops_strictly_between_consecutive_accesses() {
        let mut s = Stream::new();
        s.op();
        let x = s.m(0x100, 64);
        s.a(0x100); // op 1
        s.a(0x100); // op 1 again: no ops between
        s.ops(4).a(0x100); // op 5: 3 ops between
        assert_eq!(s.run(3), vec![]);
        assert_eq!(s.run(2), vec![(x, TemporaryIdleness)]);

        // Far apart overall, but never more than 2 ops between consecutive accesses.
        let mut s = Stream::new();
        s.op();
        s.m(0x100, 64);
        for _ in 0..5 {
            s.a(0x100).ops(3);
        }
        assert_eq!(s.run(2), vec![]);
        // Marked once however many gaps exceed the threshold.
        assert_eq!(s.run(1).len(), 1);
    }

    #[test]
    fn accesses_inside_a_block_find_it_and_ids_must_agree() {
        let mut s = Stream::new();
        s.op();
        let x = s.m(0x100, 64);
        s.op();
        s.m(0x200, 8);
        s.op().f(0x200);
        s.op().a(0x13f); // the last byte of x
        s.a(0x140); // past x: nothing
        assert_eq!(s.run(3000), vec![(x, EarlyAllocation)]);

        // A FREE whose allocation_id differs from the live block's does not end it.
        let mut s = Stream::new();
        s.op();
        let x = s.m(0x100, 64);
        s.rows
            .last_mut()
            .unwrap()
            .attrs
            .insert("allocation_id".into(), 7.into());
        s.a(0x100);
        s.op();
        s.m(0x200, 8);
        let mut stale = Stream::row(Event::Free, EventType::Pta, 0x100);
        stale.attrs.insert("allocation_id".into(), 6.into());
        s.op();
        s.push(stale);
        assert_eq!(s.run(3000), vec![]);
        let mut ok = Stream::row(Event::Free, EventType::Pta, 0x100);
        ok.attrs.insert("allocation_id".into(), 7.into());
        s.push(ok);
        assert_eq!(s.run(3000), vec![(x, LateDeallocation)]);
    }

    #[test]
    fn ops_count_per_device_and_hal_is_not_a_block() {
        // Ops of cuda:0 do not move cpu's op index.
        let mut s = Stream::new();
        s.op();
        s.m(0x100, 64);
        s.a(0x100);
        for _ in 0..5 {
            let mut op = EventRow::new(Event::OpLaunch, EventType::AtenStart, "k");
            op.device = DeviceId::Cuda(0);
            s.push(op);
        }
        s.op().a(0x100);
        assert_eq!(s.run(1), vec![]);
        let mut s = Stream::new();
        s.op();
        s.push(Stream::row(Event::Malloc, EventType::Hal, 0x100));
        s.a(0x100).ops(5).a(0x100);
        assert_eq!(s.run(1), vec![]);
    }

    #[test]
    fn online_output_and_filters() {
        let mut s = Stream::new();
        s.op();
        let x = s.m(0x100, 64);
        s.m(0x200, 8);
        s.op().f(0x200);
        s.op().a(0x100); // op 3: early
        s.ops(5).a(0x100); // op 8: idle at threshold 2
        s.op();
        s.m(0x300, 16); // op 9
        s.op().f(0x100); // op 10: late
        let mut analysis = Inefficient::new(2);
        for r in &s.rows {
            analysis.feed(r);
        }
        let out = analysis.finish();
        assert_eq!(out.files.len(), 1);
        assert_eq!(out.files[0].0, BLOCKS_FILE);
        assert_eq!(
            out.files[0].1,
            format!(
                "{BLOCKS_HEADER}\n\
                 {x},0x0000000000000100,64,cpu,early_allocation\n\
                 {x},0x0000000000000100,64,cpu,late_deallocation\n\
                 {x},0x0000000000000100,64,cpu,temporary_idleness\n"
            )
        );
        assert!(out.console.contains(
            "Device cpu: early allocation 1 block (64 bytes), late deallocation 1 block (64 bytes), temporary idleness 1 block (64 bytes)."
        ), "{}", out.console);
        let empty = Inefficient::new(3000).finish();
        assert!(empty.console.contains("No inefficient memory found."));

        // The offline filters.
        let dir = std::env::temp_dir().join(format!("msmemscope-ineff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.csv");
        let mut text = format!("{}\n", crate::events::csv::HEADER);
        for r in &s.rows {
            crate::events::csv::write_row(&mut text, r);
        }
        std::fs::write(&path, text).unwrap();
        let kinds = |o: Options| -> Vec<InefficientType> {
            check_inefficient(&path, &o)
                .unwrap()
                .into_iter()
                .map(|m| m.kind)
                .collect()
        };
        let t2 = Options {
            idle_threshold: 2,
            ..Options::default()
        };
        assert_eq!(kinds(t2.clone()), InefficientType::ALL.to_vec());
        assert_eq!(
            kinds(Options::default()),
            vec![EarlyAllocation, LateDeallocation]
        );
        assert_eq!(
            kinds(Options {
                kind: Some(LateDeallocation),
                ..t2.clone()
            }),
            vec![LateDeallocation]
        );
        assert_eq!(kinds(Options { mem_size: 65, ..t2 }), vec![]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
