//! The free side of the ledger: a block leaves before the real `free` or `realloc` runs, and
//! comes back if the `realloc` failed.

use std::sync::atomic::Ordering;

use msmemscope_core::host_leak::buckets::bucket_index;

use super::{Ledger, Taken};
use crate::guard::{Entered, Stripe};
use crate::host_leak::block_table::Block;
use crate::host_leak::stack_table::UNKNOWN_STACK;

impl Ledger {
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
        // Sampling by bytes: nearly every free is of an unsampled block, told by one load.
        if !self.sampled_set.may_hold(ptr) {
            return Taken::Unsampled;
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
                    self.count_free(block, entered.stripe());
                    self.sampled_set.remove(ptr);
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
            self.sampled_set.remove(ptr);
            return Taken::Overflow(size);
        }
        if self.settings.sample_bytes != 0 {
            // Another block's counter in the filter: this one was not sampled.
            return Taken::Unsampled;
        }
        Taken::NotFound { usable: usable() }
    }

    /// Counts the free of `block`, taken out of its shard (whose lock is held): its weight, and
    /// its lifetime once per block it stands for, so the mean lifetime is over the estimate.
    #[inline(always)]
    fn count_free(&self, block: &Block, stripe: Stripe) {
        let weight = self.weigh(block.size);
        let lifetime_ms = self.lifetime_ms(block).saturating_mul(weight.count);
        self.stacks
            .count_free(block.stack, weight, lifetime_ms, stripe);
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
            Taken::Ignored | Taken::Unsampled => {}
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
                let weight = self.weigh(block.size);
                let lifetime_ms = self.lifetime_ms(&block).saturating_mul(weight.count);
                self.stacks
                    .uncount_free(block.stack, weight, lifetime_ms, stripe);
                // The block was out of the table while its stack may have been recycled.
                if self.stacks.generation() != block_generation {
                    block.stack = UNKNOWN_STACK;
                    self.stacks
                        .count_alloc(UNKNOWN_STACK, weight, self.alloc_ns(&block), stripe);
                }
                self.sampled_set.insert(ptr);
                // The shard held this block a moment ago, so it has room without growing; were
                // it to fail, the block stays counted as freed.
                if shard.insert(ptr, block).is_err() {
                    self.count_free(&block, stripe);
                }
            }
            Taken::Overflow(size) => {
                self.sampled_set.insert(ptr);
                self.overflow.restore(ptr, size)
            }
            Taken::NotFound { .. } | Taken::Ignored | Taken::Unsampled => {}
        }
    }
}
