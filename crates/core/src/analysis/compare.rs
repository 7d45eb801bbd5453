//! `--compare`: the memory of each op (or kernel) of two dumps, aligned by name with Myers'
//! diff (docs/analyses.md#compare). Pure: rows in through [`OpCollector::feed`], CSV text out
//! through [`write_csv`] into any `io::Write`.
//!
//! What an op's memory is:
//! - `--level=op`: the sum of the `size` of the MALLOC rows (any pool) made on the op's thread
//!   between its `OP_LAUNCH ATEN_START` and its `ATEN_END`; nested ops are matched per thread
//!   like brackets, and an allocation counts for every op open at the time (inclusive). The
//!   sequence is in `ATEN_END` order. An `ATEN_END` without a start (tracing began inside
//!   the op) is an op with 0 bytes; a start never ended (the dump stops inside it) is no op.
//! - `--level=kernel`: the sum of the sizes of the MALLOC rows on a device from one
//!   `KERNEL_LAUNCH` on that device up to the next one, whatever the thread.
//!
//! Devices: each device is compared on its own, in the order `N/A`, `cpu`, `0`, `1`, ... A row
//! without a device (the PyTorch tracker's op rows) belongs to every device of its dump, as the
//! writer puts such rows in every device's file; its bytes on device D are the allocations on D
//! (plus those without a device). A dump with no device at all is compared as device `N/A`.
//!
//! Output rows: `Event,Name,Device Id,base bytes,compare bytes,diff` with diff = compare − base.
//! An op only in the compare dump has `N/A` as base bytes and diff = +compare bytes; an op only
//! in the base dump has `N/A` as compare bytes and diff = −base bytes. Within a changed region
//! the base-only rows come first.
//!
//! Memory: one 40-byte record per op plus the interned names; rows are never kept.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write};

use super::fast_map::FastMap;

use super::myers;
use crate::config::Level;
use crate::events::{DeviceId, Event, EventRow, EventType};

/// The first header line of `memory_compare_{ts}.csv`, as the original msMemScope writes it.
pub const HEADER_SIDES: &str = ",,,Base,Compare";
/// The second header line.
pub const HEADER_COLUMNS: &str =
    "Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)";

/// A row the comparison cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    #[error("row ID {id}: MALLOC without a numeric \"size\" in Attr")]
    MallocWithoutSize { id: u64 },
}

/// Bytes allocated by one op, by device. Almost every op allocates on at most one device, so
/// that one is held inline.
#[derive(Clone, Debug)]
struct Alloc {
    device: DeviceId,
    bytes: u64,
    // Boxed: 8 bytes in every op record instead of a Vec's 24; few ops ever need it.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<(DeviceId, u64)>>>,
}

impl Alloc {
    const EMPTY: Alloc = Alloc {
        device: DeviceId::None,
        bytes: 0,
        more: None,
    };

    fn add(&mut self, device: DeviceId, size: u64) {
        if self.device == device || (self.bytes == 0 && self.more.is_none()) {
            self.device = device;
            self.bytes = self.bytes.saturating_add(size);
            return;
        }
        let more = self.more.get_or_insert_with(Box::default);
        match more.iter_mut().find(|(d, _)| *d == device) {
            Some((_, b)) => *b = b.saturating_add(size),
            None => more.push((device, size)),
        }
    }

    /// The bytes that count on `device`: its own, plus those without a device.
    fn on(&self, device: DeviceId) -> u64 {
        let counts = |d: DeviceId| d == device || d == DeviceId::None;
        let mut sum = if counts(self.device) { self.bytes } else { 0 };
        for &(d, b) in self.more.iter().flat_map(|m| m.iter()) {
            if counts(d) {
                sum = sum.saturating_add(b);
            }
        }
        sum
    }
}

#[derive(Clone, Debug)]
struct Op {
    name: u32,
    device: DeviceId,
    alloc: Alloc,
}

/// An op between its start and end.
#[derive(Debug)]
struct Open {
    name: u32,
    device: DeviceId,
    alloc: Alloc,
}

/// Builds one dump's op (or kernel) sequence from its rows.
pub struct OpCollector {
    level: Level,
    names: Vec<Box<str>>,
    index: FastMap<Box<str>, u32>,
    ops: Vec<Op>,
    devices: BTreeSet<DeviceId>,
    /// `--level=op`: the open ops of each thread, innermost last.
    open: FastMap<u64, Vec<Open>>,
    /// `--level=kernel`: the latest kernel on each device, and the latest without a device.
    latest: FastMap<DeviceId, usize>,
    latest_none: Option<usize>,
    rows: u64,
}

impl OpCollector {
    pub fn new(level: Level) -> OpCollector {
        OpCollector {
            level,
            names: Vec::new(),
            index: FastMap::default(),
            ops: Vec::new(),
            devices: BTreeSet::new(),
            open: FastMap::default(),
            latest: FastMap::default(),
            latest_none: None,
            rows: 0,
        }
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.index.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.into());
        self.index.insert(name.into(), id);
        id
    }

    /// One row, in file order.
    pub fn feed(&mut self, row: &EventRow) -> Result<(), CompareError> {
        self.rows += 1;
        if row.device != DeviceId::None && !self.devices.contains(&row.device) {
            self.devices.insert(row.device);
        }
        match (row.event, row.event_type, self.level) {
            (Event::Malloc, _, _) => {
                let size =
                    malloc_size(row).ok_or(CompareError::MallocWithoutSize { id: row.id })?;
                self.on_malloc(row, size);
            }
            (Event::OpLaunch, EventType::AtenStart, Level::Op) => {
                let name = self.intern(&row.name);
                self.open.entry(row.tid).or_default().push(Open {
                    name,
                    device: row.device,
                    alloc: Alloc::EMPTY,
                });
            }
            (Event::OpLaunch, EventType::AtenEnd, Level::Op) => {
                let name = self.intern(&row.name);
                let stack = self.open.entry(row.tid).or_default();
                let op = match stack.iter().rposition(|o| o.name == name) {
                    Some(at) => {
                        // Ops opened inside this one and never ended are dropped; what they
                        // allocated is already in this op's count.
                        stack.truncate(at + 1);
                        // The enclosing ops counted this op's allocations as they happened.
                        let open = stack.pop().expect("rposition found it");
                        Op {
                            name,
                            device: if open.device == DeviceId::None {
                                row.device
                            } else {
                                open.device
                            },
                            alloc: open.alloc,
                        }
                    }
                    None => Op {
                        name,
                        device: row.device,
                        alloc: Alloc::EMPTY,
                    },
                };
                self.ops.push(op);
            }
            (Event::KernelLaunch, EventType::KernelLaunch, Level::Kernel) => {
                let name = self.intern(&row.name);
                let at = self.ops.len();
                self.ops.push(Op {
                    name,
                    device: row.device,
                    alloc: Alloc::EMPTY,
                });
                match row.device {
                    DeviceId::None => self.latest_none = Some(at),
                    d => {
                        self.latest.insert(d, at);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn on_malloc(&mut self, row: &EventRow, size: u64) {
        match self.level {
            Level::Op => {
                if let Some(stack) = self.open.get_mut(&row.tid) {
                    for open in stack.iter_mut() {
                        open.alloc.add(row.device, size);
                    }
                }
            }
            Level::Kernel => {
                let target = match row.device {
                    // Without a device: the latest kernel of any device.
                    DeviceId::None => self.latest.values().copied().chain(self.latest_none).max(),
                    d => self.latest.get(&d).copied().max(self.latest_none),
                };
                if let Some(at) = target {
                    self.ops[at].alloc.add(row.device, size);
                }
            }
        }
    }

    /// The rows fed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The sequence; ops still open are dropped (they never ended).
    pub fn finish(self) -> OpSequence {
        OpSequence {
            level: self.level,
            names: self.names,
            ops: self.ops,
            devices: self.devices,
        }
    }
}

/// The `size` of a MALLOC row's Attr.
fn malloc_size(row: &EventRow) -> Option<u64> {
    row.attr_u64("size")
}

/// One dump's ops in order, ready to compare.
#[derive(Clone, Debug)]
pub struct OpSequence {
    level: Level,
    names: Vec<Box<str>>,
    ops: Vec<Op>,
    devices: BTreeSet<DeviceId>,
}

impl OpSequence {
    /// The number of ops (each counted once, whatever its devices).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The devices this dump is compared on.
    fn groups(&self) -> BTreeSet<DeviceId> {
        if self.devices.is_empty() {
            BTreeSet::from([DeviceId::None])
        } else {
            self.devices.clone()
        }
    }

    /// The ops that belong to `device`, as indices into `ops`.
    fn on(&self, device: DeviceId) -> Vec<u32> {
        if !self.groups().contains(&device) {
            return Vec::new();
        }
        (0..self.ops.len() as u32)
            .filter(|&i| {
                let d = self.ops[i as usize].device;
                d == device || d == DeviceId::None
            })
            .collect()
    }
}

/// Counts of what [`write_csv`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompareSummary {
    pub rows: u64,
    pub matched: u64,
    pub base_only: u64,
    pub compare_only: u64,
}

/// Aligns `base` and `compare` device by device and writes the two header lines and one row
/// per aligned op.
pub fn write_csv(
    base: &OpSequence,
    compare: &OpSequence,
    out: &mut impl Write,
) -> io::Result<CompareSummary> {
    let event = match base.level {
        Level::Op => Event::OpLaunch,
        Level::Kernel => Event::KernelLaunch,
    }
    .as_str();
    writeln!(out, "{HEADER_SIDES}")?;
    writeln!(out, "{HEADER_COLUMNS}")?;
    // Compare's names in base's numbering (names only in compare get numbers past base's).
    let mut lookup: HashMap<&str, u32> = base
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| (&**n, i as u32))
        .collect();
    let mut next = base.names.len() as u32;
    let remap: Vec<u32> = compare
        .names
        .iter()
        .map(|n| {
            *lookup.entry(&**n).or_insert_with(|| {
                next += 1;
                next - 1
            })
        })
        .collect();

    let mut summary = CompareSummary::default();
    let mut line = String::new();
    let devices: BTreeSet<DeviceId> = base.groups().union(&compare.groups()).copied().collect();
    for device in devices {
        let base_ops = base.on(device);
        let compare_ops = compare.on(device);
        let a: Vec<u32> = base_ops
            .iter()
            .map(|&i| base.ops[i as usize].name)
            .collect();
        let b: Vec<u32> = compare_ops
            .iter()
            .map(|&i| remap[compare.ops[i as usize].name as usize])
            .collect();
        let script = myers::diff(&a, &b);
        drop((a, b));
        let device_text = device.to_string();
        for edit in script.edits() {
            let (name, base_bytes, compare_bytes) = match edit {
                myers::Edit::Equal {
                    base: i,
                    compare: j,
                } => {
                    summary.matched += 1;
                    let op = &base.ops[base_ops[i] as usize];
                    let other = &compare.ops[compare_ops[j] as usize];
                    (
                        &*base.names[op.name as usize],
                        Some(op.alloc.on(device)),
                        Some(other.alloc.on(device)),
                    )
                }
                myers::Edit::Delete { base: i } => {
                    summary.base_only += 1;
                    let op = &base.ops[base_ops[i] as usize];
                    (
                        &*base.names[op.name as usize],
                        Some(op.alloc.on(device)),
                        None,
                    )
                }
                myers::Edit::Insert { compare: j } => {
                    summary.compare_only += 1;
                    let op = &compare.ops[compare_ops[j] as usize];
                    (
                        &*compare.names[op.name as usize],
                        None,
                        Some(op.alloc.on(device)),
                    )
                }
            };
            line.clear();
            line.push_str(event);
            line.push(',');
            crate::events::csv::push_field(&mut line, if name.is_empty() { "N/A" } else { name });
            line.push(',');
            crate::events::csv::push_field(&mut line, &device_text);
            line.push(',');
            let diff = compare_bytes.unwrap_or(0) as i128 - base_bytes.unwrap_or(0) as i128;
            for side in [base_bytes, compare_bytes] {
                match side {
                    Some(v) => line.push_str(itoa::Buffer::new().format(v)),
                    None => line.push_str("N/A"),
                }
                line.push(',');
            }
            line.push_str(itoa::Buffer::new().format(diff));
            line.push('\n');
            out.write_all(line.as_bytes())?;
            summary.rows += 1;
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dump {
        rows: Vec<EventRow>,
    }

    impl Dump {
        fn new() -> Dump {
            Dump { rows: Vec::new() }
        }
        fn push(&mut self, mut row: EventRow) -> &mut Self {
            row.id = self.rows.len() as u64 + 1;
            row.ts_ns = row.id * 10;
            self.rows.push(row);
            self
        }
        fn op(&mut self, name: &str, mallocs: &[u64]) -> &mut Self {
            self.push(EventRow::new(Event::OpLaunch, EventType::AtenStart, name));
            for &size in mallocs {
                self.malloc(DeviceId::Cpu, size, 0);
            }
            self.push(EventRow::new(Event::OpLaunch, EventType::AtenEnd, name))
        }
        fn malloc(&mut self, device: DeviceId, size: u64, tid: u64) -> &mut Self {
            let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
            row.device = device;
            row.tid = tid;
            row.attrs.insert("size".into(), size.into());
            self.push(row)
        }
        fn kernel(&mut self, name: &str, device: DeviceId) -> &mut Self {
            let mut row = EventRow::new(Event::KernelLaunch, EventType::KernelLaunch, name);
            row.device = device;
            self.push(row)
        }
        fn sequence(&self, level: Level) -> OpSequence {
            let mut c = OpCollector::new(level);
            for row in &self.rows {
                c.feed(row).unwrap();
            }
            c.finish()
        }
    }

    fn csv(base: &Dump, compare: &Dump, level: Level) -> Vec<String> {
        let mut out = Vec::new();
        write_csv(&base.sequence(level), &compare.sequence(level), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        assert_eq!(lines.remove(0), HEADER_SIDES);
        assert_eq!(lines.remove(0), HEADER_COLUMNS);
        lines
    }

    #[test]
    fn added_op_and_doubled_allocation() {
        let mut base = Dump::new();
        base.op("aten::linear", &[400])
            .op("aten::relu", &[100])
            .op("aten::sum", &[4]);
        let mut compare = Dump::new();
        compare
            .op("aten::linear", &[800])
            .op("aten::relu", &[100])
            .op("aten::dropout", &[100, 25])
            .op("aten::sum", &[4]);
        assert_eq!(
            csv(&base, &compare, Level::Op),
            [
                "OP_LAUNCH,aten::linear,cpu,400,800,400",
                "OP_LAUNCH,aten::relu,cpu,100,100,0",
                "OP_LAUNCH,aten::dropout,cpu,N/A,125,125",
                "OP_LAUNCH,aten::sum,cpu,4,4,0",
            ]
        );
        // The other way round the dropout is base-only, with a negative diff.
        assert_eq!(
            csv(&compare, &base, Level::Op)[2],
            "OP_LAUNCH,aten::dropout,cpu,125,N/A,-125"
        );
    }

    #[test]
    fn nested_ops_count_inclusively_and_end_in_order() {
        let mut d = Dump::new();
        d.push(EventRow::new(
            Event::OpLaunch,
            EventType::AtenStart,
            "outer",
        ))
        .malloc(DeviceId::Cpu, 1, 0)
        .op("inner", &[10])
        // Another thread's allocation is not the op's.
        .malloc(DeviceId::Cpu, 1000, 7)
        .push(EventRow::new(Event::OpLaunch, EventType::AtenEnd, "outer"))
        // An end without a start, and a start without an end.
        .push(EventRow::new(Event::OpLaunch, EventType::AtenEnd, "orphan"))
        .push(EventRow::new(Event::OpLaunch, EventType::AtenStart, "cut"))
        .malloc(DeviceId::Cpu, 5, 0);
        assert_eq!(
            csv(&d, &d, Level::Op),
            [
                "OP_LAUNCH,inner,cpu,10,10,0",
                "OP_LAUNCH,outer,cpu,11,11,0",
                "OP_LAUNCH,orphan,cpu,0,0,0",
            ]
        );
    }

    #[test]
    fn kernels_per_device() {
        let mut d = Dump::new();
        d.kernel("k1", DeviceId::Cuda(0))
            .malloc(DeviceId::Cuda(0), 64, 0)
            .kernel("k1", DeviceId::Cuda(1))
            .malloc(DeviceId::Cuda(1), 8, 0)
            .malloc(DeviceId::Cuda(0), 32, 0)
            .kernel("k2, with a comma", DeviceId::Cuda(0))
            .malloc(DeviceId::Cuda(0), 16, 0);
        let mut e = Dump::new();
        e.kernel("k1", DeviceId::Cuda(0))
            .malloc(DeviceId::Cuda(0), 64, 0)
            .kernel("k2, with a comma", DeviceId::Cuda(0));
        assert_eq!(
            csv(&d, &e, Level::Kernel),
            [
                "KERNEL_LAUNCH,k1,0,96,64,-32",
                "KERNEL_LAUNCH,\"k2, with a comma\",0,16,0,-16",
                "KERNEL_LAUNCH,k1,1,8,N/A,-8",
            ]
        );
    }

    #[test]
    fn device_less_ops_belong_to_every_device_of_their_dump() {
        let mut d = Dump::new();
        d.push(EventRow::new(Event::OpLaunch, EventType::AtenStart, "to"))
            .malloc(DeviceId::Cpu, 3, 0)
            .malloc(DeviceId::Cuda(0), 7, 0)
            .push(EventRow::new(Event::OpLaunch, EventType::AtenEnd, "to"));
        assert_eq!(
            csv(&d, &d, Level::Op),
            ["OP_LAUNCH,to,cpu,3,3,0", "OP_LAUNCH,to,0,7,7,0"]
        );
        // Without any device the dump is compared as N/A; op rows are ignored at kernel level.
        let mut n = Dump::new();
        n.op("x", &[]);
        assert_eq!(csv(&n, &n, Level::Op), ["OP_LAUNCH,x,N/A,0,0,0"]);
        assert!(csv(&n, &n, Level::Kernel).is_empty());
    }

    #[test]
    fn malloc_without_size_is_an_error() {
        let mut c = OpCollector::new(Level::Op);
        let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
        row.id = 42;
        assert_eq!(
            c.feed(&row).unwrap_err().to_string(),
            "row ID 42: MALLOC without a numeric \"size\" in Attr"
        );
        row.attrs_json = Some("{\"size\":9}".into());
        assert!(c.feed(&row).is_ok());
    }
}
