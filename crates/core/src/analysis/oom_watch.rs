//! The OOM watch (`--analysis=oom[:K]`): it follows the live blocks, and when an allocation
//! fails (an OOM_TRIGGER row: a tensor allocation the tracker saw fail, or a `malloc` of the
//! program that returned NULL) it gives the rows to write right after the trigger: the K most
//! recent and the K largest live blocks of that device with their stacks (OOM_RECENT_ALLOC,
//! OOM_TOP_ALLOC) and a SNAPSHOT row of the device's totals. At most one such dump per 2 s;
//! later triggers inside that interval are written alone. Online the runtime's pipeline feeds
//! it each row as it is emitted (with the C frames captured for it); offline any dump's rows
//! can be fed (without frames).

use super::live_blocks::{BlockKey, LiveBlocks};
use crate::events::row::format_ptr;
use crate::events::{DeviceId, Event, EventRow, EventType};

pub const DUMP_INTERVAL_NS: u64 = 2_000_000_000;

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
    live: LiveBlocks<Live>,
    last_dump_ns: u64,
    /// The host's total and available memory for the SNAPSHOT row (online: read from the
    /// system; offline there is none to read).
    host_memory: Option<fn() -> (u64, u64)>,
}

impl OomWatch {
    pub fn new(k: u32) -> OomWatch {
        OomWatch {
            k: k.max(1) as usize,
            live: LiveBlocks::new(),
            last_dump_ns: 0,
            host_memory: None,
        }
    }

    /// With the SNAPSHOT row's `total` and `free` read by `read`.
    pub fn with_host_memory(mut self, read: fn() -> (u64, u64)) -> OomWatch {
        self.host_memory = Some(read);
        self
    }

    /// Follows MALLOC/FREE rows (with the C frames captured for them); returns the rows to
    /// write after an OOM_TRIGGER, each with its block's frames.
    pub fn observe(&mut self, row: &EventRow, c_frames: &[u64]) -> Vec<(EventRow, Vec<u64>)> {
        match (row.event, row.ptr) {
            (Event::Malloc | Event::Free, Some(_)) => {
                self.live.apply(row, || Live {
                    size: row
                        .attr_u64("size")
                        .or_else(|| size_from_raw(row))
                        .unwrap_or(0),
                    ts_ns: row.ts_ns,
                    pool: row.event_type.as_str(),
                    python_stack: row.python_stack.clone(),
                    c_stack: row.c_stack.clone(),
                    c_frames: c_frames.to_vec(),
                });
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
        let mut blocks: Vec<(BlockKey, &Live)> = self
            .live
            .iter()
            .filter(|(key, _)| device == DeviceId::None || key.device == device)
            .collect();
        let mut rows = Vec::new();
        blocks.sort_by(|a, b| b.1.ts_ns.cmp(&a.1.ts_ns).then(a.0.ptr.cmp(&b.0.ptr)));
        for (key, live) in blocks.iter().take(self.k) {
            rows.push((
                detail(EventType::OomRecentAlloc, key, live, trigger),
                live.c_frames.clone(),
            ));
        }
        blocks.sort_by(|a, b| b.1.size.cmp(&a.1.size).then(a.0.ptr.cmp(&b.0.ptr)));
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
        if let Some(read) = self.host_memory {
            let (total, free) = read();
            snapshot.attrs.insert("total".into(), total.into());
            snapshot.attrs.insert("free".into(), free.into());
        }
        rows.push((snapshot, Vec::new()));
        rows
    }
}

fn detail(kind: EventType, key: &BlockKey, live: &Live, trigger: &EventRow) -> EventRow {
    let mut row = EventRow::new(Event::OomDetail, kind, "");
    row.device = key.device;
    row.ptr = Some(key.ptr);
    row.ts_ns = trigger.ts_ns;
    row.attrs.insert("pool".into(), live.pool.into());
    row.attrs.insert("ptr".into(), format_ptr(key.ptr).into());
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
        let mut watch = OomWatch::new(2).with_host_memory(|| (8 << 30, 1 << 30));
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
        let mut trigger = EventRow::new(Event::OomDetail, EventType::OomTrigger, "");
        trigger.device = DeviceId::Cpu;
        trigger.attrs_json = Some(format!(
            "{{\"func\":\"aten::empty.memory_format\",\"req_size\":{}}}",
            1u64 << 40
        ));
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
        assert_eq!(rows[4].0.attr_u64("total"), Some(8 << 30));
        assert_eq!(rows[4].0.attr_u64("free"), Some(1 << 30));
        assert_eq!(rows[2].0.attr_u64("size"), Some(5000));
        // Within 2 s: the trigger alone.
        trigger.ts_ns = 100 + DUMP_INTERVAL_NS - 1;
        assert!(watch.observe(&trigger, &[]).is_empty());
        trigger.ts_ns = 100 + DUMP_INTERVAL_NS;
        assert_eq!(watch.observe(&trigger, &[]).len(), 5);
    }

    /// A PTA block carved at the start of a HAL segment is another block; offline (no host
    /// memory reader) the SNAPSHOT row has no `total`/`free`.
    #[test]
    fn blocks_of_two_pools_at_one_address() {
        let mut watch = OomWatch::new(4);
        let mut hal = malloc(0x1000, 8192, 1);
        hal.event_type = EventType::Hal;
        watch.observe(&hal, &[]);
        watch.observe(&malloc(0x1000, 512, 2), &[]);
        let mut free = EventRow::new(Event::Free, EventType::Pta, "");
        free.device = DeviceId::Cpu;
        free.ptr = Some(0x1000);
        watch.observe(&free, &[]);
        let mut trigger = EventRow::new(Event::OomDetail, EventType::OomTrigger, "");
        trigger.device = DeviceId::Cpu;
        trigger.ts_ns = 10;
        let rows = watch.observe(&trigger, &[]);
        let top: Vec<(Option<String>, Option<u64>)> = rows
            .iter()
            .filter(|(r, _)| r.event_type == EventType::OomTopAlloc)
            .map(|(r, _)| (r.attr_str("pool").map(str::to_string), r.attr_u64("size")))
            .collect();
        assert_eq!(top, vec![(Some("HAL".to_string()), Some(8192))]);
        let snapshot = &rows.last().unwrap().0;
        assert_eq!(snapshot.attr_u64("allocated"), Some(8192));
        assert_eq!(snapshot.attr_u64("total"), None);
    }
}
