//! One window's ledger: the only place host allocations are accounted while the window is open.
//! Nothing leaves the process until the window closes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use msmemscope_core::host_leak::buckets::bucket_index;
use msmemscope_core::host_leak::truncation;
use msmemscope_core::host_leak::CountBytes;

use super::beats::Beats;
use super::block_table::{Block, BlockTable};
use super::hashing::mix;
use super::overflow::OverflowLedger;
use super::settings::WindowSettings;
use super::stack_table::{Interned, StackTable, UNKNOWN_STACK};
use super::striped::StripedCountBytes;
use crate::clock::realtime_ns;
use crate::unwind::{with_stack, CapturedStack};

/// After a recycling pass that freed nothing, wait this long before scanning again.
const RECYCLE_RETRY_MS: u64 = 50;

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
    last_failed_recycle_ms: AtomicU64,
    pub beats: Beats,
    /// Blocks found still in the table when their address was handed out again: their free
    /// happened where no hook saw it.
    pub missed_frees: AtomicU64,
    /// True while an interim snapshot walks the ledger; tracked allocations meanwhile are
    /// counted in `snapshot_arrivals` (the snapshot's freeze note).
    snapshot_running: AtomicBool,
    snapshot_arrivals: AtomicU64,
    snapshot_arrival_bytes: AtomicU64,
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
        let start_ns = realtime_ns();
        Ledger {
            beats: Beats::new(start_ns, settings.beat_ms),
            sample_mask: settings.sample_rate.saturating_sub(1),
            blocks: BlockTable::new(settings.block_cap),
            stacks: StackTable::new(settings.stack_cap, (stage as u64) << 24),
            overflow: OverflowLedger::new(settings.overflow_cap),
            settings,
            stage,
            start_ns,
            truncation: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
            stopped_at_ns: AtomicU64::new(0),
            untracked_below_threshold: StripedCountBytes::default(),
            untracked_sampled: StripedCountBytes::default(),
            frees_untracked: StripedCountBytes::default(),
            prewindow_frees: std::array::from_fn(|_| StripedCountBytes::default()),
            missed_frees: AtomicU64::new(0),
            last_failed_recycle_ms: AtomicU64::new(0),
            snapshot_running: AtomicBool::new(false),
            snapshot_arrivals: AtomicU64::new(0),
            snapshot_arrival_bytes: AtomicU64::new(0),
        }
    }

    /// An interim snapshot starts walking the ledger (one at a time: the control channel
    /// serves one command at a time).
    pub fn begin_snapshot(&self) {
        self.snapshot_arrivals.store(0, Ordering::Relaxed);
        self.snapshot_arrival_bytes.store(0, Ordering::Relaxed);
        self.snapshot_running.store(true, Ordering::SeqCst);
    }

    /// The snapshot is done: the tracked allocations that arrived while it walked.
    pub fn end_snapshot(&self) -> CountBytes {
        self.snapshot_running.store(false, Ordering::SeqCst);
        CountBytes {
            count: self.snapshot_arrivals.load(Ordering::Relaxed),
            bytes: self.snapshot_arrival_bytes.load(Ordering::Relaxed),
        }
    }

    /// Live tracked blocks now (block table and overflow ledger), waiting for each lock until
    /// `deadline`; also the number of parts that could not be read.
    pub fn live_now(&self, deadline: std::time::Instant) -> (CountBytes, u32) {
        let mut live = CountBytes::default();
        let mut unread = self.blocks.for_each_shard(deadline, |shard| {
            for block in shard.values() {
                live.add(block.size);
            }
        });
        match self.overflow.collect(deadline) {
            Some(state) => {
                for &(_, size) in &state.live {
                    live.add(size);
                }
            }
            None => unread += 1,
        }
        (live, unread)
    }

    /// The sampled view is decided by the block's address, so the free of a block outside it is
    /// recognised without remembering the block.
    #[inline]
    fn sampled(&self, ptr: usize) -> bool {
        self.sample_mask == 0 || (mix(ptr as u64 >> 4) >> 24) & self.sample_mask == 0
    }

    /// Milliseconds from the window's start to `ts` (saturating after 49 days).
    #[inline]
    fn window_ms(&self, ts: u64) -> u32 {
        (ts.saturating_sub(self.start_ns) / 1_000_000).min(u32::MAX as u64) as u32
    }

    /// How long `block` has lived, in milliseconds.
    #[inline]
    fn lifetime_ms(&self, block: &Block) -> u64 {
        (self.window_ms(realtime_ns()) as u64).saturating_sub(block.alloc_ms as u64)
    }

    /// The wall-clock time of a block's allocation.
    pub fn alloc_ns(&self, block: &Block) -> u64 {
        self.start_ns + block.alloc_ms as u64 * 1_000_000
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
        let ts = with_stack(|stack, tag| self.insert(ptr, size, stack, tag));
        if self.snapshot_running.load(Ordering::Relaxed) {
            self.snapshot_arrivals.fetch_add(1, Ordering::Relaxed);
            self.snapshot_arrival_bytes
                .fetch_add(size, Ordering::Relaxed);
        }
        if let Some(beat) = self.beats.due(ts) {
            self.take_beat(beat as f64, false);
        }
    }

    /// Samples every stack's live memory into the beat series.
    pub fn take_beat(&self, beat: f64, closing: bool) {
        let mut live = Vec::new();
        self.stacks.for_each_live(|id, cb| live.push((id, cb)));
        self.beats.record(beat, &mut live, closing);
    }

    /// Inserts a block allocated from `stack`. `tag` is the stack's memo tag, where the stack's
    /// id is kept with the stack-table generation it is valid in: `generation << 32 | id + 1`.
    /// Returns the allocation's timestamp.
    #[inline]
    fn insert(&self, ptr: usize, size: u64, stack: &CapturedStack, tag: &mut u64) -> u64 {
        let ts = realtime_ns();
        let mut may_recycle = true;
        loop {
            let mut shard = self.blocks.shard(ptr);
            if self.blocks.is_full(&shard, ptr) {
                drop(shard);
                self.truncation
                    .fetch_or(truncation::BLOCK_TABLE_FULL, Ordering::Relaxed);
                if !self.overflow.insert(ptr, size) {
                    self.stop(ts);
                }
                return ts;
            }
            // A stack id is taken and used under the block shard lock, with the stack table
            // stable (even generation): a recycling pass cannot free the id meanwhile.
            let generation = self.stacks.generation();
            if !generation.is_multiple_of(2) {
                drop(shard);
                std::thread::yield_now();
                continue;
            }
            let id = if stack.len == 0 {
                UNKNOWN_STACK
            } else if *tag != 0 && *tag >> 32 == generation & 0xffff_ffff {
                (*tag & 0xffff_ffff) as u32 - 1
            } else {
                match self.stacks.intern(stack) {
                    Interned::Id(id) => {
                        *tag = (generation & 0xffff_ffff) << 32 | (id as u64 + 1);
                        id
                    }
                    Interned::Full if may_recycle => {
                        drop(shard);
                        may_recycle = false;
                        if self.recycle_dead_stacks() == 0 {
                            self.stacks.mark_full_without_dead();
                        }
                        continue;
                    }
                    Interned::Full => UNKNOWN_STACK,
                }
            };
            self.stacks.count_alloc(id, size, ts);
            if shard
                .insert(
                    ptr,
                    Block {
                        size,
                        alloc_ms: self.window_ms(ts),
                        stack: id,
                    },
                )
                .is_some()
            {
                // The address was still recorded: its free happened where no hook saw it.
                self.missed_frees.fetch_add(1, Ordering::Relaxed);
            }
            return ts;
        }
    }

    /// Frees the stack-table entries of stacks with no live block. Rate-limited: after a pass
    /// that freed nothing, the next waits `RECYCLE_RETRY_MS`. Returns how many were freed.
    fn recycle_dead_stacks(&self) -> u64 {
        let now = crate::clock::coarse_millis();
        let last = self.last_failed_recycle_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < RECYCLE_RETRY_MS {
            return 0;
        }
        if !self.stacks.begin_recycling() {
            return 0;
        }
        let mut live = vec![false; self.stacks.slots_in_use_bound()];
        // No deadline: hooks hold a shard only for a table operation.
        let far = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        self.blocks.for_each_shard(far, |shard| {
            for block in shard.values() {
                if let Some(flag) = live.get_mut(block.stack as usize) {
                    *flag = true;
                }
            }
        });
        let freed = self.stacks.finish_recycling(&live);
        self.beats.forget(&freed);
        if freed.is_empty() {
            self.last_failed_recycle_ms
                .store(now.max(1), Ordering::Relaxed);
        }
        freed.len() as u64
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
        let removed = self.blocks.remove(ptr, |block| {
            self.stacks
                .count_free(block.stack, block.size, self.lifetime_ms(block));
        });
        if let Some(block) = removed {
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
            Taken::Block(_) | Taken::Overflow(_) => {}
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
    pub fn restore(&self, ptr: usize, taken: Taken, block_generation: u64) {
        match taken {
            Taken::Block(mut block) => {
                self.stacks
                    .uncount_free(block.stack, block.size, self.lifetime_ms(&block));
                // The block was out of the table while its stack may have been recycled.
                if self.stacks.generation() != block_generation {
                    block.stack = UNKNOWN_STACK;
                    self.stacks
                        .count_alloc(UNKNOWN_STACK, block.size, self.alloc_ns(&block));
                }
                self.blocks.restore(ptr, block)
            }
            Taken::Overflow(size) => self.overflow.restore(ptr, size),
            Taken::NotFound { .. } | Taken::Ignored => {}
        }
    }
}
