//! The block table: every live tracked block of the window, sharded by address so threads
//! rarely share a lock. The cap is split evenly over the shards: a shard that reaches its share
//! sends further blocks to the overflow ledger, which keeps the check free of shared counters.
//!
//! A shard is chosen by the 64 KiB region of the address, not by the address itself. malloc
//! gives each thread its own arena, so a thread's blocks come from its own regions and the
//! thread keeps finding its shards' locks and maps in its own cache; hashing every address
//! would send each thread to every shard and move a cache line between cores at most hooks.
//! Large live sets still spread evenly: a region holds at most a few thousand blocks.

use std::sync::{Mutex, MutexGuard};

use super::block_map::BlockMap;
use super::spin_lock::{SpinGuard, SpinLock};
use crate::hashing::mix;

pub const SHARDS: usize = 64;

/// A live block: what the report needs about it. Kept small: the table holds one per live
/// allocation of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    /// Milliseconds from the window's start (the clock is a coarse one anyway).
    pub alloc_ms: u32,
    pub stack: u32,
}

const _: () = assert!(std::mem::size_of::<Block>() == 16);

pub type Shard = BlockMap;

/// log2 of the address region that maps to one shard.
const REGION_BITS: u32 = 16;

/// One shard on cache lines of its own (two, for the adjacent-line prefetcher), so that two
/// threads using neighbouring shards do not share a line.
#[repr(align(128))]
struct Padded(SpinLock<Shard>);

pub struct BlockTable {
    shards: Box<[Padded]>,
    per_shard_cap: usize,
}

impl BlockTable {
    pub fn new(cap: u64) -> BlockTable {
        let per_shard_cap = (cap as usize).div_ceil(SHARDS).max(1);
        BlockTable {
            shards: (0..SHARDS)
                .map(|_| Padded(SpinLock::new(BlockMap::default())))
                .collect(),
            per_shard_cap,
        }
    }

    /// Whether `shard` holds its share of the cap (and so cannot take `ptr`).
    #[inline]
    pub fn is_full(&self, shard: &Shard, ptr: usize) -> bool {
        shard.len() >= self.per_shard_cap && !shard.contains_key(ptr)
    }

    /// Locks the shard that holds `ptr`.
    #[inline]
    pub fn shard(&self, ptr: usize) -> SpinGuard<'_, Shard> {
        let index = (mix((ptr >> REGION_BITS) as u64) >> 58) as usize;
        self.shards[index].0.lock()
    }

    /// Empties every shard, each under its lock, and frees the maps once the lock is dropped.
    /// Returns whether every shard was visited before `deadline`: only then has every hook that
    /// was inside a shard when the sweep began left it (see `Ledger::release`).
    pub fn release(&self, deadline: std::time::Instant) -> bool {
        let mut all = true;
        for Padded(shard) in self.shards.iter() {
            let taken = match shard.lock_until(deadline) {
                Some(mut guard) => std::mem::take(&mut *guard),
                None => {
                    all = false;
                    continue;
                }
            };
            // Freed outside the lock: hooks waiting for this shard do not wait for the free.
            drop(taken);
        }
        all
    }

    /// Visits every shard, waiting for each lock until `deadline` (then skipping it). Returns the
    /// number of shards that could not be read.
    pub fn for_each_shard(
        &self,
        deadline: std::time::Instant,
        mut visit: impl FnMut(&Shard),
    ) -> u32 {
        let mut unread = 0;
        for Padded(shard) in self.shards.iter() {
            match shard.lock_until(deadline) {
                Some(guard) => visit(&guard),
                None => unread += 1,
            }
        }
        unread
    }
}

/// `try_lock` with a deadline: aggregation never waits forever on a lock whose holder may be a
/// thread frozen in a signal handler.
pub fn lock_until<T>(m: &Mutex<T>, deadline: std::time::Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                if std::time::Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }
}
