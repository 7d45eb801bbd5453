//! The stack table: one entry per distinct stack key (first 20 frames) and, per entry, how many
//! blocks and bytes were allocated from it. Unfreed counts come from the block table when the
//! window closes (and freed = allocated - unfreed), so a free never touches this table.
//!
//! Stacks without Python frames are found in a sharded index of their C frames. Stacks with
//! them go through one table under one lock: their frames are made a `FrameTrie` node (text,
//! read while the allocating thread runs that code, so its code objects are alive), which with
//! the C frames above the interpreter is the site's key.
//!
//! Counters are striped per thread and updated with relaxed atomics, so threads allocating from
//! the same stack do not share a cache line. Capped: when full, stacks with no live block
//! ("dead") are recycled (see `Ledger::recycle_dead_stacks`) and their history is folded into
//! the unknown bucket; when none is dead, new stacks go to the unknown bucket.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use msmemscope_core::host_leak::{AllocDomain, CountBytes};

use super::block_table::lock_until;
use super::frame_trie::FrameTrie;
use super::key_index::KeyIndex;
use super::striped::bump;
use super::zeroed_array::{Zeroable, ZeroedArray};
use crate::guard::Stripe;
use crate::hashing::FastHash;
use crate::python::{self, PyStack};
use crate::unwind::{CapturedStack, MAX_FRAMES};

/// The unknown bucket's id.
pub const UNKNOWN_STACK: u32 = u32::MAX;
const SHARDS: usize = 64;
const STRIPES: usize = 4;

/// A site's identity, packed into as many words as it needs. Word 0: the allocator (bits 0-7),
/// the number of C frames (bits 8-15), and the `FrameTrie` node of its Python frames plus one
/// (bits 16-47; 0 without Python frames). Then the C return addresses.
///
/// A Python process has hundreds of thousands of distinct stacks (`import torch` runs each line
/// of thousands of module bodies once). Their Python part is the trie node of the frames as
/// text, not the frames as the interpreter holds them: two instructions of one line (the one
/// that built a dict, the one that built the list it holds) are one site, and a key is a word
/// or two instead of up to forty.
pub struct SiteKey {
    words: [u64; 1 + MAX_FRAMES],
    len: usize,
}

impl SiteKey {
    pub fn new(domain: AllocDomain, c: &[u64], python: Option<u32>) -> SiteKey {
        let mut key = SiteKey {
            words: [0; 1 + MAX_FRAMES],
            len: 1 + c.len(),
        };
        let python = python.map_or(0, |node| u64::from(node) + 1);
        key.words[0] = domain as u64 | (c.len() as u64) << 8 | python << 16;
        key.words[1..key.len].copy_from_slice(c);
        key
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.words[..self.len]
    }

    /// The C frames of a packed key.
    fn c_frames(words: &[u64]) -> &[u64] {
        let n = (words[0] >> 8 & 0xff) as usize;
        &words[1..1 + n]
    }

    fn domain(words: &[u64]) -> AllocDomain {
        if words[0] & 0xff == AllocDomain::Pymalloc as u64 {
            AllocDomain::Pymalloc
        } else {
            AllocDomain::Malloc
        }
    }

    /// The trie node of a packed key's Python frames.
    fn python(words: &[u64]) -> Option<u32> {
        let node = words[0] >> 16 & 0xffff_ffff;
        node.checked_sub(1).map(|n| n as u32)
    }
}

/// An interned site's slot.
struct Entry {
    slot: u32,
    /// The stack went on beyond the key's depth: callers further out share this entry.
    cut: bool,
}

/// The sites with Python frames (`SiteKey` words -> entry), and their frames' texts.
#[derive(Default)]
struct Sites {
    slots: KeyIndex<Entry>,
    frames: FrameTrie,
}

/// One stack's counters in one stripe.
#[derive(Default)]
struct Counter {
    allocated: AtomicU64,
    allocated_bytes: AtomicU64,
    last_alloc_ns: AtomicU64,
    /// Set by the stripe's first allocation (0 until then).
    first_alloc_ns: AtomicU64,
    freed: AtomicU64,
    freed_bytes: AtomicU64,
    /// Sum of the freed blocks' lifetimes, milliseconds.
    freed_lifetime_ms: AtomicU64,
}

// SAFETY: atomics only; all-zero bytes are zero values.
unsafe impl Zeroable for Counter {}

/// A stack's counters summed over the stripes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCounts {
    pub allocated: CountBytes,
    pub freed: CountBytes,
    pub freed_lifetime_ms: u64,
    pub last_alloc_ns: u64,
    /// The oldest allocation's time (0: none).
    pub first_alloc_ns: u64,
}

impl StackCounts {
    pub fn live(&self) -> CountBytes {
        CountBytes {
            count: self.allocated.count.saturating_sub(self.freed.count),
            bytes: self.allocated.bytes.saturating_sub(self.freed.bytes),
        }
    }

    fn merge(&mut self, other: StackCounts) {
        self.allocated.merge(other.allocated);
        self.freed.merge(other.freed);
        self.freed_lifetime_ms += other.freed_lifetime_ms;
        self.last_alloc_ns = self.last_alloc_ns.max(other.last_alloc_ns);
        self.first_alloc_ns = earliest(self.first_alloc_ns, other.first_alloc_ns);
    }
}

/// The earlier of two times, 0 standing for "none".
fn earliest(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, t) | (t, 0) => t,
        (a, b) => a.min(b),
    }
}

/// The counters of every slot, striped by thread: each stripe is its own array, so threads in
/// different stripes never write the same cache line.
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
    fn mine(&self, slot: usize, stripe: Stripe) -> Option<&Counter> {
        self.stripes.get(stripe.of(STRIPES))?.get(slot)
    }

    #[inline]
    fn add(&self, slot: usize, block: CountBytes, ts: u64, stripe: Stripe) {
        if let Some(c) = self.mine(slot, stripe) {
            let alone = stripe.alone_in(STRIPES);
            bump(&c.allocated, block.count, alone);
            bump(&c.allocated_bytes, block.bytes, alone);
            c.last_alloc_ns.store(ts, Ordering::Relaxed);
            if c.first_alloc_ns.load(Ordering::Relaxed) == 0 {
                c.first_alloc_ns.store(ts, Ordering::Relaxed);
            }
        }
    }

    /// Counts a free; `undo` takes one back (a `realloc` that failed after its block was taken).
    #[inline(always)]
    fn free(&self, slot: usize, block: CountBytes, lifetime_ms: u64, undo: bool, stripe: Stripe) {
        if let Some(c) = self.mine(slot, stripe) {
            let alone = stripe.alone_in(STRIPES);
            let sign = |n: u64| if undo { n.wrapping_neg() } else { n };
            bump(&c.freed, sign(block.count), alone);
            bump(&c.freed_bytes, sign(block.bytes), alone);
            bump(&c.freed_lifetime_ms, sign(lifetime_ms), alone);
        }
    }

    fn sum(&self, slot: usize) -> StackCounts {
        let mut total = StackCounts::default();
        // Stripes no thread has taken hold zeros.
        let taken = crate::guard::stripes_taken().max(1);
        for stripe in self.stripes.iter().take(taken) {
            if let Some(c) = stripe.get(slot) {
                // Stripes may be updated by other threads meanwhile: wrapping sums keep an
                // undo racing its free from showing as a huge number for long.
                total.allocated.count = total
                    .allocated
                    .count
                    .wrapping_add(c.allocated.load(Ordering::Relaxed));
                total.allocated.bytes = total
                    .allocated
                    .bytes
                    .wrapping_add(c.allocated_bytes.load(Ordering::Relaxed));
                total.freed.count = total
                    .freed
                    .count
                    .wrapping_add(c.freed.load(Ordering::Relaxed));
                total.freed.bytes = total
                    .freed
                    .bytes
                    .wrapping_add(c.freed_bytes.load(Ordering::Relaxed));
                total.freed_lifetime_ms = total
                    .freed_lifetime_ms
                    .wrapping_add(c.freed_lifetime_ms.load(Ordering::Relaxed));
                total.last_alloc_ns = total
                    .last_alloc_ns
                    .max(c.last_alloc_ns.load(Ordering::Relaxed));
                total.first_alloc_ns = earliest(
                    total.first_alloc_ns,
                    c.first_alloc_ns.load(Ordering::Relaxed),
                );
            }
        }
        total
    }

    /// Unmaps every stripe.
    ///
    /// # Safety
    /// As [`ZeroedArray::release`]: no thread is using a counter or will use one it looked up
    /// before this call.
    unsafe fn release(&self) {
        for stripe in &self.stripes {
            // SAFETY: the caller's guarantee, for each stripe.
            unsafe { stripe.release() };
        }
    }

    fn reset(&self, slot: usize) {
        for stripe in &self.stripes {
            if let Some(c) = stripe.get(slot) {
                for a in [
                    &c.allocated,
                    &c.allocated_bytes,
                    &c.last_alloc_ns,
                    &c.first_alloc_ns,
                    &c.freed,
                    &c.freed_bytes,
                    &c.freed_lifetime_ms,
                ] {
                    a.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One shard of the index of stacks without Python frames: packed keys (`SiteKey`) and their
/// entries.
type IndexShard = KeyIndex<Entry>;

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
    /// The node of its Python frames, for [`StackTable::python_frames`]; `None` without them.
    pub python: Option<u32>,
    pub cut: bool,
    pub domain: AllocDomain,
    pub counts: StackCounts,
}

pub struct StackTable {
    index: Box<[Mutex<IndexShard>]>,
    /// The slot of each site with Python frames (keys without them are their own sites), taken
    /// after an index shard's lock.
    sites: Mutex<Sites>,
    /// Slots `0..cap` for interned stacks, slot `cap` for the unknown bucket.
    counters: StripedCounters,
    /// Slot allocation: fresh slots from `next_slot`, recycled ones from `free_slots`.
    free_slots: Mutex<Vec<u32>>,
    next_slot: AtomicU64,
    cap: u64,
    interned: AtomicU64,
    /// Interned stacks that were cut at the key's depth.
    cut_stacks: AtomicU64,
    recycled: AtomicU64,
    folded: Mutex<StackCounts>,
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
                .map(|_| Mutex::new(KeyIndex::default()))
                .collect(),
            sites: Mutex::new(Sites::default()),
            counters: StripedCounters::new(cap as usize + 1),
            free_slots: Mutex::new(Vec::new()),
            next_slot: AtomicU64::new(0),
            cap,
            interned: AtomicU64::new(0),
            cut_stacks: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            folded: Mutex::new(StackCounts::default()),
            unattributed_allocs: AtomicU64::new(0),
            full_without_dead: AtomicBool::new(false),
            generation: AtomicU64::new(first_generation),
        }
    }

    fn lock_index(&self, shard: usize) -> MutexGuard<'_, IndexShard> {
        self.index[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Finds or creates the id of the stack of C frames `stack` and Python frames `py`; `cut`
    /// says the stack went on beyond them. Call only while the generation is even, from the
    /// thread that captured `py`.
    pub fn intern(
        &self,
        stack: &CapturedStack,
        py: &PyStack,
        cut: bool,
        domain: AllocDomain,
    ) -> Interned {
        if py.len == 0 {
            return self.intern_c(stack, cut, domain);
        }
        let mut raw = [python::RenderKey::default(); python::MAX_PY_FRAMES];
        python::render_keys(py, &mut raw);
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        let Some(python) = sites.frames.intern_raw(&raw[..py.len], |key| {
            python::render_text(key).unwrap_or_else(|| "<unreadable Python frame>".into())
        }) else {
            return Interned::Full;
        };
        let key = SiteKey::new(domain, stack.as_slice(), Some(python));
        let hash = FastHash.hash_one(key.as_slice());
        if let Some(entry) = sites.slots.get(hash, key.as_slice()) {
            return Interned::Id(entry.slot);
        }
        let Some(slot) = self.take_slot() else {
            return Interned::Full;
        };
        self.count_new_site(cut);
        sites
            .slots
            .insert_new(hash, key.as_slice(), Entry { slot, cut });
        Interned::Id(slot)
    }

    /// [`StackTable::intern`] for a stack without Python frames: the sharded index.
    fn intern_c(&self, stack: &CapturedStack, cut: bool, domain: AllocDomain) -> Interned {
        let key = SiteKey::new(domain, stack.as_slice(), None);
        let key = key.as_slice();
        let hash = FastHash.hash_one(key);
        // From bits the shard's own table does not use (it takes buckets from the low bits and
        // its tags from the top ones), so a shard's keys spread over all of its buckets.
        let shard = (hash >> 32) as usize % SHARDS;
        let mut index = self.lock_index(shard);
        if let Some(entry) = index.get(hash, key) {
            return Interned::Id(entry.slot);
        }
        let Some(slot) = self.take_slot() else {
            return Interned::Full;
        };
        self.count_new_site(cut);
        index.insert_new(hash, key, Entry { slot, cut });
        Interned::Id(slot)
    }

    fn count_new_site(&self, cut: bool) {
        self.interned.fetch_add(1, Ordering::Relaxed);
        if cut {
            self.cut_stacks.fetch_add(1, Ordering::Relaxed);
        }
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

    /// Counts an allocation against `id` (or the unknown bucket): `block` is what the ledger
    /// block stands for (itself, or with sampling by bytes the blocks and bytes it estimates).
    #[inline]
    pub fn count_alloc(&self, id: u32, block: CountBytes, ts: u64, stripe: Stripe) {
        if id == UNKNOWN_STACK {
            self.unattributed_allocs.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.add(self.slot_of(id), block, ts, stripe);
    }

    /// Counts the free of a block of `id` standing for `block`, whose lifetimes sum to
    /// `lifetime_ms`. Called under the block's shard lock, so a recycling pass sees either the
    /// block or its free.
    #[inline]
    pub fn count_free(&self, id: u32, block: CountBytes, lifetime_ms: u64, stripe: Stripe) {
        self.counters
            .free(self.slot_of(id), block, lifetime_ms, false, stripe);
    }

    /// Undoes [`StackTable::count_free`].
    pub fn uncount_free(&self, id: u32, block: CountBytes, lifetime_ms: u64, stripe: Stripe) {
        self.counters
            .free(self.slot_of(id), block, lifetime_ms, true, stripe);
    }

    #[inline]
    fn slot_of(&self, id: u32) -> usize {
        if id == UNKNOWN_STACK {
            self.unknown_slot()
        } else {
            id as usize
        }
    }

    /// Calls `visit(id, live)` for every slot handed out so far (freed slots show nothing live).
    /// The allocations of every interned stack, summed (a slot not in use holds zeros; the
    /// history of recycled stacks is the unknown bucket's).
    pub fn allocated_total(&self) -> CountBytes {
        let mut total = CountBytes::default();
        for slot in 0..self.slots_in_use_bound() {
            total.merge(self.counters.sum(slot).allocated);
        }
        total
    }

    pub fn for_each_live(&self, mut visit: impl FnMut(u32, CountBytes)) {
        for slot in 0..self.slots_in_use_bound() {
            let live = self.counters.sum(slot).live();
            if live.count > 0 {
                visit(slot as u32, live);
            }
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
    /// unknown bucket, and ends the pass. Returns the freed slots.
    pub fn finish_recycling(&self, live: &[bool]) -> Vec<u32> {
        let mut freed_slots = Vec::new();
        let mut folded = StackCounts::default();
        let mut recycle = |entry: &mut Entry| {
            let slot = entry.slot;
            if live.get(slot as usize).copied().unwrap_or(true) {
                return true;
            }
            folded.merge(self.counters.sum(slot as usize));
            self.counters.reset(slot as usize);
            freed_slots.push(slot);
            false
        };
        for shard in 0..SHARDS {
            self.lock_index(shard).retain(&mut recycle);
        }
        self.sites
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .retain(&mut recycle);
        if let Ok(mut f) = self.folded.lock() {
            f.merge(folded);
        }
        if let Ok(mut free) = self.free_slots.lock() {
            free.extend(freed_slots.iter().copied());
        }
        self.recycled
            .fetch_add(freed_slots.len() as u64, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel);
        freed_slots
    }

    /// Empties the index and the list of free slots, each under its own lock (nothing reads
    /// them without it, so this is safe at any time). Returns whether every lock was had before
    /// `deadline`.
    pub fn release_index(&self, deadline: Instant) -> bool {
        let mut all = true;
        for shard in self.index.iter() {
            match lock_until(shard, deadline) {
                Some(mut index) => {
                    let taken = std::mem::take(&mut *index);
                    drop(index);
                    drop(taken);
                }
                None => all = false,
            }
        }
        match lock_until(&self.sites, deadline) {
            Some(mut sites) => {
                let taken = std::mem::take(&mut *sites);
                drop(sites);
                drop(taken);
            }
            None => all = false,
        }
        match lock_until(&self.free_slots, deadline) {
            Some(mut free) => {
                let taken = std::mem::take(&mut *free);
                drop(free);
                drop(taken);
            }
            None => all = false,
        }
        all
    }

    /// Unmaps the counters (the big lazily committed tables). Afterwards every counter
    /// operation finds no slot and does nothing, and no new stack can be interned.
    ///
    /// # Safety
    /// No thread may be counting, summing or resetting a counter, nor do so later with a
    /// counter reference taken before this call: see `Ledger::release` for how the closed
    /// window makes sure.
    pub unsafe fn release_counters(&self) {
        // SAFETY: the caller's guarantee.
        unsafe { self.counters.release() };
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

    pub fn cut_stacks(&self) -> u64 {
        self.cut_stacks.load(Ordering::Relaxed)
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

    /// Copies out the stacks whose ids `wanted` accepts (a report wants those with unfreed
    /// blocks: a Python process has a million stacks, most long freed) with their counters, and
    /// the unknown bucket's counters (direct and folded from recycled stacks). Returns the
    /// number of unread index shards.
    pub fn collect(
        &self,
        deadline: Instant,
        wanted: impl Fn(u32) -> bool,
    ) -> (Vec<StackRecord>, StackCounts, u32) {
        let mut records = Vec::new();
        let mut unread = 0;
        // Each slot has one key: C stacks in the index, Python ones in the sites.
        let mut take = |key: &[u64], entry: &Entry| {
            if wanted(entry.slot) {
                records.push(StackRecord {
                    id: entry.slot,
                    frames: SiteKey::c_frames(key).to_vec(),
                    python: SiteKey::python(key),
                    cut: entry.cut,
                    domain: SiteKey::domain(key),
                    counts: self.counters.sum(entry.slot as usize),
                });
            }
        };
        for shard in self.index.iter() {
            match lock_until(shard, deadline) {
                Some(index) => index.iter().for_each(|(key, entry)| take(key, entry)),
                None => unread += 1,
            }
        }
        match lock_until(&self.sites, deadline) {
            Some(sites) => sites.slots.iter().for_each(|(key, entry)| take(key, entry)),
            None => unread += 1,
        }
        let mut unknown = self.counters.sum(self.unknown_slot());
        match lock_until(&self.folded, deadline) {
            Some(folded) => unknown.merge(*folded),
            None => unread += 1,
        }
        (records, unknown, unread)
    }

    /// The Python frames of a record's `python` node, innermost first (empty when the table's
    /// tables were given back, or not had before `deadline`).
    pub fn python_frames(&self, node: u32, deadline: Instant) -> Vec<String> {
        lock_until(&self.sites, deadline).map_or_else(Vec::new, |sites| sites.frames.path(node))
    }
}

const _: () = assert!(MAX_FRAMES <= u8::MAX as usize);
