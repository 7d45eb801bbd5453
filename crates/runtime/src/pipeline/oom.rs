//! The OOM analysis (`--analysis=oom[:K]`): the pipeline keeps an index of live blocks, and when
//! an allocation fails (an OOM_TRIGGER row: a tensor allocation the tracker saw fail, or a
//! `malloc` of the program that returned NULL) it writes, right after the trigger, the K most
//! recent and the K largest live blocks of that device with their stacks (OOM_RECENT_ALLOC,
//! OOM_TOP_ALLOC) and a SNAPSHOT row of the device's totals. At most one such dump per 2 s;
//! later triggers inside that interval are written alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use msmemscope_core::events::row::format_ptr;
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

const DUMP_INTERVAL_NS: u64 = 2_000_000_000;
/// Failed `malloc` requests at least this large are reported at once; smaller ones mean the
/// process is truly out of memory, where building rows could fail too: they are only counted.
pub const REPORTED_MALLOC_FAILURE: usize = 1 << 20;

#[derive(Clone)]
struct Live {
    size: u64,
    ts_ns: u64,
    pool: &'static str,
    python_stack: String,
    c_stack: String,
    /// The MALLOC's C return addresses (they travel beside the row, symbolized by the writer).
    c_frames: Vec<u64>,
}

pub struct OomWatch {
    k: usize,
    live: HashMap<(DeviceId, u64), Live>,
    last_dump_ns: u64,
}

/// Failed small `malloc` calls, counted from the hook (no allocation there).
pub static SMALL_MALLOC_FAILURES: AtomicU64 = AtomicU64::new(0);

impl OomWatch {
    pub fn new(k: u32) -> OomWatch {
        OomWatch {
            k: k.max(1) as usize,
            live: HashMap::new(),
            last_dump_ns: 0,
        }
    }

    /// Follows MALLOC/FREE rows (with the C frames captured for them); returns the rows to
    /// write after an OOM_TRIGGER, each with its block's frames.
    pub fn observe(&mut self, row: &EventRow, c_frames: &[u64]) -> Vec<(EventRow, Vec<u64>)> {
        match (row.event, row.ptr) {
            (Event::Malloc, Some(ptr)) => {
                let size = row
                    .attr_u64("size")
                    .or_else(|| size_from_raw(row))
                    .unwrap_or(0);
                self.live.insert(
                    (row.device, ptr),
                    Live {
                        size,
                        ts_ns: row.ts_ns,
                        pool: row.event_type.as_str(),
                        python_stack: row.python_stack.clone(),
                        c_stack: row.c_stack.clone(),
                        c_frames: c_frames.to_vec(),
                    },
                );
                Vec::new()
            }
            (Event::Free, Some(ptr)) => {
                self.live.remove(&(row.device, ptr));
                Vec::new()
            }
            (Event::OomDetail, _) if row.event_type == EventType::OomTrigger => {
                if self.last_dump_ns != 0
                    && row.ts_ns.saturating_sub(self.last_dump_ns) < DUMP_INTERVAL_NS
                {
                    return Vec::new();
                }
                self.last_dump_ns = row.ts_ns.max(1);
                self.dump(row)
            }
            _ => Vec::new(),
        }
    }

    fn dump(&self, trigger: &EventRow) -> Vec<(EventRow, Vec<u64>)> {
        let device = trigger.device;
        let mut blocks: Vec<(&(DeviceId, u64), &Live)> = self
            .live
            .iter()
            .filter(|((d, _), _)| device == DeviceId::None || *d == device)
            .collect();
        let mut rows = Vec::new();
        blocks.sort_by(|a, b| b.1.ts_ns.cmp(&a.1.ts_ns).then(a.0 .1.cmp(&b.0 .1)));
        for (key, live) in blocks.iter().take(self.k) {
            rows.push((
                detail(EventType::OomRecentAlloc, key, live, trigger),
                live.c_frames.clone(),
            ));
        }
        blocks.sort_by(|a, b| b.1.size.cmp(&a.1.size).then(a.0 .1.cmp(&b.0 .1)));
        for (key, live) in blocks.iter().take(self.k) {
            rows.push((
                detail(EventType::OomTopAlloc, key, live, trigger),
                live.c_frames.clone(),
            ));
        }
        let allocated: u64 = blocks.iter().map(|(_, l)| l.size).sum();
        let mut snapshot = EventRow::new(Event::Snapshot, EventType::Snapshot, "oom");
        snapshot.device = device;
        snapshot.ts_ns = trigger.ts_ns;
        snapshot.attrs.insert("allocated".into(), allocated.into());
        snapshot
            .attrs
            .insert("live_blocks".into(), (blocks.len() as u64).into());
        let (total, free) = host_memory();
        snapshot.attrs.insert("total".into(), total.into());
        snapshot.attrs.insert("free".into(), free.into());
        rows.push((snapshot, Vec::new()));
        rows
    }
}

fn detail(kind: EventType, key: &(DeviceId, u64), live: &Live, trigger: &EventRow) -> EventRow {
    let mut row = EventRow::new(Event::OomDetail, kind, "");
    row.device = key.0;
    row.ptr = Some(key.1);
    row.ts_ns = trigger.ts_ns;
    row.attrs.insert("pool".into(), live.pool.into());
    row.attrs.insert("ptr".into(), format_ptr(key.1).into());
    row.attrs.insert("size".into(), live.size.into());
    row.attrs.insert("timestamp".into(), live.ts_ns.into());
    row.python_stack = live.python_stack.clone();
    row.c_stack = live.c_stack.clone();
    row
}

/// `size` from a producer's pre-rendered Attr text.
fn size_from_raw(row: &EventRow) -> Option<u64> {
    let raw = row.attrs_json.as_deref()?;
    let value: serde_json::Value = serde_json::from_str(raw).ok()?;
    value.get("size")?.as_u64()
}

/// MemTotal and MemAvailable in bytes, from /proc/meminfo.
fn host_memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The trigger row of a failed `malloc` the program made.
pub fn malloc_failure_row(function: &str, size: usize) -> EventRow {
    let mut row = EventRow::new(Event::OomDetail, EventType::OomTrigger, "");
    row.device = DeviceId::Cpu;
    row.attrs.insert("func".into(), function.into());
    row.attrs.insert("req_size".into(), (size as u64).into());
    row.attrs
        .insert("error".into(), "malloc returned NULL (ENOMEM)".into());
    row
}

/// Whether the OOM analysis watches this run (read on the hook path).
pub fn watching() -> bool {
    super::OOM_ACTIVE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn malloc(ptr: u64, size: u64, ts: u64) -> EventRow {
        let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
        row.device = DeviceId::Cpu;
        row.ptr = Some(ptr);
        row.ts_ns = ts;
        row.attrs_json = Some(format!("{{\"size\":{size}}}"));
        row
    }

    #[test]
    fn dumps_recent_and_largest_once_per_interval() {
        let mut watch = OomWatch::new(2);
        for (i, size) in [100u64, 5000, 300, 4000].iter().enumerate() {
            assert!(watch
                .observe(
                    &malloc(0x1000 * (i as u64 + 1), *size, 10 + i as u64),
                    &[0xa000 + i as u64]
                )
                .is_empty());
        }
        let mut free = EventRow::new(Event::Free, EventType::Pta, "");
        free.device = DeviceId::Cpu;
        free.ptr = Some(0x4000);
        watch.observe(&free, &[]);
        let mut trigger = malloc_failure_row("aten::empty.memory_format", 1 << 40);
        trigger.ts_ns = 100;
        let rows = watch.observe(&trigger, &[]);
        let kinds: Vec<(EventType, Option<u64>)> =
            rows.iter().map(|(r, _)| (r.event_type, r.ptr)).collect();
        assert_eq!(
            kinds,
            vec![
                (EventType::OomRecentAlloc, Some(0x3000)),
                (EventType::OomRecentAlloc, Some(0x2000)),
                (EventType::OomTopAlloc, Some(0x2000)),
                (EventType::OomTopAlloc, Some(0x3000)),
                (EventType::Snapshot, None),
            ]
        );
        // Each block's detail rows carry the C frames captured at its MALLOC.
        assert_eq!(rows[0].1, vec![0xa002]);
        assert_eq!(rows[2].1, vec![0xa001]);
        assert!(rows[4].1.is_empty());
        assert_eq!(rows[4].0.attr_u64("allocated"), Some(5400));
        assert_eq!(rows[2].0.attr_u64("size"), Some(5000));
        // Within 2 s: the trigger alone.
        trigger.ts_ns = 100 + DUMP_INTERVAL_NS - 1;
        assert!(watch.observe(&trigger, &[]).is_empty());
        trigger.ts_ns = 100 + DUMP_INTERVAL_NS;
        assert_eq!(watch.observe(&trigger, &[]).len(), 5);
    }
}
