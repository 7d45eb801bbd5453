//! One dump file's memory over time, reduced to a few thousand time buckets in one streaming
//! pass, so a 10-million-row dump becomes a page of a few hundred kilobytes.
//!
//! Allocated bytes are the sum of the live blocks' sizes (the analyses' live-block rules: a
//! MALLOC adds a block keyed by device, pool and Ptr, the FREE with the same key removes it). Each bucket keeps the minimum and maximum of
//! that sum within it, so the page's peak is the dump's peak exactly whatever the zoom; the
//! bytes by owner are taken at the moment the bucket's maximum was reached, so the stacked
//! areas add up to the maximum line. Reserved bytes are the largest `total` Attr in the bucket.
//!
//! Buckets start 1 µs wide; when they outgrow [`MAX_BUCKETS`] neighbours merge pairwise and the
//! width doubles (min/max/owners-at-max merge exactly), so one pass needs no end time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use msmemscope_core::analysis::live_blocks::{is_pool, BlockKey, LiveBlocks};
use msmemscope_core::events::{Event, EventRow, EventType};
use serde_json::{json, Value};

/// The most buckets a timeline holds; merging halves them to `MAX_BUCKETS / 2`.
pub const MAX_BUCKETS: usize = 4096;
/// Owners beyond this many (by first appearance) are summed as `other`.
pub const MAX_OWNERS: usize = 24;
/// Marks and step lines kept for the page (the first ones; the rest are counted).
pub const MAX_MARKS: usize = 5000;
const FIRST_WIDTH_NS: u64 = 1000;
const OTHER_OWNER: &str = "other";

/// A multiply-rotate hasher for the maps every row touches (pointers, thread ids, owner
/// names): the keys come from the dump, not from an adversary, and SipHash's cost shows at
/// ten million rows.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Whole words read as they are and the tail gathered byte by byte: copying each piece
        // into a padded word was a `memcpy` call per word, on every op row.
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.write_u64(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        let tail = words.remainder();
        if !tail.is_empty() {
            let word = tail
                .iter()
                .enumerate()
                .fold(0u64, |word, (i, &b)| word | u64::from(b) << (8 * i));
            self.write_u64(word);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        // The product's low bits depend only on the input's low bits, and pointers share
        // theirs (aligned blocks): fold the high bits down (MurmurHash3's finalizer).
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^ (x >> 33)
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// The largest allocation of a bucket, shown on hover.
#[derive(Clone, Debug, Default)]
struct Largest {
    size: u64,
    op: u32,
    /// Made inside `op` (else after it: the thread's last op had ended).
    inside: bool,
    owner: u16,
    ts_ns: u64,
}

/// A thread's ops: those open (innermost last) and the last one that ended.
#[derive(Default)]
struct ThreadOps {
    open: Vec<u32>,
    last: u32,
}

#[derive(Clone, Debug)]
struct Bucket {
    min: u64,
    max: u64,
    max_ts_ns: u64,
    /// Bytes per owner when `max` was reached.
    owners_at_max: Vec<u64>,
    reserved: Option<u64>,
    largest: Option<Largest>,
    mallocs: u32,
    frees: u32,
}

impl Bucket {
    fn new(level: u64, ts: u64, owners: &[u64]) -> Bucket {
        Bucket {
            min: level,
            max: level,
            max_ts_ns: ts,
            owners_at_max: owners.to_vec(),
            reserved: None,
            largest: None,
            mallocs: 0,
            frees: 0,
        }
    }

    fn merge(&mut self, other: Bucket) {
        self.min = self.min.min(other.min);
        if other.max > self.max {
            self.max = other.max;
            self.max_ts_ns = other.max_ts_ns;
            self.owners_at_max = other.owners_at_max;
        }
        self.reserved = match (self.reserved, other.reserved) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if other.largest.as_ref().map(|l| l.size) > self.largest.as_ref().map(|l| l.size) {
            self.largest = other.largest;
        }
        self.mallocs += other.mallocs;
        self.frees += other.frees;
    }
}

#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    size: u64,
    owner: u16,
}

/// Builds one dump file's timeline from its rows, in file order.
pub struct Timeline {
    t0: Option<u64>,
    width_ns: u64,
    buckets: Vec<Bucket>,
    live: LiveBlocks<LiveBlock>,
    allocated: u64,
    owners: Vec<String>,
    owner_index: FastMap<String, u16>,
    owner_bytes: Vec<u64>,
    peak: u64,
    peak_ts_ns: u64,
    /// Each thread's ops, for the hover text of allocations.
    ops: FastMap<u64, ThreadOps>,
    op_names: Vec<String>,
    op_index: FastMap<String, u32>,
    steps: Vec<(u64, String)>,
    marks: Vec<(u64, String, String)>,
    dropped_marks: u64,
    rows: u64,
    mallocs: u64,
    frees: u64,
    unmatched_frees: u64,
    last_ts: u64,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new()
    }
}

impl Timeline {
    pub fn new() -> Timeline {
        let mut timeline = Timeline {
            t0: None,
            width_ns: FIRST_WIDTH_NS,
            buckets: Vec::new(),
            live: LiveBlocks::new(),
            allocated: 0,
            owners: Vec::new(),
            owner_index: FastMap::default(),
            owner_bytes: Vec::new(),
            peak: 0,
            peak_ts_ns: 0,
            ops: FastMap::default(),
            op_names: vec![String::new()],
            op_index: FastMap::default(),
            steps: Vec::new(),
            marks: Vec::new(),
            dropped_marks: 0,
            rows: 0,
            mallocs: 0,
            frees: 0,
            unmatched_frees: 0,
            last_ts: 0,
        };
        timeline.op_index.insert(String::new(), 0);
        timeline
    }

    fn owner_id(&mut self, owner: &str) -> u16 {
        if let Some(&id) = self.owner_index.get(owner) {
            return id;
        }
        let name = if self.owners.len() + 1 >= MAX_OWNERS {
            OTHER_OWNER
        } else {
            owner
        };
        let id = match self.owner_index.get(name) {
            Some(&id) => id,
            None => {
                self.owners.push(name.to_owned());
                self.owner_bytes.push(0);
                for bucket in &mut self.buckets {
                    bucket.owners_at_max.push(0);
                }
                (self.owners.len() - 1) as u16
            }
        };
        self.owner_index.insert(owner.to_owned(), id);
        id
    }

    fn op_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.op_index.get(name) {
            return id;
        }
        let id = self.op_names.len() as u32;
        self.op_names.push(name.to_owned());
        self.op_index.insert(name.to_owned(), id);
        id
    }

    /// The index of the bucket `ts` falls in, merging buckets until it fits.
    fn bucket(&mut self, ts: u64) -> usize {
        let t0 = *self.t0.get_or_insert(ts);
        // Rows are in time order; a stray earlier stamp joins the current bucket.
        let ts = ts.max(self.last_ts).max(t0);
        self.last_ts = ts;
        let mut index = ((ts - t0) / self.width_ns) as usize;
        while index >= MAX_BUCKETS {
            self.halve();
            index = ((ts - t0) / self.width_ns) as usize;
        }
        while self.buckets.len() <= index {
            let bucket = Bucket::new(self.allocated, ts, &self.owner_bytes);
            self.buckets.push(bucket);
        }
        index
    }

    fn halve(&mut self) {
        let old = std::mem::take(&mut self.buckets);
        let mut merged = Vec::with_capacity(old.len() / 2 + 1);
        let mut iter = old.into_iter();
        while let Some(mut first) = iter.next() {
            if let Some(second) = iter.next() {
                first.merge(second);
            }
            merged.push(first);
        }
        self.buckets = merged;
        self.width_ns *= 2;
    }

    /// Records the current level in the bucket of `ts`; returns the bucket's index.
    fn level_changed(&mut self, ts: u64) -> usize {
        let level = self.allocated;
        if level > self.peak {
            self.peak = level;
            self.peak_ts_ns = ts;
        }
        let index = self.bucket(ts);
        let bucket = &mut self.buckets[index];
        bucket.min = bucket.min.min(level);
        if level > bucket.max {
            bucket.max = level;
            bucket.max_ts_ns = ts;
            bucket.owners_at_max.clear();
            bucket.owners_at_max.extend_from_slice(&self.owner_bytes);
        }
        index
    }

    pub fn feed(&mut self, row: &EventRow) {
        self.rows += 1;
        match (row.event, row.event_type) {
            (Event::Malloc, pool) if is_pool(pool) => {
                let Some(ptr) = row.ptr else { return };
                let size = row.attr_u64("size").unwrap_or(0);
                let owner = self.owner_id(row.attr_str("owner").unwrap_or(pool.as_str()));
                let key = BlockKey {
                    device: row.device,
                    pool,
                    ptr,
                };
                let block = LiveBlock { size, owner };
                let allocation_id = row.attr_u64("allocation_id");
                if let Some(old) = self.live.allocate(key, allocation_id, block) {
                    // A MALLOC over a live block: the dump missed its FREE; replace it.
                    self.allocated -= old.size;
                    self.owner_bytes[old.owner as usize] -= old.size;
                }
                self.allocated += size;
                self.owner_bytes[owner as usize] += size;
                self.mallocs += 1;
                let (op, inside) = match self.ops.get(&row.tid) {
                    Some(t) => t.open.last().map_or((t.last, false), |&op| (op, true)),
                    None => (0, false),
                };
                let reserved = row.attr_u64("total");
                let index = self.level_changed(row.ts_ns);
                let bucket = &mut self.buckets[index];
                bucket.mallocs += 1;
                if let Some(total) = reserved {
                    bucket.reserved = Some(bucket.reserved.map_or(total, |r| r.max(total)));
                }
                if bucket.largest.as_ref().is_none_or(|l| size > l.size) {
                    bucket.largest = Some(Largest {
                        size,
                        op,
                        inside,
                        owner,
                        ts_ns: row.ts_ns,
                    });
                }
            }
            (Event::Free, pool) if is_pool(pool) => {
                let Some(ptr) = row.ptr else { return };
                self.frees += 1;
                let reserved = row.attr_u64("total");
                let key = BlockKey {
                    device: row.device,
                    pool,
                    ptr,
                };
                match self.live.free(key, row.attr_u64("allocation_id")) {
                    Some(block) => {
                        self.allocated -= block.size;
                        self.owner_bytes[block.owner as usize] -= block.size;
                    }
                    None => self.unmatched_frees += 1,
                }
                let index = self.level_changed(row.ts_ns);
                let bucket = &mut self.buckets[index];
                bucket.frees += 1;
                if let Some(total) = reserved {
                    bucket.reserved = Some(bucket.reserved.map_or(total, |r| r.max(total)));
                }
            }
            (Event::OpLaunch, EventType::AtenStart) => {
                let op = self.op_id(&row.name);
                self.ops.entry(row.tid).or_default().open.push(op);
            }
            (Event::OpLaunch, EventType::AtenEnd) => {
                let op = self.op_id(&row.name);
                let thread = self.ops.entry(row.tid).or_default();
                thread.open.pop();
                thread.last = op;
            }
            (Event::System, EventType::Step) => {
                self.bucket(row.ts_ns);
                if self.steps.len() < MAX_MARKS {
                    self.steps.push((row.ts_ns, row.name.clone()));
                } else {
                    self.dropped_marks += 1;
                }
            }
            (Event::Mstx, kind) => {
                self.bucket(row.ts_ns);
                if self.marks.len() < MAX_MARKS {
                    self.marks
                        .push((row.ts_ns, kind.as_str().to_owned(), row.name.clone()));
                } else {
                    self.dropped_marks += 1;
                }
            }
            (Event::System, EventType::Owner) => self.relabel(row),
            _ => {}
        }
    }

    /// A decompose `SYSTEM OWNER` row: the block at Ptr now belongs to the Attr's `owner`.
    fn relabel(&mut self, row: &EventRow) {
        let (Some(ptr), Some(owner)) = (row.ptr, row.attr_str("owner")) else {
            return;
        };
        let owner = owner.to_owned();
        // The block's pool is the owner's first label (`PTA@weight`), as decompose reads it.
        let pool = EventType::parse(owner.split('@').next().unwrap_or_default());
        let Some(key) = pool.map(|pool| BlockKey {
            device: row.device,
            pool,
            ptr,
        }) else {
            return;
        };
        if self.live.get(&key).is_none() {
            return;
        }
        let new_owner = self.owner_id(&owner);
        let block = self.live.get_mut(&key).expect("the key was just found");
        let old_owner = std::mem::replace(&mut block.owner, new_owner);
        let size = block.size;
        self.owner_bytes[old_owner as usize] -= size;
        self.owner_bytes[new_owner as usize] += size;
    }

    /// The page's data: bucket start times in ms since the first row, and the series.
    pub fn to_json(&self, label: &str, file: &str) -> Value {
        let t0 = self.t0.unwrap_or(0);
        let ms = |ts: u64| ts.saturating_sub(t0) as f64 / 1e6;
        let times: Vec<f64> = (0..self.buckets.len())
            .map(|i| (i as u64 * self.width_ns) as f64 / 1e6)
            .collect();
        let has_reserved = self.buckets.iter().any(|b| b.reserved.is_some());
        let owners: Vec<Value> = (0..self.owners.len())
            .map(|o| {
                json!({
                    "name": self.owners[o],
                    "bytes": self.buckets.iter().map(|b| b.owners_at_max.get(o).copied().unwrap_or(0)).collect::<Vec<_>>(),
                })
            })
            .collect();
        let hover: Vec<Value> = self
            .buckets
            .iter()
            .map(|b| match &b.largest {
                Some(l) => json!([
                    l.size,
                    self.op_names[l.op as usize],
                    self.owners[l.owner as usize],
                    ms(l.ts_ns),
                    l.inside
                ]),
                None => Value::Null,
            })
            .collect();
        json!({
            "label": label,
            "file": file,
            "t0_ns": t0,
            "bucket_ms": self.width_ns as f64 / 1e6,
            "rows": self.rows,
            "mallocs": self.mallocs,
            "frees": self.frees,
            "unmatched_frees": self.unmatched_frees,
            "live_at_end": {"count": self.live.len(), "bytes": self.allocated},
            "peak": {"bytes": self.peak, "ms": ms(self.peak_ts_ns)},
            "t": times,
            "max": self.buckets.iter().map(|b| b.max).collect::<Vec<_>>(),
            "min": self.buckets.iter().map(|b| b.min).collect::<Vec<_>>(),
            "reserved": if has_reserved {
                Value::from(self.buckets.iter().map(|b| b.reserved.map_or(Value::Null, Value::from)).collect::<Vec<_>>())
            } else {
                Value::Null
            },
            "counts": self.buckets.iter().map(|b| json!([b.mallocs, b.frees])).collect::<Vec<_>>(),
            "owners": owners,
            "hover": hover,
            "steps": self.steps.iter().map(|(ts, name)| json!([ms(*ts), name])).collect::<Vec<_>>(),
            "marks": self.marks.iter().map(|(ts, kind, msg)| json!([ms(*ts), kind, msg])).collect::<Vec<_>>(),
            "dropped_marks": self.dropped_marks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msmemscope_core::events::DeviceId;

    fn block(event: Event, ptr: u64, size: u64, ts_ns: u64, owner: &str, total: u64) -> EventRow {
        let mut row = EventRow::new(event, EventType::Pta, "");
        row.ts_ns = ts_ns;
        row.device = DeviceId::Cuda(0);
        row.ptr = Some(ptr);
        // `total` (the caching allocator's reserved bytes) only where a pool reports it.
        let total = if total == 0 {
            String::new()
        } else {
            format!(r#","total":{total}"#)
        };
        row.attrs_json = Some(format!(r#"{{"size":{size},"owner":"{owner}"{total}}}"#));
        row
    }

    fn relabel(ptr: u64, owner: &str, ts_ns: u64) -> EventRow {
        let mut row = EventRow::new(Event::System, EventType::Owner, owner);
        row.ts_ns = ts_ns;
        // The tracker writes OWNER rows with the block's device.
        row.device = DeviceId::Cuda(0);
        row.ptr = Some(ptr);
        row.attrs_json = Some(format!(r#"{{"allocation_id":1,"owner":"{owner}"}}"#));
        row
    }

    #[test]
    fn merged_buckets_keep_the_exact_peak_and_floor() {
        let mut timeline = Timeline::new();
        // 100,000 µs of sawtooth: one block at a time, sizes 1..=1000, a 1 GiB spike once.
        let mut expected_peak = 0;
        for i in 0..100_000u64 {
            let size = if i == 77_777 { 1 << 30 } else { 1 + i % 1000 };
            expected_peak = expected_peak.max(size);
            let ts = 1_000_000 + i * 1000;
            timeline.feed(&block(Event::Malloc, 0x1000, size, ts, "PTA", 2 << 30));
            timeline.feed(&block(Event::Free, 0x1000, size, ts + 500, "PTA", 2 << 30));
        }
        let json = timeline.to_json("0", "f.csv");
        let max: Vec<u64> = serde_json::from_value(json["max"].clone()).unwrap();
        let min: Vec<u64> = serde_json::from_value(json["min"].clone()).unwrap();
        assert!(
            max.len() <= MAX_BUCKETS && max.len() > MAX_BUCKETS / 4,
            "{}",
            max.len()
        );
        assert_eq!(max.iter().max(), Some(&expected_peak));
        assert_eq!(json["peak"]["bytes"], expected_peak);
        // The spike's time: 77,777 µs after the first row.
        assert_eq!(json["peak"]["ms"], 77.777);
        assert!(
            min.iter().all(|&m| m == 0),
            "every bucket saw the block freed"
        );
        let reserved: Vec<Option<u64>> = serde_json::from_value(json["reserved"].clone()).unwrap();
        assert!(reserved.iter().all(|r| *r == Some(2 << 30)));
        let counts: Vec<[u64; 2]> = serde_json::from_value(json["counts"].clone()).unwrap();
        assert_eq!(counts.iter().map(|c| c[0]).sum::<u64>(), 100_000);
        assert_eq!(counts.iter().map(|c| c[1]).sum::<u64>(), 100_000);
    }

    #[test]
    fn owners_stack_to_the_maximum_and_follow_relabels() {
        let mut timeline = Timeline::new();
        timeline.feed(&block(Event::Malloc, 0x10, 100, 1_000, "PTA@activation", 0));
        timeline.feed(&block(Event::Malloc, 0x20, 50, 1_100, "PTA", 0));
        // The tracker learns that 0x20 is a weight: its bytes move, the total does not.
        timeline.feed(&relabel(0x20, "PTA@weight", 1_200));
        timeline.feed(&block(Event::Malloc, 0x30, 25, 1_300, "PTA@activation", 0));
        // An unknown block or pool is ignored.
        timeline.feed(&relabel(0x99, "PTA@weight", 1_400));
        timeline.feed(&relabel(0x10, "HAL@x", 1_400));
        timeline.feed(&block(Event::Free, 0x10, 100, 5_000, "PTA", 0));
        let json = timeline.to_json("0", "f.csv");
        let names: Vec<String> = json["owners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["PTA@activation", "PTA", "PTA@weight"]);
        // The peak (175 B) is in the first bucket, at 0x30's MALLOC: 125 activation + 50 weight.
        let at = |o: usize| json["owners"][o]["bytes"][0].as_u64().unwrap();
        assert_eq!(json["max"][0], 175);
        assert_eq!((at(0), at(1), at(2)), (125, 0, 50));
        assert_eq!(json["live_at_end"]["bytes"], 75);
        assert_eq!(json["reserved"], serde_json::Value::Null);
    }
}
