//! With sampling by bytes, which freed addresses may be sampled blocks: a counting filter read
//! without a lock, so that the free of an unsampled block (nearly every free) costs one load
//! and is never looked up in the ledger.
//!
//! Each address hashes to one counter; a sampled block's allocation adds one before the block
//! enters the ledger, and its free takes one away after it left. A counter at zero proves that
//! no block of the window hashing there is in the ledger: the free of such an address was made
//! by the program after the allocation returned, so it sees the increment. A non-zero counter
//! may be another block's (a collision), and the free then looks in the ledger as an exact
//! window does. Counters are only ever too high, never too low, so no sampled block's free is
//! missed.

use std::sync::atomic::{AtomicU32, Ordering};

use super::zeroed_array::{Zeroable, ZeroedArray};
use crate::hashing::mix;

// SAFETY: an atomic integer; all-zero bytes are 0.
unsafe impl Zeroable for AtomicU32 {}

/// Counters in the filter: 1 MiB of address space, pages committed as blocks are sampled. A
/// window with 20,000 live samples sends about 8 % of the unsampled frees to the ledger.
const SLOTS: usize = 1 << 18;

pub struct SampledSet {
    /// `None` in an exact window, or when the mapping could not be made (every free is then
    /// looked up, as in an exact window).
    counts: Option<ZeroedArray<AtomicU32>>,
}

impl SampledSet {
    pub fn new(sampling: bool) -> SampledSet {
        SampledSet {
            counts: sampling.then(|| ZeroedArray::new(SLOTS)).flatten(),
        }
    }

    #[inline(always)]
    fn slot(&self, ptr: usize) -> Option<&AtomicU32> {
        let counts = self.counts.as_ref()?;
        counts.get((mix(ptr as u64 >> 4) >> 40) as usize & (SLOTS - 1))
    }

    /// A sampled block at `ptr` is about to enter the ledger.
    #[inline]
    pub fn insert(&self, ptr: usize) {
        if let Some(c) = self.slot(ptr) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A sampled block at `ptr` has left the ledger.
    #[inline]
    pub fn remove(&self, ptr: usize) {
        if let Some(c) = self.slot(ptr) {
            // Never below zero: a counter too low would lose a sampled block's free.
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// False only when no sampled block of the window is at `ptr`.
    #[inline(always)]
    pub fn may_hold(&self, ptr: usize) -> bool {
        self.slot(ptr)
            .is_none_or(|c| c.load(Ordering::Relaxed) != 0)
    }

    /// The window's report is written: the counters' pages go back (the mapping, a megabyte of
    /// address space, stays for hooks that may still read it).
    pub fn release(&self) {
        if let Some(counts) = &self.counts {
            counts.zero_and_give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sampled_blocks_and_misses_the_rest() {
        let set = SampledSet::new(true);
        let sampled: Vec<usize> = (1..=1000).map(|i| 0x7f00_0000_0000 + i * 48).collect();
        for &p in &sampled {
            set.insert(p);
        }
        assert!(sampled.iter().all(|&p| set.may_hold(p)));
        // Addresses never inserted mostly miss (1000 of 262144 counters are set).
        let others = (1..=10_000)
            .filter(|i| set.may_hold(0x5500_0000_0000 + i * 32))
            .count();
        assert!(others < 200, "{others} false hits");
        for &p in &sampled {
            set.remove(p);
        }
        assert!(sampled.iter().all(|&p| !set.may_hold(p)));
        // A removal of what was never inserted leaves the counter at zero.
        set.remove(sampled[0]);
        set.insert(sampled[0]);
        assert!(set.may_hold(sampled[0]));
        set.release();
        assert!(!set.may_hold(sampled[0]));
    }

    #[test]
    fn an_exact_window_has_no_filter() {
        let set = SampledSet::new(false);
        set.insert(0x1000);
        assert!(set.may_hold(0x2000));
    }
}
