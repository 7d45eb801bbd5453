//! The stack table: one entry per distinct stack key (first 20 frames) and, per entry, how many
//! blocks and bytes were allocated from it. Unfreed counts come from the block table when the
//! window closes (and freed = allocated - unfreed), so a free never touches this table.
//!
//! Counters are striped per thread and updated with relaxed atomics, so threads allocating from
//! the same stack do not share a cache line. Capped: when full, stacks with no live block
//! ("dead") are recycled (see `Ledger::recycle_dead_stacks`) and their history is folded into
//! the unknown bucket; when none is dead, new stacks go to the unknown bucket.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use msmemscope_core::host_leak::CountBytes;

use super::block_table::lock_until;
use super::hashing::FastHash;
use super::zeroed_array::{Zeroable, ZeroedArray};
use crate::unwind::{CapturedStack, MAX_FRAMES};

/// The unknown bucket's id.
pub const UNKNOWN_STACK: u32 = u32::MAX;
const SHARDS: usize = 64;
const STRIPES: usize = 4;

#[derive(Clone, Copy)]
pub struct StackKey(pub CapturedStack);

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

/// One stack's counters in one stripe.
#[derive(Default)]
struct Counter {
    count: AtomicU64,
    bytes: AtomicU64,
    last_alloc_ns: AtomicU64,
}

// SAFETY: atomics only; all-zero bytes are zero values.
unsafe impl Zeroable for Counter {}

/// Allocation counters of every slot, striped by thread: each stripe is its own array, so
/// threads in different stripes never write the same cache line.
struct StripedCounters {
    stripes: Vec<ZeroedArray<Counter>>,
}

impl StripedCounters {
    fn new(slots: usize) -> StripedCounters {
        let stripes = (0..STRIPES)
            .map_while(|_| ZeroedArray::new(slots))
            .collect();
        StripedCounters { stripes }
    }

    fn len(&self) -> usize {
        self.stripes.first().map_or(0, |s| s.len())
    }

    #[inline]
    fn add(&self, slot: usize, size: u64, ts: u64) -> bool {
        let Some(stripe) = self.stripes.get(super::striped::stripe_index() % STRIPES) else {
            return false;
        };
        let Some(counter) = stripe.get(slot) else {
            return false;
        };
        counter.count.fetch_add(1, Ordering::Relaxed);
        counter.bytes.fetch_add(size, Ordering::Relaxed);
        counter.last_alloc_ns.store(ts, Ordering::Relaxed);
        true
    }

    fn sum(&self, slot: usize) -> (CountBytes, u64) {
        let mut total = CountBytes::default();
        let mut last = 0;
        for stripe in &self.stripes {
            if let Some(c) = stripe.get(slot) {
                total.count += c.count.load(Ordering::Relaxed);
                total.bytes += c.bytes.load(Ordering::Relaxed);
                last = last.max(c.last_alloc_ns.load(Ordering::Relaxed));
            }
        }
        (total, last)
    }

    fn reset(&self, slot: usize) {
        for stripe in &self.stripes {
            if let Some(c) = stripe.get(slot) {
                c.count.store(0, Ordering::Relaxed);
                c.bytes.store(0, Ordering::Relaxed);
                c.last_alloc_ns.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// What interning found.
pub enum Interned {
    Id(u32),
    /// The table is at its cap.
    Full,
}

/// A stack as the window-close aggregation sees it.
pub struct StackRecord {
    pub id: u32,
    pub frames: Vec<u64>,
    pub allocated: CountBytes,
    pub last_alloc_ns: u64,
}

pub struct StackTable {
    index: Box<[Mutex<HashMap<StackKey, u32, FastHash>>]>,
    /// Slots `0..cap` for interned stacks, slot `cap` for the unknown bucket.
    counters: StripedCounters,
    /// Slot allocation: fresh slots from `next_slot`, recycled ones from `free_slots`.
    free_slots: Mutex<Vec<u32>>,
    next_slot: AtomicU64,
    cap: u64,
    interned: AtomicU64,
    recycled: AtomicU64,
    folded: Mutex<CountBytes>,
    unattributed_allocs: AtomicU64,
    full_without_dead: AtomicBool,
    /// Even while stable, odd while dead stacks are being recycled. Readers that see it even
    /// while holding a block-table shard lock may use a stack id they looked up earlier.
    generation: AtomicU64,
}

impl StackTable {
    /// `first_generation` must be even and differ between windows: ids memoized by threads
    /// are tagged with the generation and must not be taken for another window's.
    pub fn new(cap: u64, first_generation: u64) -> StackTable {
        StackTable {
            index: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(FastHash)))
                .collect(),
            counters: StripedCounters::new(cap as usize + 1),
            free_slots: Mutex::new(Vec::new()),
            next_slot: AtomicU64::new(0),
            cap,
            interned: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            folded: Mutex::new(CountBytes::default()),
            unattributed_allocs: AtomicU64::new(0),
            full_without_dead: AtomicBool::new(false),
            generation: AtomicU64::new(first_generation),
        }
    }

    fn lock_index(&self, shard: usize) -> MutexGuard<'_, HashMap<StackKey, u32, FastHash>> {
        self.index[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Finds or creates the id of `stack`. Call only while the generation is even.
    pub fn intern(&self, stack: &CapturedStack) -> Interned {
        let key = StackKey(*stack);
        let shard = (FastHash.hash_one(key) as usize) % SHARDS;
        let mut index = self.lock_index(shard);
        if let Some(&id) = index.get(&key) {
            return Interned::Id(id);
        }
        let Some(slot) = self.take_slot() else {
            return Interned::Full;
        };
        index.insert(key, slot);
        self.interned.fetch_add(1, Ordering::Relaxed);
        Interned::Id(slot)
    }

    fn take_slot(&self) -> Option<u32> {
        if let Some(slot) = self.free_slots.lock().ok().and_then(|mut f| f.pop()) {
            return Some(slot);
        }
        // Without counter mappings (mmap refused) no stack can be counted: all go unknown.
        let usable = self.cap.min(self.counters.len().saturating_sub(1) as u64);
        self.next_slot
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < usable).then_some(n + 1)
            })
            .ok()
            .map(|n| n as u32)
    }

    /// Counts an allocation against `id` (or the unknown bucket).
    #[inline]
    pub fn count_alloc(&self, id: u32, size: u64, ts: u64) {
        if id == UNKNOWN_STACK {
            self.unattributed_allocs.fetch_add(1, Ordering::Relaxed);
            self.counters.add(self.unknown_slot(), size, ts);
        } else {
            self.counters.add(id as usize, size, ts);
        }
    }

    fn unknown_slot(&self) -> usize {
        self.cap as usize
    }

    pub fn mark_full_without_dead(&self) {
        self.full_without_dead.store(true, Ordering::Relaxed);
    }

    /// Starts a recycling pass: from now on no new block may take a stack id (see `generation`).
    /// Returns false when another pass is running.
    pub fn begin_recycling(&self) -> bool {
        let g = self.generation.load(Ordering::Acquire);
        g.is_multiple_of(2)
            && self
                .generation
                .compare_exchange(g, g + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Frees every interned stack whose slot is not in `live`, folding its counts into the
    /// unknown bucket, and ends the pass. Returns how many were freed.
    pub fn finish_recycling(&self, live: &[bool]) -> u64 {
        let mut freed_slots = Vec::new();
        let mut folded = CountBytes::default();
        for shard in 0..SHARDS {
            self.lock_index(shard).retain(|_, slot| {
                if live.get(*slot as usize).copied().unwrap_or(true) {
                    return true;
                }
                folded.merge(self.counters.sum(*slot as usize).0);
                self.counters.reset(*slot as usize);
                freed_slots.push(*slot);
                false
            });
        }
        let freed = freed_slots.len() as u64;
        if let Ok(mut f) = self.folded.lock() {
            f.merge(folded);
        }
        if let Ok(mut free) = self.free_slots.lock() {
            free.extend(freed_slots);
        }
        self.recycled.fetch_add(freed, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel);
        freed
    }

    /// Slots handed out so far: the size of a liveness map.
    pub fn slots_in_use_bound(&self) -> usize {
        self.next_slot.load(Ordering::Relaxed) as usize
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

    /// Copies out every stack with its counters, and the unknown bucket's allocations (direct
    /// and folded from recycled stacks). Returns the number of unread index shards.
    pub fn collect(&self, deadline: Instant) -> (Vec<StackRecord>, CountBytes, u32) {
        let mut records = Vec::new();
        let mut unread = 0;
        for shard in self.index.iter() {
            let Some(index) = lock_until(shard, deadline) else {
                unread += 1;
                continue;
            };
            for (key, &slot) in index.iter() {
                let (allocated, last_alloc_ns) = self.counters.sum(slot as usize);
                records.push(StackRecord {
                    id: slot,
                    frames: key.0.as_slice().to_vec(),
                    allocated,
                    last_alloc_ns,
                });
            }
        }
        let mut unknown = self.counters.sum(self.unknown_slot()).0;
        match lock_until(&self.folded, deadline) {
            Some(folded) => unknown.merge(*folded),
            None => unread += 1,
        }
        (records, unknown, unread)
    }
}

const _: () = assert!(MAX_FRAMES <= u8::MAX as usize);
