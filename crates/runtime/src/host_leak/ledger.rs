//! One window's ledger: the only place host allocations are accounted while the window is open.
//! Nothing leaves the process until the window closes.
//!
//! # Closing: freezing, then giving the memory back
//!
//! A hook finds the ledger through `window::active()` and may go on using a ledger it loaded
//! just before the window closed, for as long as it is descheduled. Counting the hooks in and
//! out would cost every allocation a shared write, so instead the ledger is split by how it is
//! reached:
//!
//! - The header (this struct: settings, flags, striped counters, the locks themselves) is
//!   everything a hook touches without holding one of the ledger's locks. It is never freed
//!   (about 26 KiB per window, with the shard arrays).
//! - The tables (block-table maps, overflow map, stack index and free slots, the stack
//!   counters' mappings, the beat series) are the memory that grows with the program. Each is
//!   touched only while holding a lock: the tables behind a block shard lock (the block map,
//!   and the stack index and counters that `insert`, `take` and `restore` use under it), the
//!   overflow lock, or `gate` (beats and dead-stack recycling, which read the counters with no
//!   shard held). Whoever takes one of these locks checks `closed` (or finds an emptied map)
//!   before touching a table.
//!
//! Once `window::close` has swapped the ledger out, [`Ledger::freeze`] sets `closed`, then
//! takes the overflow lock, `gate` and every block shard lock once. A hook inside a shard when
//! the sweep reaches it is waited for; one that takes the shard later sees `closed` (the store
//! happens before the sweep's unlock, which happens before that hook's lock) and changes
//! nothing. So after the sweep the ledger is still: the report is built from one state.
//!
//! After the report is written, [`Ledger::release`] takes `gate` (kept to the end), empties
//! every block shard under its lock, and the overflow map, stack index, free slots and beat
//! series under theirs (nothing reads those without their lock, so emptying them is safe
//! whatever else happens). Only if `gate` and every shard lock were had before the deadline
//! are the stack counters unmapped: by then every earlier holder has left and every later one
//! sees `closed`. Otherwise they stay mapped (leaked, never faulted on).
//!
//! The hot path pays one relaxed load of `closed` under a shard lock it already holds: no
//! atomic read-modify-write, no fence. Non-hook readers: `window` serialises the interim
//! snapshot with close; the attach channel's live-block count (`live_now`) only takes shard and
//! overflow locks, so it finds empty maps.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use msmemscope_core::host_leak::buckets::bucket_index;
use msmemscope_core::host_leak::truncation;
use msmemscope_core::host_leak::{AllocDomain, CountBytes};

use super::beats::{self, Beats};
use super::block_table::{lock_until, Block, BlockTable};
use super::overflow::OverflowLedger;
use super::settings::WindowSettings;
use super::stack_table::{Interned, StackTable, UNKNOWN_STACK};
use super::striped::StripedCountBytes;
use crate::clock::realtime_ns;
use crate::guard::{Entered, Stripe};
use crate::hashing::mix;
use crate::python::{self, PyStack};
use crate::unwind::{with_stack, with_stack_above, CapturedStack};

/// After a recycling pass that freed nothing, wait this long before scanning again.
const RECYCLE_RETRY_MS: u64 = 50;

/// How long the closing beat waits for a beat or recycling pass in progress.
const CLOSING_BEAT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// Tracked allocations made through CPython's own allocators (Python objects).
    pub python_allocations: StripedCountBytes,
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
    /// Set when the window closes ([`Ledger::freeze`], before its report is built); from then
    /// on no hook changes the ledger, and after the report its tables are given back (module
    /// comment). Read under the lock that guards the table about to be touched.
    closed: AtomicBool,
    /// Held by beats and dead-stack recycling (the counter readers that hold no block shard),
    /// and taken by [`Ledger::freeze`] and [`Ledger::release`] to wait them out.
    gate: Mutex<()>,
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
        python::set_depth(settings.python_depth);
        let start_ns = realtime_ns();
        Ledger {
            beats: Beats::new(start_ns, settings.beat_ms, settings.beat_fixed),
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
            python_allocations: StripedCountBytes::default(),
            prewindow_frees: std::array::from_fn(|_| StripedCountBytes::default()),
            missed_frees: AtomicU64::new(0),
            last_failed_recycle_ms: AtomicU64::new(0),
            snapshot_running: AtomicBool::new(false),
            snapshot_arrivals: AtomicU64::new(0),
            snapshot_arrival_bytes: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            gate: Mutex::new(()),
        }
    }

    fn lock_gate(&self) -> MutexGuard<'_, ()> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the accounting of a window that is closing, before its report is built: from now
    /// on hooks that loaded this ledger before the window closed change nothing, and once this
    /// returns none is still changing anything, so the report sees one consistent state (a
    /// site's allocated - freed is its unfreed). Waits for each lock until `deadline`; `false`
    /// when some holder did not leave by then.
    pub fn freeze(&self, deadline: Instant) -> bool {
        self.closed.store(true, Ordering::Release);
        let overflow = self.overflow.close(deadline);
        // A beat or recycling pass under way finishes; later ones see `closed`.
        let gate = lock_until(&self.gate, deadline).is_some();
        // Each shard's holder leaves, and later holders see `closed` (module comment).
        let shards = self.blocks.for_each_shard(deadline, |_| {}) == 0;
        overflow && gate && shards
    }

    /// Gives back the tables of a window whose report is written (see the module comment for
    /// why no hook can touch them afterwards). The header stays: hooks that loaded this ledger
    /// before the window closed may still read it. Waits for each lock until `deadline`; returns
    /// whether everything was given back (else the counters' mappings stay).
    pub fn release(&self, deadline: Instant) -> bool {
        // Normally set by `freeze` already.
        self.closed.store(true, Ordering::Release);
        // Kept to the end: a beat or recycling pass that started before `closed` was set has
        // finished, and one after it sees `closed` once it has the gate.
        let gate = lock_until(&self.gate, deadline);
        let swept = self.blocks.release(deadline);
        let mut all = self.overflow.release(deadline);
        all &= self.stacks.release_index(deadline);
        all &= self.beats.release(deadline);
        if gate.is_some() && swept {
            // SAFETY: counters are used only under a block shard lock or `gate`, by a thread that
            // checked `closed` after taking it (or by close and the snapshot, which `window`
            // serialises with this call). `gate` is held, and every shard was locked after
            // `closed` was set, so every earlier holder has left and every later one sees it.
            unsafe { self.stacks.release_counters() };
        } else {
            all = false;
        }
        drop(gate);
        all && swept
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
    #[inline(always)]
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

    /// Whether a new block of `size` at `ptr` enters the ledger (threshold, sampling, and
    /// accounting still going); counts those that do not.
    #[inline(always)]
    fn admits(&self, ptr: usize, size: u64, stripe: Stripe) -> bool {
        if size < self.settings.block_size_threshold {
            self.untracked_below_threshold.add(size, stripe);
            return false;
        }
        if !self.sampled(ptr) {
            self.untracked_sampled.add(size, stripe);
            return false;
        }
        if self.stopped.load(Ordering::Relaxed) {
            return false;
        }
        if let Some(at) = crate::private_alloc::out_of_memory_since() {
            // The runtime lives on its reserve now: recording more would use it up.
            self.truncation
                .fetch_or(truncation::RUNTIME_OUT_OF_MEMORY, Ordering::Relaxed);
            self.stop(at);
            return false;
        }
        true
    }

    /// What every tracked allocation does after its block is in: the snapshot's count of
    /// arrivals, and the beat when one is due.
    #[inline(always)]
    fn after_insert(&self, size: u64, ts: u64) {
        if self.snapshot_running.load(Ordering::Relaxed) {
            self.snapshot_arrivals.fetch_add(1, Ordering::Relaxed);
            self.snapshot_arrival_bytes
                .fetch_add(size, Ordering::Relaxed);
        }
        if let Some(beat) = self.beats.due(ts) {
            self.take_beat(beat, false);
        }
    }

    /// Records a block CPython's own allocator handed out (a Python object), made by the thread
    /// that holds `entered`: keyed by its Python frames alone.
    #[inline]
    pub fn on_python_alloc(&self, ptr: usize, size: usize, entered: &Entered) {
        let size = size as u64;
        let stripe = entered.stripe();
        if !self.admits(ptr, size, stripe) {
            return;
        }
        self.python_allocations.add(size, stripe);
        let mut py = PyStack::empty();
        python::capture(&mut py);
        let ts = self.insert(
            ptr,
            size,
            &CapturedStack::empty(),
            &py,
            &mut 0,
            stripe,
            AllocDomain::Pymalloc,
        );
        self.after_insert(size, ts);
    }

    /// Records a successful allocation, made by the thread that holds `entered`.
    #[inline(always)]
    pub fn on_alloc(&self, ptr: usize, size: usize, entered: &Entered) -> bool {
        let size = size as u64;
        let stripe = entered.stripe();
        if !self.admits(ptr, size, stripe) {
            return false;
        }
        // A process without Python (or with its frames off) skips the frame buffer: filling
        // it costs more than the rest of a memoized allocation's bookkeeping.
        let ts = if python::active() {
            let mut py = PyStack::empty();
            python::capture(&mut py);
            // With Python frames the key keeps only the C frames above the interpreter's, so
            // the walk ends there.
            match python::interpreter_code().filter(|_| py.len > 0) {
                Some(code) => with_stack_above(entered, code, |stack, tag| {
                    self.insert(ptr, size, stack, &py, tag, stripe, AllocDomain::Malloc)
                }),
                None => with_stack(Some(entered), |stack, tag| {
                    self.insert(ptr, size, stack, &py, tag, stripe, AllocDomain::Malloc)
                }),
            }
        } else {
            with_stack(Some(entered), |stack, tag| {
                self.insert(
                    ptr,
                    size,
                    stack,
                    &python::NO_FRAMES,
                    tag,
                    stripe,
                    AllocDomain::Malloc,
                )
            })
        };
        self.after_insert(size, ts);
        true
    }

    /// Samples every stack's live memory into the beat series at `beat` (starting beats,
    /// `Beats::beat_at`). A program thread skips the beat
    /// when another is taking one (or recycling); the closing sample waits for its turn.
    pub fn take_beat(&self, beat: f64, closing: bool) {
        let _gate = if closing {
            // A thread frozen inside a beat or a recycling pass must not hold the report: the
            // closing sample is then left out, as the aggregation leaves out a busy shard.
            match lock_until(&self.gate, Instant::now() + CLOSING_BEAT_WAIT) {
                Some(gate) => gate,
                None => return,
            }
        } else {
            match self.gate.try_lock() {
                Ok(gate) => gate,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            }
        };
        // The counters may be unmapped once the window closed (see the module comment). The
        // closing sample is taken by close itself, between `freeze` and `release`.
        if !closing && self.closed.load(Ordering::Relaxed) {
            return;
        }
        let started = realtime_ns();
        let mut live = Vec::with_capacity(2 * beats::TOP_K);
        let mut floor = 0;
        self.stacks.for_each_live(|id, cb| {
            if cb.bytes < floor {
                return;
            }
            if live.len() == 2 * beats::TOP_K {
                floor = beats::keep_top_k(&mut live);
            }
            live.push((id, cb));
        });
        self.beats.record(beat, &mut live, closing);
        if !closing {
            let now = realtime_ns();
            let took = now.saturating_sub(started);
            self.beats
                .hold_off(now.saturating_add(took.saturating_mul(beats::BEAT_COST_RATIO)));
        }
    }

    /// Inserts a block allocated from `stack` while Python code ran `py` (empty without it).
    /// `tag` is the C stack's memo tag, where the stack's id is kept with the stack-table
    /// generation it is valid in: `generation << 32 | id + 1`; it is only used for allocations
    /// without Python frames, since one C stack serves many Python callers. Returns the
    /// allocation's timestamp.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        ptr: usize,
        size: u64,
        stack: &CapturedStack,
        py: &PyStack,
        tag: &mut u64,
        stripe: Stripe,
        domain: AllocDomain,
    ) -> u64 {
        let ts = realtime_ns();
        let mut may_recycle = true;
        loop {
            let mut shard = self.blocks.shard(ptr);
            // Under the shard lock: the window's tables are still there (module comment).
            if self.closed.load(Ordering::Relaxed) {
                return ts;
            }
            if self.blocks.is_full(&shard, ptr) {
                drop(shard);
                self.to_overflow(ptr, size, ts);
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
            let mut depth = stack.len.min(self.settings.c_depth);
            // With Python frames, the Python depth decides whether callers were merged.
            let cut = if py.len > 0 {
                depth = python::frames_above_interpreter(&stack.frames[..depth]);
                py.cut
            } else {
                stack.cut || depth < stack.len
            };
            let truncated;
            let stack = if depth < stack.len {
                truncated = CapturedStack {
                    len: depth,
                    ..*stack
                };
                &truncated
            } else {
                stack
            };
            let memoized = py.len == 0;
            let id = if stack.len == 0 && py.len == 0 {
                UNKNOWN_STACK
            } else if memoized && *tag != 0 && *tag >> 32 == generation & 0xffff_ffff {
                (*tag & 0xffff_ffff) as u32 - 1
            } else {
                match self.stacks.intern(stack, py, cut, domain) {
                    Interned::Id(id) => {
                        if memoized {
                            *tag = (generation & 0xffff_ffff) << 32 | (id as u64 + 1);
                        }
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
            let block = Block {
                size,
                alloc_ms: self.window_ms(ts),
                stack: id,
            };
            match shard.insert(ptr, block) {
                Ok(replaced) => {
                    self.stacks.count_alloc(id, size, ts, stripe);
                    if replaced.is_some() {
                        // The address was still recorded: its free happened where no hook saw it.
                        self.missed_frees.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // No memory for a bigger shard: kept without its stack, as past the cap.
                Err(_) => {
                    drop(shard);
                    self.to_overflow(ptr, size, ts);
                }
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
        let _gate = self.lock_gate();
        if self.closed.load(Ordering::Relaxed) || !self.stacks.begin_recycling() {
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

    /// Accounts a block the block table cannot take, without its stack.
    fn to_overflow(&self, ptr: usize, size: u64, ts: u64) {
        self.truncation
            .fetch_or(truncation::BLOCK_TABLE_FULL, Ordering::Relaxed);
        if !self.overflow.insert(ptr, size) {
            self.stop(ts);
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
    // Always inlined: the hooks' free path shares the thread-local lookups with it.
    #[inline(always)]
    pub fn take(&self, ptr: usize, entered: &Entered) -> Taken {
        self.take_with(ptr, entered, || crate::forward::usable_size(ptr) as u64)
    }

    /// [`Ledger::take`] for a block of CPython's own allocator, whose size `malloc` cannot
    /// tell: a block the ledger does not hold (made before the window or before the wrappers
    /// went in) is `NotFound` with no size, and is not settled.
    #[inline(always)]
    pub fn take_python(&self, ptr: usize, entered: &Entered) -> Taken {
        self.take_with(ptr, entered, || 0)
    }

    #[inline(always)]
    fn take_with(&self, ptr: usize, entered: &Entered, usable: impl FnOnce() -> u64) -> Taken {
        if self.stopped.load(Ordering::Relaxed) {
            return Taken::Ignored;
        }
        // One unlock site for every path: the unlock and its wake-up path are inlined once.
        let removed = {
            let mut shard = self.blocks.shard(ptr);
            // A closing window is frozen (see `freeze`): the block stays in its report.
            if self.closed.load(Ordering::Relaxed) {
                Err(())
            } else {
                let block = shard.remove(ptr);
                if let Some(block) = &block {
                    // Still under the shard lock: a recycling pass sees either the block or
                    // its free.
                    self.stacks.count_free(
                        block.stack,
                        block.size,
                        self.lifetime_ms(block),
                        entered.stripe(),
                    );
                }
                Ok(block)
            }
        };
        match removed {
            Err(()) => return Taken::Ignored,
            Ok(Some(block)) => return Taken::Block(block),
            Ok(None) => {}
        }
        if let Some(size) = self.overflow.remove(ptr) {
            return Taken::Overflow(size);
        }
        Taken::NotFound { usable: usable() }
    }

    /// Accounts a free whose block was taken with [`Ledger::take`].
    #[inline]
    pub fn settle_free(&self, ptr: usize, taken: Taken, entered: &Entered) {
        match taken {
            Taken::Block(_) | Taken::Overflow(_) => {}
            Taken::NotFound { usable } => {
                if !self.sampled(ptr) || usable < self.settings.block_size_threshold {
                    // Most likely a block below the threshold, allocated in the window. The
                    // usable size can exceed the request by up to one allocator granule, so a
                    // block just under the threshold may be counted as pre-window instead.
                    self.frees_untracked.add(usable, entered.stripe());
                } else {
                    self.prewindow_frees[bucket_index(usable)].add(usable, entered.stripe());
                }
            }
            Taken::Ignored => {}
        }
    }

    /// Puts back what [`Ledger::take`] removed, when the `realloc` that followed failed.
    pub fn restore(&self, ptr: usize, taken: Taken, block_generation: u64, entered: &Entered) {
        let stripe = entered.stripe();
        match taken {
            Taken::Block(mut block) => {
                // The counters are touched under the shard lock, as in `insert` and `take`.
                let mut shard = self.blocks.shard(ptr);
                if self.closed.load(Ordering::Relaxed) {
                    return;
                }
                self.stacks
                    .uncount_free(block.stack, block.size, self.lifetime_ms(&block), stripe);
                // The block was out of the table while its stack may have been recycled.
                if self.stacks.generation() != block_generation {
                    block.stack = UNKNOWN_STACK;
                    self.stacks.count_alloc(
                        UNKNOWN_STACK,
                        block.size,
                        self.alloc_ns(&block),
                        stripe,
                    );
                }
                // The shard held this block a moment ago, so it has room without growing; were
                // it to fail, the block stays counted as freed.
                if shard.insert(ptr, block).is_err() {
                    self.stacks.count_free(
                        block.stack,
                        block.size,
                        self.lifetime_ms(&block),
                        stripe,
                    );
                }
            }
            Taken::Overflow(size) => self.overflow.restore(ptr, size),
            Taken::NotFound { .. } | Taken::Ignored => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msmemscope_core::config::HostLeakMode;

    fn settings() -> WindowSettings {
        WindowSettings {
            mode: HostLeakMode::Summary,
            block_size_threshold: 0,
            sample_rate: 1,
            sample_rate_requested: 1,
            block_cap: 1 << 16,
            overflow_cap: 1 << 10,
            stack_cap: 1 << 12,
            top_n: 10,
            beat_ms: 10,
            c_depth: crate::unwind::MAX_FRAMES,
            python_depth: 0,
            python_objects: true,
            beat_fixed: true,
        }
    }

    /// The guard, as a hook holds it (the tests run outside any hook).
    fn entered() -> Entered {
        Entered::try_enter().expect("not inside the runtime")
    }

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(30)
    }

    /// Real blocks: a free of a block the ledger does not know reads its usable size.
    fn blocks(n: usize) -> Vec<usize> {
        // SAFETY: plain glibc allocations (the hooks are not exported in unit tests).
        (0..n)
            .map(|_| unsafe { libc::malloc(64) } as usize)
            .collect()
    }

    fn free_all(ptrs: &[usize]) {
        for &p in ptrs {
            // SAFETY: each came from `blocks` and is freed once.
            unsafe { libc::free(p as *mut libc::c_void) };
        }
    }

    fn live_blocks(ledger: &Ledger) -> u64 {
        ledger.live_now(far()).0.count
    }

    #[test]
    fn a_frozen_ledger_ignores_late_hooks_and_a_released_one_is_empty() {
        let ledger = Ledger::new(settings(), 1);
        let ptrs = blocks(8);
        for &p in &ptrs[..4] {
            ledger.on_alloc(p, 64, &entered());
        }
        assert_eq!(live_blocks(&ledger), 4);
        let taken = ledger.take(ptrs[0], &entered());
        assert!(matches!(taken, Taken::Block(_)));
        assert!(ledger.freeze(far()));
        // Hooks that loaded the ledger before it closed change nothing: no block, no free.
        for &p in &ptrs[4..] {
            ledger.on_alloc(p, 64, &entered());
        }
        assert!(matches!(ledger.take(ptrs[1], &entered()), Taken::Ignored));
        ledger.take_beat(1.0, false);
        // A realloc whose real call failed after the window closed puts nothing back.
        ledger.restore(ptrs[0], taken, ledger.stacks.generation(), &entered());
        assert_eq!(live_blocks(&ledger), 3);
        let (stacks, unknown, _) = ledger.stacks.collect(far(), |_| true);
        let allocated: u64 =
            stacks.iter().map(|s| s.counts.allocated.count).sum::<u64>() + unknown.allocated.count;
        let freed: u64 =
            stacks.iter().map(|s| s.counts.freed.count).sum::<u64>() + unknown.freed.count;
        assert_eq!((allocated, freed), (4, 1));
        assert_eq!(
            ledger.stacks.allocated_total().count + unknown.allocated.count,
            4
        );
        // The closing sample is still taken between freeze and release.
        ledger.take_beat(1.0, true);
        assert_eq!(ledger.beats.summary().beats_taken, 1);

        assert!(ledger.release(far()));
        assert_eq!(live_blocks(&ledger), 0);
        ledger.on_alloc(ptrs[4], 64, &entered());
        ledger.take_beat(2.0, false);
        assert!(matches!(ledger.take(ptrs[2], &entered()), Taken::Ignored));
        assert_eq!(live_blocks(&ledger), 0);
        let (stacks, unknown, unread) = ledger.stacks.collect(far(), |_| true);
        assert!(stacks.is_empty());
        assert_eq!(unknown.allocated.count, 0);
        assert_eq!(unread, 0);
        assert_eq!(ledger.beats.summary().series, 0);
        // Twice is harmless.
        assert!(ledger.release(far()));
        free_all(&ptrs);
    }

    #[test]
    fn release_races_hooks_on_other_threads() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        for _ in 0..20 {
            // Leaked, as a window's ledger is: the threads may still read its header.
            let ledger: &'static Ledger = Box::leak(Box::new(Ledger::new(settings(), 1)));
            let go = Arc::new(AtomicBool::new(true));
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let go = go.clone();
                    std::thread::spawn(move || {
                        let ptrs = blocks(64);
                        while go.load(Ordering::Relaxed) {
                            for &p in &ptrs {
                                ledger.on_alloc(p, 64, &entered());
                            }
                            for &p in &ptrs {
                                let taken = ledger.take(p, &entered());
                                ledger.settle_free(p, taken, &entered());
                            }
                            let beat = ledger.beats.beat_at(realtime_ns());
                            ledger.take_beat(beat, false);
                        }
                        free_all(&ptrs);
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert!(ledger.freeze(far()));
            let frozen = live_blocks(ledger);
            std::thread::sleep(std::time::Duration::from_millis(1));
            assert_eq!(
                live_blocks(ledger),
                frozen,
                "a late hook changed a frozen ledger"
            );
            assert!(ledger.release(far()));
            std::thread::sleep(std::time::Duration::from_millis(2));
            assert_eq!(live_blocks(ledger), 0, "a late hook grew a released table");
            go.store(false, Ordering::Relaxed);
            for t in threads {
                t.join().unwrap();
            }
        }
    }

    /// What stays of a closed window: the header, whose size the tests of repeated windows
    /// allow for.
    #[test]
    fn the_header_is_small() {
        let size = std::mem::size_of::<Ledger>();
        assert!(size < 40 * 1024, "Ledger header is {size} bytes");
    }
}
