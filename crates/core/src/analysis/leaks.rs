//! `leaks`, the default analysis (SPEC §7): blocks that outlive the step they were allocated in.
//!
//! # Rules
//! - Steps: a `SYSTEM STEP` row starts the next step (its Name is the step number; the runtime
//!   writes one for `msmemscope.step()` and for each MSTX/NVTX range named `step start`, so the
//!   `MSTX Range_start` rows themselves are not counted again). Rows before the first STEP row
//!   are step 0. The end of the input ends the last step.
//! - Blocks: `MALLOC` rows of every pool (`PTA`, `HAL`, `HOST`) add a live block keyed by
//!   (Device Id, pool, Ptr); the `FREE` row with the same key removes it.
//! - Candidates: when a step ends, every block allocated in the step before it (so at least one
//!   step old), in step 2 or later, and still live is a leak. A block is reported once, however
//!   many step ends it survives; a leak found at a step end stays reported even if the program
//!   frees the block later (Python frees everything at interpreter exit).
//! - `HAL` blocks still live at the end of the input are leaks too, whatever their step.
//! - `kernel_N`: launches (`OP_LAUNCH ATEN_START` and `KERNEL_LAUNCH` rows) are numbered from 0
//!   per device in row order; a launch row without a device (Device Id `N/A`) counts for every
//!   device, as it is written to every device's dump file. N is the number of the last launch
//!   before the allocation; a block allocated before any launch is reported `in kernel_N/A`.
//! - Sizes: `Mb` = bytes / 1024 / 1024, printed with 3 decimals, rounded to the nearest (Rust's
//!   `{:.3}` on the `f64` quotient; an exact tie rounds to even). The summary converts the summed
//!   bytes once (it is not the sum of the rounded lines).
//!
//! # Report (console and `leaks/leak_report.txt`)
//! One block per device that has leaks, devices in the order `N/A`, `cpu`, `0`, `1`, …; lines in
//! allocation order (row ID):
//! ```text
//! ====== ERROR: Detected memory leaks on device cpu ======
//! Direct PTA leak of 0.015 Mb(s) at 0x00007f0000001000 in kernel_42 at step 2.
//! Direct HAL leak of 2.000 Mb(s) at 0x00007f0000200000 in kernel_N/A at step 0.
//! ====== SUMMARY: 2.015 Mb(s) leaked in 2 allocation(s) ======
//! ```
//! With no leaks the console text is empty (as the seed's: nothing is printed) and
//! `leaks/leak_report.txt` holds `====== No memory leaks detected ======`.

use std::collections::BTreeMap;

use super::fast_map::FastMap;
use super::{Analysis, AnalysisOutput};
use crate::events::row::format_ptr;
use crate::events::{DeviceId, Event, EventRow, EventType};

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

/// Bytes as the seed's `Mb(s)`: bytes / 1024 / 1024 with 3 decimals.
pub fn mb(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / (1024.0 * 1024.0))
}

/// The memory pools blocks live in (the MALLOC/FREE Event Types).
pub fn is_pool(t: EventType) -> bool {
    matches!(t, EventType::Pta | EventType::Hal | EventType::Host)
}

/// A live block's identity: its device, pool and Ptr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockKey {
    pub(crate) device: DeviceId,
    pub(crate) pool: EventType,
    pub(crate) ptr: u64,
}

impl std::hash::Hash for BlockKey {
    /// One word: the Ptr with the device and pool folded into its top bits, which real
    /// addresses leave clear (equal words of different keys only share a bucket). The maps
    /// of live blocks hash one on every MALLOC and FREE row.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let device = match self.device {
            DeviceId::None => 0,
            DeviceId::Cpu => 1,
            DeviceId::Cuda(index) => 2 + u64::from(index),
        };
        state.write_u64(self.ptr ^ (device << 8 | self.pool as u64) << 48);
    }
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
    reported: bool,
}

impl Block {
    fn kernel(&self) -> Option<u64> {
        self.launches.checked_sub(1)
    }
}

/// One reported leak.
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
}

#[derive(Default)]
pub struct Leaks {
    step: u64,
    /// Launches without a device (they count for every device).
    launches_anywhere: u64,
    launches: FastMap<DeviceId, u64>,
    live: FastMap<BlockKey, Block>,
    /// Blocks allocated in the current / the previous step (step ≥ 2), with their row IDs.
    this_step: Vec<(BlockKey, u64)>,
    last_step: Vec<(BlockKey, u64)>,
    leaks: Vec<Leak>,
}

impl Leaks {
    pub fn new() -> Leaks {
        Leaks::default()
    }

    /// The leaks found so far (all of them once `finish` has run).
    pub fn leaks(&self) -> &[Leak] {
        &self.leaks
    }

    fn report(&mut self, key: BlockKey) {
        if let Some(block) = self.live.get_mut(&key) {
            if !block.reported {
                block.reported = true;
                self.leaks.push(Leak {
                    device: key.device,
                    pool: key.pool,
                    ptr: key.ptr,
                    size: block.size,
                    kernel: block.kernel(),
                    step: block.step,
                    row_id: block.row_id,
                });
            }
        }
    }

    /// The current step ends: the previous step's blocks still live are leaks.
    fn end_step(&mut self) {
        let last = std::mem::take(&mut self.last_step);
        for (key, row_id) in &last {
            if self.live.get(key).is_some_and(|b| b.row_id == *row_id) {
                self.report(*key);
            }
        }
        self.last_step = std::mem::take(&mut self.this_step);
        // Reuse the old vector's allocation for the new step.
        self.this_step = last;
        self.this_step.clear();
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
                self.end_step();
                self.step = row.name.trim().parse().unwrap_or(self.step + 1);
            }
            (Event::OpLaunch, EventType::AtenStart) | (Event::KernelLaunch, _) => {
                if row.device == DeviceId::None {
                    self.launches_anywhere += 1;
                } else {
                    *self.launches.entry(row.device).or_insert(0) += 1;
                }
            }
            (Event::Malloc, pool) if is_pool(pool) => {
                let Some(ptr) = row.ptr else { return };
                let key = BlockKey {
                    device: row.device,
                    pool,
                    ptr,
                };
                let block = Block {
                    size: block_attrs(row).size.unwrap_or(0),
                    step: self.step,
                    launches: self.launches_of(row.device),
                    row_id: row.id,
                    reported: false,
                };
                self.live.insert(key, block);
                if self.step >= 2 {
                    self.this_step.push((key, row.id));
                }
            }
            (Event::Free, pool) if is_pool(pool) => {
                if let Some(ptr) = row.ptr {
                    self.live.remove(&BlockKey {
                        device: row.device,
                        pool,
                        ptr,
                    });
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self) -> AnalysisOutput {
        self.end_step();
        let hal: Vec<BlockKey> = self
            .live
            .iter()
            .filter(|(k, b)| k.pool == EventType::Hal && !b.reported)
            .map(|(k, _)| *k)
            .collect();
        for key in hal {
            self.report(key);
        }
        self.live.clear();
        let text = render(&self.leaks);
        let file = if text.is_empty() {
            "====== No memory leaks detected ======\n".to_string()
        } else {
            text.clone()
        };
        AnalysisOutput {
            console: text,
            files: vec![(REPORT_FILE.to_string(), file)],
        }
    }
}

/// The report text for `leaks` (empty when there are none).
pub fn render(leaks: &[Leak]) -> String {
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
        let mut total = 0u64;
        for leak in &leaks {
            total += leak.size;
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

    fn run(rows: Vec<EventRow>) -> (AnalysisOutput, Vec<Leak>) {
        let mut leaks = Leaks::new();
        for (i, mut row) in rows.into_iter().enumerate() {
            row.id = i as u64 + 1;
            leaks.feed(&row);
        }
        let out = leaks.finish();
        (out, leaks.leaks().to_vec())
    }

    const CPU: DeviceId = DeviceId::Cpu;

    fn malloc(ptr: u64, size: u64) -> EventRow {
        block(Event::Malloc, EventType::Pta, CPU, ptr, size, 0)
    }

    fn free(ptr: u64, size: u64) -> EventRow {
        block(Event::Free, EventType::Pta, CPU, ptr, size, 0)
    }

    #[test]
    fn step_rules() {
        let rows = vec![
            launch("aten::empty", DeviceId::None), // kernel_0
            malloc(0x10, 100),                     // step 0: never a candidate
            step(1),
            malloc(0x20, 200), // step 1: never a candidate
            step(2),
            launch("aten::add", DeviceId::None), // kernel_1
            malloc(0x30, 15_728),                // step 2, kept: leak
            malloc(0x40, 400),                   // step 2, freed in step 3: no leak
            step(3),
            free(0x40, 400),
            launch("aten::mul", CPU), // kernel_2 on cpu
            malloc(0x50, 1_048_576),  // step 3, live at the end of step 4: leak
            step(4),
            malloc(0x60, 600), // step 4, live at the end but never a step old
        ];
        let (out, leaks) = run(rows);
        assert_eq!(
            out.console,
            "====== ERROR: Detected memory leaks on device cpu ======\n\
             Direct PTA leak of 0.015 Mb(s) at 0x0000000000000030 in kernel_1 at step 2.\n\
             Direct PTA leak of 1.000 Mb(s) at 0x0000000000000050 in kernel_2 at step 3.\n\
             ====== SUMMARY: 1.015 Mb(s) leaked in 2 allocation(s) ======\n"
        );
        assert_eq!(leaks.len(), 2);
        assert_eq!(leaks[0].row_id, 7);
        assert_eq!(
            out.files,
            vec![(REPORT_FILE.to_string(), out.console.clone())]
        );
    }

    #[test]
    fn leak_found_at_a_step_end_stays_reported_after_a_late_free() {
        let rows = vec![
            step(1),
            step(2),
            malloc(0x30, 1024),
            step(3),
            step(4), // end of step 3: the step-2 block is live and a step old
            free(0x30, 1024),
        ];
        let (out, _) = run(rows);
        assert!(out.console.contains(
            "Direct PTA leak of 0.001 Mb(s) at 0x0000000000000030 in kernel_N/A at step 2."
        ));
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
        ];
        let (out, leaks) = run(rows);
        assert!(leaks.is_empty(), "{leaks:?}");
        assert_eq!(out.console, "");
        assert_eq!(
            out.files,
            vec![(
                REPORT_FILE.to_string(),
                "====== No memory leaks detected ======\n".to_string()
            )]
        );
    }

    #[test]
    fn devices_pools_kernels_and_hal_at_exit() {
        let cuda = DeviceId::Cuda(0);
        let mut kernel = EventRow::new(Event::KernelLaunch, EventType::KernelLaunch, "gemm");
        kernel.device = cuda;
        let rows = vec![
            block(Event::Malloc, EventType::Hal, cuda, 0x7000, 2 << 20, 0), // HAL, step 0
            step(1),
            launch("aten::add", CPU), // cpu kernel_0
            kernel.clone(),           // cuda kernel_0
            kernel.clone(),           // cuda kernel_1
            step(2),
            block(Event::Malloc, EventType::Pta, cuda, 0x9000, 512, 512),
            block(Event::Malloc, EventType::Host, CPU, 0x100, 1536, 0),
            block(Event::Malloc, EventType::Hal, cuda, 0x8000, 4096, 0), // freed: no leak
            step(3),
            block(Event::Free, EventType::Hal, cuda, 0x8000, 4096, 0),
        ];
        let (out, _) = run(rows);
        assert_eq!(
            out.console,
            "====== ERROR: Detected memory leaks on device cpu ======\n\
             Direct HOST leak of 0.001 Mb(s) at 0x0000000000000100 in kernel_0 at step 2.\n\
             ====== SUMMARY: 0.001 Mb(s) leaked in 1 allocation(s) ======\n\
             ====== ERROR: Detected memory leaks on device 0 ======\n\
             Direct HAL leak of 2.000 Mb(s) at 0x0000000000007000 in kernel_N/A at step 0.\n\
             Direct PTA leak of 0.000 Mb(s) at 0x0000000000009000 in kernel_1 at step 2.\n\
             ====== SUMMARY: 2.000 Mb(s) leaked in 2 allocation(s) ======\n"
        );
    }

    #[test]
    fn parsed_attrs_and_step_numbers_from_names() {
        // Rows read back from a dump have `attrs` parsed and no raw JSON.
        let mut m = EventRow::new(Event::Malloc, EventType::Pta, "");
        m.device = CPU;
        m.ptr = Some(0xabc);
        m.attrs.insert("size".into(), 3_145_728u64.into());
        let rows = vec![step(5), m, step(6), step(7)];
        let (out, leaks) = run(rows);
        assert_eq!(leaks[0].step, 5);
        assert!(out.console.contains("Direct PTA leak of 3.000 Mb(s)"));
    }

    #[test]
    fn mb_rounding() {
        assert_eq!(mb(0), "0.000");
        assert_eq!(mb(524), "0.000"); // 0.00049…
        assert_eq!(mb(525), "0.001"); // 0.00050…
        assert_eq!(mb(15_728), "0.015");
        assert_eq!(mb(1_048_576 * 3 / 2), "1.500");
    }
}
