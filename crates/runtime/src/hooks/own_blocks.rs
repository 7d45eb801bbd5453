//! Blocks that glibc allocated through the hooks on the runtime's behalf while a window was
//! open: the allocation passed through untracked (the reentrancy guard was held), but glibc may
//! free the block later from the program's own context, where the ledger would not know it and
//! count a pre-window free. The case that matters: the runtime's thread-locals with destructors
//! make `__cxa_thread_atexit_impl` `calloc` a destructor-list entry inside the first hook of
//! each thread, and glibc frees it at thread exit through the `free` hook. The free of an address
//! found here is dropped silently.
//!
//! A fixed table in static memory (never allocates, takes no lock): each address has a window
//! of `PROBE` slots, and a lookup scans the whole window, so removal needs no tombstones. A
//! window fills only with thousands of such blocks alive at once (thousands of live threads);
//! an address that finds its window full is not remembered, and its free counts as a
//! pre-window free, as it did before this table.

use std::sync::atomic::{AtomicUsize, Ordering};

const SLOTS: usize = 1 << 14;
const PROBE: usize = 16;

static TABLE: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Addresses in the table: while it is 0, lookups cost one load.
static LEN: AtomicUsize = AtomicUsize::new(0);

#[inline]
fn home(addr: usize) -> usize {
    (crate::hashing::mix(addr as u64 >> 4) as usize) & (SLOTS - 1)
}

#[inline]
fn slot(home: usize, i: usize) -> &'static AtomicUsize {
    &TABLE[(home + i) & (SLOTS - 1)]
}

/// Remembers `addr` (allocated for the runtime). Returns false when its window is full.
pub fn insert(addr: usize) -> bool {
    if addr == 0 {
        return false;
    }
    let home = home(addr);
    // The address was handed out again, so an entry for it is stale: keep just one.
    if (0..PROBE).any(|i| slot(home, i).load(Ordering::Relaxed) == addr) {
        return true;
    }
    for i in 0..PROBE {
        if slot(home, i)
            .compare_exchange(0, addr, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            LEN.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

/// Forgets `addr`; returns whether it was remembered.
#[inline]
pub fn remove(addr: usize) -> bool {
    if LEN.load(Ordering::Relaxed) == 0 || addr == 0 {
        return false;
    }
    let home = home(addr);
    for i in 0..PROBE {
        let s = slot(home, i);
        if s.load(Ordering::Relaxed) == addr
            && s.compare_exchange(addr, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            LEN.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_bounds() {
        // Addresses no allocator hands out in this test process (the table is shared).
        let base = 0x7fff_dead_0000usize;
        assert!(!remove(base));
        assert!(insert(base));
        assert!(insert(base), "a repeated address is kept once");
        assert!(remove(base));
        assert!(!remove(base));
        // Far more addresses than one window holds: every one that was taken is found.
        let taken: Vec<usize> = (0..4 * PROBE * 1024)
            .map(|i| base + 0x1_0000 + i * 16)
            .filter(|&a| insert(a))
            .collect();
        assert!(taken.len() >= SLOTS / 2, "{} of {SLOTS}", taken.len());
        for a in &taken {
            assert!(remove(*a));
        }
    }
}
