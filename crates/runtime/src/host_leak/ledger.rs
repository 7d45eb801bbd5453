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

use msmemscope_core::host_leak::truncation;
use msmemscope_core::host_leak::{sampling, CountBytes};

use super::beats::Beats;
use super::block_table::{lock_until, Block, BlockTable};
use super::overflow::OverflowLedger;
use super::sampled_set::SampledSet;
use super::settings::WindowSettings;
use super::stack_table::StackTable;
use super::striped::StripedCountBytes;
use crate::clock::realtime_ns;
use crate::hashing::mix;
use crate::python;

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
    /// With sampling by bytes, the addresses that may be sampled blocks: the free of any
    /// other address leaves without a lookup.
    sampled_set: SampledSet,
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
    /// Sampling by bytes: not a sampled block of this window (or made before it); its free
    /// is not accounted.
    Unsampled,
}

impl Taken {
    /// The ledger does not hold the block (it may be one the runtime's own glibc calls made).
    #[inline(always)]
    pub fn not_in_ledger(&self) -> bool {
        matches!(self, Taken::NotFound { .. } | Taken::Unsampled)
    }
}

impl Ledger {
    pub fn new(settings: WindowSettings, stage: u32) -> Ledger {
        python::set_depth(settings.python_depth);
        let start_ns = realtime_ns();
        Ledger {
            beats: Beats::new(start_ns, settings.beat_ms, settings.beat_fixed),
            sample_mask: settings.sample_rate.saturating_sub(1),
            blocks: BlockTable::new(settings.block_cap),
            sampled_set: SampledSet::new(settings.sample_bytes > 0),
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
        self.sampled_set.release();
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

    /// What a ledger block of `size` bytes stands for: itself, or with sampling by bytes the
    /// blocks and bytes of the program it estimates.
    #[inline(always)]
    fn weigh(&self, size: u64) -> CountBytes {
        let (count, bytes) = sampling::weight(size, self.settings.sample_bytes);
        CountBytes { count, bytes }
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

    fn stop(&self, ts: u64) {
        self.truncation
            .fetch_or(truncation::ACCOUNTING_STOPPED, Ordering::Relaxed);
        if !self.stopped.swap(true, Ordering::Relaxed) {
            self.stopped_at_ns.store(ts, Ordering::Relaxed);
        }
    }
}

mod free;
mod record;
#[cfg(test)]
mod tests;
