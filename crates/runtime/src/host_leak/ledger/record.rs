//! The allocation side of the ledger: which blocks enter it, their stacks, the beats they
//! trigger, and what happens when a table is full.

use std::sync::atomic::Ordering;
use std::time::Instant;

use msmemscope_core::host_leak::truncation;
use msmemscope_core::host_leak::AllocDomain;

use super::{Ledger, CLOSING_BEAT_WAIT, RECYCLE_RETRY_MS};
use crate::clock::realtime_ns;
use crate::guard::{Entered, Stripe};
use crate::host_leak::beats;
use crate::host_leak::block_table::{lock_until, Block};
use crate::host_leak::stack_table::{Interned, UNKNOWN_STACK};
use crate::python::{self, PyStack};
use crate::unwind::{with_stack, with_stack_above, CapturedStack};

impl Ledger {
    /// Whether a new block of `size` at `ptr` enters the ledger (threshold, sampling, and
    /// accounting still going); counts those that do not, except the blocks sampling by bytes
    /// passes over: their path is the thread's countdown alone.
    #[inline(always)]
    fn admits(&self, ptr: usize, size: u64, entered: &Entered, stripe: Stripe) -> bool {
        if size < self.settings.block_size_threshold {
            self.untracked_below_threshold.add(size, stripe);
            return false;
        }
        let mean = self.settings.sample_bytes;
        if mean != 0 {
            if !entered.take_sample(size, mean) {
                return false;
            }
        } else if !self.sampled(ptr) {
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
        if !self.admits(ptr, size, entered, stripe) {
            return;
        }
        self.python_allocations.add_blocks(self.weigh(size), stripe);
        self.sampled_set.insert(ptr);
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
        if !self.admits(ptr, size, entered, stripe) {
            return false;
        }
        // Before the block is in: its free, which comes after this returns, finds it counted.
        self.sampled_set.insert(ptr);
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
                    self.stacks.count_alloc(id, self.weigh(size), ts, stripe);
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
}
