//! One window's ledger: the only place host allocations are accounted while the window is open.
//! Nothing leaves the process until the window closes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use msmemscope_core::host_leak::buckets::bucket_index;
use msmemscope_core::host_leak::truncation;

use super::block_table::{Block, BlockTable, Insert};
use super::hashing::mix;
use super::overflow::OverflowLedger;
use super::settings::WindowSettings;
use super::stack_table::StackTable;
use super::striped::StripedCountBytes;
use crate::clock::realtime_ns;
use crate::unwind::{capture_stack, CapturedStack};

pub struct Ledger {
    pub settings: WindowSettings,
    pub stage: u32,
    pub start_ns: u64,
    sample_mask: u64,
    pub blocks: BlockTable,
    pub stacks: StackTable,
    pub overflow: OverflowLedger,
    truncation: AtomicU32,
    stopped: AtomicBool,
    stopped_at_ns: AtomicU64,
    pub untracked_below_threshold: StripedCountBytes,
    pub untracked_sampled: StripedCountBytes,
    pub frees_untracked: StripedCountBytes,
    pub prewindow_frees: [StripedCountBytes; 7],
    /// Blocks found still in the table when their address was handed out again: their free
    /// happened where no hook saw it.
    pub missed_frees: AtomicU64,
}

/// What a free took out of the ledger, before the real `free`/`realloc` ran.
pub enum Taken {
    Block(Block),
    Overflow(u64),
    /// Not in the ledger: `usable` is the block's usable size, read while it was still valid.
    NotFound {
        usable: u64,
    },
    /// Accounting has stopped.
    Ignored,
}

impl Ledger {
    pub fn new(settings: WindowSettings, stage: u32) -> Ledger {
        Ledger {
            sample_mask: settings.sample_rate.saturating_sub(1),
            blocks: BlockTable::new(settings.block_cap),
            stacks: StackTable::new(settings.stack_cap),
            overflow: OverflowLedger::new(settings.overflow_cap),
            settings,
            stage,
            start_ns: realtime_ns(),
            truncation: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
            stopped_at_ns: AtomicU64::new(0),
            untracked_below_threshold: StripedCountBytes::default(),
            untracked_sampled: StripedCountBytes::default(),
            frees_untracked: StripedCountBytes::default(),
            prewindow_frees: std::array::from_fn(|_| StripedCountBytes::default()),
            missed_frees: AtomicU64::new(0),
        }
    }

    /// The sampled view is decided by the block's address, so the free of a block outside it is
    /// recognised without remembering the block.
    #[inline]
    fn sampled(&self, ptr: usize) -> bool {
        self.sample_mask == 0 || (mix(ptr as u64 >> 4) >> 24) & self.sample_mask == 0
    }

    pub fn truncation_bits(&self) -> u32 {
        let mut bits = self.truncation.load(Ordering::Relaxed);
        if self.stacks.table_full_without_dead() {
            bits |= truncation::STACK_TABLE_FULL;
        }
        bits
    }

    pub fn stopped_at_ns(&self) -> Option<u64> {
        self.stopped
            .load(Ordering::Relaxed)
            .then(|| self.stopped_at_ns.load(Ordering::Relaxed))
    }

    /// Records a successful allocation. Runs with the reentrancy guard held.
    #[inline]
    pub fn on_alloc(&self, ptr: usize, size: usize) {
        let size = size as u64;
        if size < self.settings.block_size_threshold {
            self.untracked_below_threshold.add(size);
            return;
        }
        if !self.sampled(ptr) {
            self.untracked_sampled.add(size);
            return;
        }
        if self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let mut stack = CapturedStack::empty();
        capture_stack(&mut stack);
        let ts = realtime_ns();
        let inserted = self.blocks.insert_with(ptr, || Block {
            size,
            alloc_ts_ns: ts,
            stack: self.stacks.on_alloc(&stack, size, ts),
        });
        match inserted {
            Insert::Inserted => {}
            Insert::Replaced(stale) => {
                self.stacks.on_free(stale.stack, stale.size);
                self.missed_frees.fetch_add(1, Ordering::Relaxed);
            }
            Insert::Full => {
                self.truncation
                    .fetch_or(truncation::BLOCK_TABLE_FULL, Ordering::Relaxed);
                if !self.overflow.insert(ptr, size) {
                    self.stop(ts);
                }
            }
        }
    }

    fn stop(&self, ts: u64) {
        self.truncation
            .fetch_or(truncation::ACCOUNTING_STOPPED, Ordering::Relaxed);
        if !self.stopped.swap(true, Ordering::Relaxed) {
            self.stopped_at_ns.store(ts, Ordering::Relaxed);
        }
    }

    /// Takes `ptr` out of the ledger. Must run before the real `free`/`realloc`, so that no
    /// other thread can be handed the same address while it is still recorded as live.
    #[inline]
    pub fn take(&self, ptr: usize) -> Taken {
        if self.stopped.load(Ordering::Relaxed) {
            return Taken::Ignored;
        }
        if let Some(block) = self.blocks.remove(ptr) {
            return Taken::Block(block);
        }
        if let Some(size) = self.overflow.remove(ptr) {
            return Taken::Overflow(size);
        }
        Taken::NotFound {
            usable: crate::libc_heap::usable_size(ptr as *mut _) as u64,
        }
    }

    /// Accounts a free whose block was taken with [`Ledger::take`].
    #[inline]
    pub fn settle_free(&self, ptr: usize, taken: Taken) {
        match taken {
            Taken::Block(block) => self.stacks.on_free(block.stack, block.size),
            Taken::Overflow(_) => {}
            Taken::NotFound { usable } => {
                if !self.sampled(ptr) || usable < self.settings.block_size_threshold {
                    // Most likely a block below the threshold, allocated in the window. The
                    // usable size can exceed the request by up to one allocator granule, so a
                    // block just under the threshold may be counted as pre-window instead.
                    self.frees_untracked.add(usable);
                } else {
                    self.prewindow_frees[bucket_index(usable)].add(usable);
                }
            }
            Taken::Ignored => {}
        }
    }

    /// Puts back what [`Ledger::take`] removed, when the `realloc` that followed failed.
    pub fn restore(&self, ptr: usize, taken: Taken) {
        match taken {
            Taken::Block(block) => self.blocks.restore(ptr, block),
            Taken::Overflow(size) => self.overflow.restore(ptr, size),
            Taken::NotFound { .. } | Taken::Ignored => {}
        }
    }
}
