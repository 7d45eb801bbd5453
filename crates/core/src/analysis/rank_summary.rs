//! One rank's memory in a line: what `msmemscope ranks` shows for each dump (one rank, one
//! device) so that many ranks can be compared at a glance.
//!
//! # Rules (the SQL engines' `ranks.sql` implements the same ones)
//! - Steps: a `SYSTEM STEP` row's Name is the number of the step it starts; rows before the
//!   first are step 0 (as the `leaks` analysis counts them).
//! - Peak allocated: the largest `used` (the pool's allocated bytes after the event) of a `PTA`
//!   `MALLOC` row; its step is the step of the first row that reached it.
//! - Reserved peak: the largest `total` (the pool's reserved bytes) of a `PTA` `MALLOC` or
//!   `FREE` row, for CUDA devices only (the CPU allocator reserves nothing of its own).
//! - Leaks: the blocks the `leaks` analysis reports, judged on the same rows
//!   (docs/analyses.md#ranks): the candidates (the original msMemScope's rule: allocated in step 2
//!   or later and live at the STEP row that ends the step after theirs, or allocated in the step
//!   before the last and live at the end of the dump) of the sites whose live candidate bytes reach
//!   a new high at two step ends or more, every `HAL` candidate, and the `HAL` blocks live at the
//!   end, with their bytes. A block that only outlived its step once (a gradient a communication
//!   thread let go of a step late, optimizer state made once) is no leak, as in the findings.
//! - Top owner at peak: the owner with the most live `PTA` bytes just after the peak row. A
//!   block lives from its `MALLOC` to the next `MALLOC` or `FREE` row of its (Device Id, pool,
//!   Ptr); its owner is its `MALLOC` row's `owner`, or that of the last `SYSTEM OWNER` row for
//!   its `allocation_id` while it lives. Blocks without an owner are left out; equal bytes go to
//!   the owner that sorts first.

use super::fast_map::FastMap;

use super::leaks::Leaks;
use super::live_blocks::LiveBlocks;
use super::Analysis;
use crate::events::{DeviceId, Event, EventRow, EventType};

/// A dump's line in the ranks table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankSummary {
    pub rows: u64,
    pub peak_allocated: Option<u64>,
    pub peak_step: Option<u64>,
    pub reserved_peak: Option<u64>,
    pub leaked_bytes: u64,
    pub leaked_blocks: u64,
    /// The owner with the most live bytes at the peak, and those bytes.
    pub top_owner: Option<(String, u64)>,
}

struct Live {
    size: u64,
    owner: Option<usize>,
}

/// Computes a [`RankSummary`] from a dump's rows, fed in order.
pub struct RankSummarizer {
    leaks: Leaks,
    step: u64,
    summary: RankSummary,
    /// Live `PTA` blocks, found by their allocation ids too.
    live: LiveBlocks<Live>,
    /// Owner names, and the live bytes of each (same index).
    owners: Vec<String>,
    owner_index: FastMap<String, usize>,
    owner_bytes: Vec<u64>,
}

impl Default for RankSummarizer {
    fn default() -> Self {
        Self::new()
    }
}

impl RankSummarizer {
    pub fn new() -> RankSummarizer {
        RankSummarizer {
            leaks: Leaks::default(),
            step: 0,
            summary: RankSummary::default(),
            live: LiveBlocks::with_allocation_index(),
            owners: Vec::new(),
            owner_index: FastMap::default(),
            owner_bytes: Vec::new(),
        }
    }

    pub fn feed(&mut self, row: &EventRow) {
        self.summary.rows += 1;
        self.leaks.feed(row);
        match (row.event, row.event_type) {
            (Event::System, EventType::Step) => {
                self.step = row.name.trim().parse().unwrap_or(self.step + 1);
            }
            (Event::System, EventType::Owner) => self.relabel(row),
            (Event::Malloc, EventType::Pta) => {
                self.note_reserved(row);
                let owner = row.attr_str("owner").map(|o| self.owner_id(o));
                let size = row.attr_u64("size").unwrap_or(0);
                let Some((_, gone)) = self.live.apply(row, || Live { size, owner }) else {
                    return;
                };
                self.end_block(gone);
                if let Some(owner) = owner {
                    self.owner_bytes[owner] += size;
                }
                if let Some(used) = row.attr_u64("used") {
                    if self.summary.peak_allocated.is_none_or(|peak| used > peak) {
                        self.summary.peak_allocated = Some(used);
                        self.summary.peak_step = Some(self.step);
                        self.summary.top_owner = self.top_owner();
                    }
                }
            }
            (Event::Free, EventType::Pta) => {
                self.note_reserved(row);
                if let Some((_, gone)) = self.live.apply(row, || Live {
                    size: 0,
                    owner: None,
                }) {
                    self.end_block(gone);
                }
            }
            _ => {}
        }
    }

    pub fn finish(mut self) -> RankSummary {
        self.leaks.finish();
        let leaks = self.leaks.leaks();
        self.summary.leaked_blocks = leaks.len() as u64;
        self.summary.leaked_bytes = leaks.iter().map(|l| l.size).sum();
        self.summary
    }

    fn note_reserved(&mut self, row: &EventRow) {
        if !matches!(row.device, DeviceId::Cuda(_)) {
            return;
        }
        if let Some(total) = row.attr_u64("total") {
            let peak = self.summary.reserved_peak.get_or_insert(total);
            *peak = (*peak).max(total);
        }
    }

    fn owner_id(&mut self, owner: &str) -> usize {
        if let Some(&id) = self.owner_index.get(owner) {
            return id;
        }
        let id = self.owners.len();
        self.owners.push(owner.to_string());
        self.owner_bytes.push(0);
        self.owner_index.insert(owner.to_string(), id);
        id
    }

    /// A block stopped living (freed, or its address allocated again).
    fn end_block(&mut self, gone: Option<Live>) {
        if let Some(Live {
            size,
            owner: Some(owner),
        }) = gone
        {
            self.owner_bytes[owner] -= size;
        }
    }

    /// A `SYSTEM OWNER` row: the live block with its allocation id changes owner.
    fn relabel(&mut self, row: &EventRow) {
        let (Some(id), Some(owner)) = (row.attr_u64("allocation_id"), row.attr_str("owner")) else {
            return;
        };
        let owner = self.owner_id(owner);
        if let Some((_, block)) = self.live.by_allocation_id(id) {
            if let Some(old) = block.owner {
                self.owner_bytes[old] -= block.size;
            }
            self.owner_bytes[owner] += block.size;
            block.owner = Some(owner);
        }
    }

    fn top_owner(&self) -> Option<(String, u64)> {
        let mut best: Option<usize> = None;
        for (i, &bytes) in self.owner_bytes.iter().enumerate() {
            let better = match best {
                None => bytes > 0,
                Some(b) => {
                    bytes > self.owner_bytes[b]
                        || (bytes == self.owner_bytes[b] && self.owners[i] < self.owners[b])
                }
            };
            if better {
                best = Some(i);
            }
        }
        best.map(|i| (self.owners[i].clone(), self.owner_bytes[i]))
    }
}

/// The median of `values` (the mean of the two middle ones for an even count), as the SQL
/// engines compute it; `None` for no values.
pub fn median(values: &mut [u64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let n = values.len();
    // The middle value twice for an odd count, the two middle ones for an even count.
    let (a, b) = (values[n.div_ceil(2) - 1], values[n / 2]);
    Some((a as f64 + b as f64) / 2.0)
}

/// Whether `value` stands out: more than `threshold_pct` percent above `median`.
pub fn stands_out(value: u64, median: Option<f64>, threshold_pct: u32) -> bool {
    median.is_some_and(|m| value as f64 > m * (1.0 + threshold_pct as f64 / 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(event: Event, kind: EventType, id: u64, ptr: Option<u64>, attrs: &str) -> EventRow {
        let mut r = EventRow::new(event, kind, "");
        r.id = id;
        r.device = DeviceId::Cuda(0);
        r.ptr = ptr;
        r.attrs_json = Some(attrs.to_string());
        r
    }

    fn step(id: u64, n: u64) -> EventRow {
        let mut r = EventRow::new(Event::System, EventType::Step, n.to_string());
        r.id = id;
        r
    }

    #[test]
    fn peak_step_reserved_and_the_owner_at_the_peak() {
        let m = |id, ptr, size, used, owner: &str| {
            row(
                Event::Malloc,
                EventType::Pta,
                id,
                Some(ptr),
                &format!(
                    r#"{{"allocation_id":{id},"size":{size},"used":{used},"total":{},"owner":"{owner}"}}"#,
                    used * 2
                ),
            )
        };
        let f = |id, ptr, size, used| {
            row(
                Event::Free,
                EventType::Pta,
                id,
                Some(ptr),
                &format!(r#"{{"size":{size},"used":{used},"total":9000}}"#),
            )
        };
        let rows = vec![
            m(1, 0x100, 100, 100, "PTA@weight"),
            step(2, 1),
            m(3, 0x200, 300, 400, "PTA@activation"),
            // Relabelled while live: its bytes move to the gradient.
            row(
                Event::System,
                EventType::Owner,
                4,
                Some(0x200),
                r#"{"allocation_id":3,"owner":"PTA@gradient"}"#,
            ),
            f(5, 0x200, 300, 100),
            step(6, 2),
            m(7, 0x300, 150, 250, "PTA@activation"),
            m(8, 0x400, 150, 400, "PTA@activation"),
        ];
        let mut s = RankSummarizer::new();
        for r in &rows {
            s.feed(r);
        }
        let out = s.finish();
        // 400 first reached at row 3 (step 1); row 8 only equals it.
        assert_eq!(out.peak_allocated, Some(400));
        assert_eq!(out.peak_step, Some(1));
        assert_eq!(out.reserved_peak, Some(9000));
        assert_eq!(out.top_owner, Some(("PTA@activation".to_string(), 300)));
        assert_eq!(out.rows, 8);
    }

    #[test]
    fn leaks_are_the_blocks_of_growing_sites_not_those_that_outlived_a_step_once() {
        let m = |id, ptr, size, site: &str| {
            row(
                Event::Malloc,
                EventType::Pta,
                id,
                Some(ptr),
                &format!(r#"{{"allocation_id":{id},"size":{size},"site":"{site}"}}"#),
            )
        };
        let f = |id, ptr| row(Event::Free, EventType::Pta, id, Some(ptr), "{}");
        let rows = vec![
            row(
                Event::Malloc,
                EventType::Hal,
                1,
                Some(0x90),
                r#"{"size":1000}"#,
            ),
            step(2, 1),
            step(3, 2),
            m(4, 0x10, 100, "t.py:1 (grows)"),
            m(5, 0x20, 50, "t.py:2 (late free)"),
            m(6, 0x30, 70, "t.py:3 (made once)"),
            step(7, 3),
            m(8, 0x11, 100, "t.py:1 (grows)"),
            m(9, 0x21, 50, "t.py:2 (late free)"),
            // Step 3 ends: step 2's three blocks are candidates, each site's first high.
            step(10, 4),
            f(11, 0x20),
            m(12, 0x12, 100, "t.py:1 (grows)"),
            // Step 4 ends: only line 1's candidate bytes reach a new high (200).
            step(13, 5),
            m(14, 0x13, 100, "t.py:1 (grows)"),
            f(15, 0x21),
        ];
        let mut s = RankSummarizer::new();
        for r in &rows {
            s.feed(r);
        }
        let out = s.finish();
        // Line 1's blocks of steps 2, 3 and (live at the end) 4, and the HAL block.
        assert_eq!((out.leaked_blocks, out.leaked_bytes), (4, 1300));
    }

    #[test]
    fn medians_and_outliers() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [5]), Some(5.0));
        assert_eq!(median(&mut [9, 1, 4, 3]), Some(3.5));
        assert!(stands_out(1, Some(0.0), 25));
        assert!(!stands_out(0, Some(0.0), 25));
        assert!(!stands_out(125, Some(100.0), 25));
        assert!(stands_out(126, Some(100.0), 25));
    }
}
