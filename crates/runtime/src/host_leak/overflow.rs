//! The overflow ledger: blocks that arrived after the block table reached its cap, kept without
//! stacks so that totals stay exact. When it is full as well, accounting stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use msmemscope_core::host_leak::CountBytes;

use super::block_table::lock_until;
use crate::hashing::FastHash;

#[derive(Default)]
struct Inner {
    live: HashMap<usize, u64, FastHash>,
    allocations: CountBytes,
    frees: CountBytes,
    /// Set when the window closes: nothing changes any more (a hook may still reach here after
    /// the window closed; it must neither change the report nor grow a released map).
    closed: bool,
}

pub struct OverflowLedger {
    inner: Mutex<Inner>,
    cap: usize,
    /// Set once anything was ever stored: frees skip the lock until then.
    used: AtomicBool,
}

pub struct OverflowState {
    pub live: Vec<(usize, u64)>,
    pub allocations: CountBytes,
    pub frees: CountBytes,
}

impl OverflowLedger {
    pub fn new(cap: u64) -> OverflowLedger {
        OverflowLedger {
            inner: Mutex::default(),
            cap: cap as usize,
            used: AtomicBool::new(false),
        }
    }

    pub fn cap(&self) -> u64 {
        self.cap as u64
    }

    /// Stores a block; `false` when the ledger is full.
    pub fn insert(&self, ptr: usize, size: u64) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.closed {
            // The window is closed: nothing to account, and no reason to stop.
            return true;
        }
        if inner.live.len() >= self.cap && !inner.live.contains_key(&ptr) {
            return false;
        }
        self.used.store(true, Ordering::Relaxed);
        inner.live.insert(ptr, size);
        inner.allocations.add(size);
        true
    }

    /// Removes a block if it is here; returns its size.
    #[inline]
    pub fn remove(&self, ptr: usize) -> Option<u64> {
        if !self.used.load(Ordering::Relaxed) {
            return None;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.closed {
            return None;
        }
        let size = inner.live.remove(&ptr)?;
        inner.frees.add(size);
        Some(size)
    }

    /// Puts back a block removed by a failed `realloc` (its free is undone).
    pub fn restore(&self, ptr: usize, size: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.closed {
            return;
        }
        inner.live.insert(ptr, size);
        inner.frees.count -= 1;
        inner.frees.bytes -= size;
    }

    /// Freezes the ledger (the window is closing). `false` when the lock could not be had
    /// before `deadline`.
    pub fn close(&self, deadline: Instant) -> bool {
        let Some(mut inner) = lock_until(&self.inner, deadline) else {
            return false;
        };
        inner.closed = true;
        true
    }

    /// Gives the map back (the window closed and its report is written). `false` when the lock
    /// could not be had before `deadline` (the map then stays).
    pub fn release(&self, deadline: Instant) -> bool {
        let Some(mut inner) = lock_until(&self.inner, deadline) else {
            return false;
        };
        inner.closed = true;
        let live = std::mem::take(&mut inner.live);
        drop(inner);
        drop(live);
        true
    }

    pub fn collect(&self, deadline: Instant) -> Option<OverflowState> {
        let inner = lock_until(&self.inner, deadline)?;
        Some(OverflowState {
            live: inner.live.iter().map(|(&p, &s)| (p, s)).collect(),
            allocations: inner.allocations,
            frees: inner.frees,
        })
    }
}
