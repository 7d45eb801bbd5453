//! The stack table: one entry per distinct stack key (first 20 frames) with the stack's
//! allocation, free and live counts. Capped; when full, stacks whose blocks are all freed
//! ("dead") are recycled and their history folded into the unknown bucket; when none is dead,
//! new stacks go to the unknown bucket.
//!
//! A stack id carries its shard in the low 6 bits and its slot above them.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use msmemscope_core::host_leak::CountBytes;

use super::block_table::lock_until;
use super::hashing::FastHash;
use crate::unwind::{CapturedStack, MAX_FRAMES};

pub const UNKNOWN_STACK: u32 = u32::MAX;
const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;
/// After a recycling pass found nothing, wait this long before scanning again.
const RECYCLE_RETRY_MS: u64 = 50;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackStats {
    pub allocated: CountBytes,
    pub freed: CountBytes,
    pub live: CountBytes,
    pub last_alloc_ns: u64,
}

impl StackStats {
    #[inline]
    fn on_alloc(&mut self, size: u64, ts: u64) {
        self.allocated.add(size);
        self.live.add(size);
        self.last_alloc_ns = ts;
    }

    #[inline]
    fn on_free(&mut self, size: u64) {
        self.freed.add(size);
        self.live.count = self.live.count.saturating_sub(1);
        self.live.bytes = self.live.bytes.saturating_sub(size);
    }
}

#[derive(Clone, Copy)]
struct StackKey(CapturedStack);

impl PartialEq for StackKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_slice() == other.0.as_slice()
    }
}
impl Eq for StackKey {}
impl Hash for StackKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for &f in self.0.as_slice() {
            state.write_u64(f);
        }
    }
}

#[derive(Default)]
struct Shard {
    index: HashMap<StackKey, u32, FastHash>,
    slots: Vec<StackStats>,
    free_slots: Vec<u32>,
}

/// A stack as the window-close aggregation sees it.
pub struct StackRecord {
    pub id: u32,
    pub frames: Vec<u64>,
    pub stats: StackStats,
}

pub struct StackTable {
    shards: Box<[Mutex<Shard>]>,
    cap: u64,
    entries: AtomicU64,
    interned: AtomicU64,
    recycled: AtomicU64,
    unknown: Mutex<StackStats>,
    unattributed_allocs: AtomicU64,
    full_without_dead: AtomicBool,
    last_failed_recycle_ms: AtomicU64,
}

impl StackTable {
    pub fn new(cap: u64) -> StackTable {
        StackTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            cap,
            entries: AtomicU64::new(0),
            interned: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            unknown: Mutex::new(StackStats::default()),
            unattributed_allocs: AtomicU64::new(0),
            full_without_dead: AtomicBool::new(false),
            last_failed_recycle_ms: AtomicU64::new(0),
        }
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_unknown(&self) -> MutexGuard<'_, StackStats> {
        self.unknown.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an allocation of `size` bytes against `stack` and returns the stack's id.
    pub fn on_alloc(&self, stack: &CapturedStack, size: u64, ts: u64) -> u32 {
        if stack.len == 0 {
            return self.to_unknown(size, ts);
        }
        let key = StackKey(*stack);
        let shard_index = (FastHash.hash_one(key) as usize) & (SHARDS - 1);
        for attempt in 0..2 {
            let mut shard = self.lock(shard_index);
            if let Some(&slot) = shard.index.get(&key) {
                shard.slots[slot as usize].on_alloc(size, ts);
                return (slot << SHARD_BITS) | shard_index as u32;
            }
            if self.reserve_entry() {
                let slot = match shard.free_slots.pop() {
                    Some(slot) => slot,
                    None => {
                        shard.slots.push(StackStats::default());
                        (shard.slots.len() - 1) as u32
                    }
                };
                let mut stats = StackStats::default();
                stats.on_alloc(size, ts);
                shard.slots[slot as usize] = stats;
                shard.index.insert(key, slot);
                self.interned.fetch_add(1, Ordering::Relaxed);
                return (slot << SHARD_BITS) | shard_index as u32;
            }
            drop(shard);
            if attempt == 0 && !self.recycle_dead() {
                break;
            }
        }
        self.full_without_dead.store(true, Ordering::Relaxed);
        self.to_unknown(size, ts)
    }

    fn to_unknown(&self, size: u64, ts: u64) -> u32 {
        self.unattributed_allocs.fetch_add(1, Ordering::Relaxed);
        self.lock_unknown().on_alloc(size, ts);
        UNKNOWN_STACK
    }

    /// Counts the free of a block of `size` bytes that was allocated from stack `id`.
    pub fn on_free(&self, id: u32, size: u64) {
        if id == UNKNOWN_STACK {
            self.lock_unknown().on_free(size);
            return;
        }
        let mut shard = self.lock((id as usize) & (SHARDS - 1));
        if let Some(stats) = shard.slots.get_mut((id >> SHARD_BITS) as usize) {
            stats.on_free(size);
        }
    }

    fn reserve_entry(&self) -> bool {
        self.entries
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }

    /// Frees the entries of stacks with no live block, folding their counts into the unknown
    /// bucket. Returns whether any entry was freed.
    fn recycle_dead(&self) -> bool {
        let now = crate::clock::coarse_millis();
        let last = self.last_failed_recycle_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < RECYCLE_RETRY_MS {
            return false;
        }
        let mut freed = 0u64;
        for i in 0..SHARDS {
            let mut shard = self.lock(i);
            let Shard {
                index,
                slots,
                free_slots,
            } = &mut *shard;
            index.retain(|_, slot| {
                let stats = slots[*slot as usize];
                if stats.live.count > 0 {
                    return true;
                }
                let mut unknown = self.lock_unknown();
                unknown.allocated.merge(stats.allocated);
                unknown.freed.merge(stats.freed);
                free_slots.push(*slot);
                freed += 1;
                false
            });
        }
        if freed == 0 {
            self.last_failed_recycle_ms
                .store(now.max(1), Ordering::Relaxed);
            return false;
        }
        self.entries.fetch_sub(freed, Ordering::Relaxed);
        self.recycled.fetch_add(freed, Ordering::Relaxed);
        true
    }

    pub fn table_full_without_dead(&self) -> bool {
        self.full_without_dead.load(Ordering::Relaxed)
    }

    pub fn interned(&self) -> u64 {
        self.interned.load(Ordering::Relaxed)
    }

    pub fn recycled(&self) -> u64 {
        self.recycled.load(Ordering::Relaxed)
    }

    pub fn unattributed_allocs(&self) -> u64 {
        self.unattributed_allocs.load(Ordering::Relaxed)
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Copies out every stack and the unknown bucket. Returns the number of unread shards.
    pub fn collect(&self, deadline: Instant) -> (Vec<StackRecord>, StackStats, u32) {
        let mut records = Vec::new();
        let mut unread = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            let Some(shard) = lock_until(shard, deadline) else {
                unread += 1;
                continue;
            };
            for (key, &slot) in &shard.index {
                records.push(StackRecord {
                    id: (slot << SHARD_BITS) | i as u32,
                    frames: key.0.as_slice().to_vec(),
                    stats: shard.slots[slot as usize],
                });
            }
        }
        let unknown = match lock_until(&self.unknown, deadline) {
            Some(u) => *u,
            None => {
                unread += 1;
                StackStats::default()
            }
        };
        (records, unknown, unread)
    }
}

const _: () = assert!(MAX_FRAMES <= u8::MAX as usize);
