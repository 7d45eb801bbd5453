//! The per-thread reentrancy guard. A hook records only when the thread is not already inside
//! the runtime: allocations made by libc on our behalf (thread-stack queries, TLS destructor
//! registration, `dl_iterate_phdr`) pass straight through.
//!
//! The guard also carries the thread's counter stripe: a hook looks its thread-local slots up
//! once, on entry, instead of once per use (each lookup is a `__tls_get_addr` call in a
//! shared library).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a thread keeps while it may be inside the runtime.
struct ThreadSlots {
    inside: Cell<bool>,
    /// Set with `inside` while the program's own allocation work runs beneath a hook that
    /// records it itself (the interpreter's allocator calling `malloc` for a big object): the
    /// nested `malloc` is neither the program's to record again nor the runtime's own.
    passing_through: Cell<bool>,
    /// This thread's counter stripe (`usize::MAX` until first asked).
    stripe: Cell<usize>,
    /// Where the unwinder keeps this thread's state (null until first used): a copy of its own
    /// thread-local's pointer, which clears it before the state is freed at thread exit.
    unwinder: Cell<*mut ()>,
    /// Where this thread's errno is (null until first asked): it never moves, and asking libc
    /// is a call.
    errno: Cell<*mut libc::c_int>,
    /// Sampling by bytes: what this thread may still allocate before its next sample (0 until
    /// the first draw, so the first allocation takes the slow path and draws).
    countdown: Cell<i64>,
    /// The mean interval the countdown was drawn for (0: never drawn), and the generator's
    /// state (seeded on the first draw).
    sample_mean: Cell<u64>,
    sample_rng: Cell<u64>,
}

thread_local! {
    // `const` initialisation and no destructor: reading it never allocates or registers anything.
    static SLOTS: ThreadSlots = const {
        ThreadSlots {
            inside: Cell::new(false),
            passing_through: Cell::new(false),
            stripe: Cell::new(usize::MAX),
            unwinder: Cell::new(std::ptr::null_mut()),
            errno: Cell::new(std::ptr::null_mut()),
            countdown: Cell::new(0),
            sample_mean: Cell::new(0),
            sample_rng: Cell::new(0),
        }
    };
}

/// Stripes handed out so far (one number per thread that recorded).
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// How many threads have taken a stripe: striped counters need read no stripe at or past this
/// (a beat sums every stack's counters, so a single-threaded program reads one stripe, not all).
pub fn stripes_taken() -> usize {
    NEXT.load(Ordering::Relaxed)
}

/// Proof that this thread has entered the runtime; leaving happens on drop. Not `Send`: it
/// points into this thread's thread-local storage.
pub struct Entered {
    slots: *const ThreadSlots,
}

impl Entered {
    /// Enters the runtime, or returns `None` when this thread is already inside it (or its TLS
    /// is gone, at thread exit).
    #[inline]
    pub fn try_enter() -> Option<Entered> {
        SLOTS
            .try_with(|slots| {
                if slots.inside.replace(true) {
                    None
                } else {
                    Some(Entered { slots })
                }
            })
            .ok()
            .flatten()
    }

    #[inline]
    fn slots(&self) -> &ThreadSlots {
        // SAFETY: `slots` is this thread's (an `Entered` never leaves the thread that made it),
        // and thread-local storage without a destructor lives as long as the thread.
        unsafe { &*self.slots }
    }

    /// This thread's errno.
    #[inline]
    pub fn errno(&self) -> *mut libc::c_int {
        let slot = &self.slots().errno;
        let mut at = slot.get();
        if at.is_null() {
            // SAFETY: `__errno_location` has no precondition.
            at = unsafe { libc::__errno_location() };
            slot.set(at);
        }
        at
    }

    /// The unwinder's state for this thread, as the unwinder left it (null: not known here).
    #[inline]
    pub fn unwinder(&self) -> &Cell<*mut ()> {
        &self.slots().unwinder
    }

    /// Sampling by bytes with mean interval `mean`: whether this allocation of `size` bytes is
    /// sampled. The unsampled path is a subtract and a branch on this thread's own countdown:
    /// no lock, no atomic, no system call.
    #[inline(always)]
    pub fn take_sample(&self, size: u64, mean: u64) -> bool {
        let slots = self.slots();
        let left = slots.countdown.get().wrapping_sub(size as i64);
        slots.countdown.set(left);
        if left > 0 {
            return false;
        }
        self.sample_slow(size, mean)
    }

    /// The countdown ran out (or was never drawn, or was drawn for another interval).
    #[cold]
    #[inline(never)]
    fn sample_slow(&self, size: u64, mean: u64) -> bool {
        let slots = self.slots();
        if slots.sample_mean.get() != mean {
            // First draw of this thread, or a window with another interval: the countdown so
            // far belongs to no window, so this allocation is decided on a fresh one.
            slots.sample_mean.set(mean);
            let fresh = self.draw_interval(mean) as i64 - size as i64;
            slots.countdown.set(fresh);
            if fresh > 0 {
                return false;
            }
        }
        // Memoryless: the next sample point is a fresh draw after this block, whatever of the
        // block lay beyond the point that was hit.
        let next = self.draw_interval(mean) as i64;
        slots.countdown.set(next);
        true
    }

    /// An exponentially distributed number of bytes of mean `mean`, from this thread's own
    /// generator (xorshift64*, seeded from the thread's slots' address, which differs between
    /// threads and, with address randomisation, between runs, and a process-wide count).
    fn draw_interval(&self, mean: u64) -> u64 {
        static SEEDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let slots = self.slots();
        let mut x = slots.sample_rng.get();
        if x == 0 {
            // splitmix64's finaliser spreads the few bits that differ.
            let mut z = (self.slots as u64)
                ^ SEEDS
                    .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
                    .rotate_left(17);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x = (z ^ (z >> 31)) | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        slots.sample_rng.set(x);
        let bits = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        let uniform = (bits as f64 + 1.0) / (1u64 << 53) as f64;
        msmemscope_core::host_leak::sampling::next_interval(uniform, mean)
    }

    /// This thread's stripe of the striped counters: handed out in order of a thread's first
    /// use, so that the first threads of a program never share one.
    #[inline]
    pub fn stripe(&self) -> Stripe {
        let slot = &self.slots().stripe;
        let mut index = slot.get();
        if index == usize::MAX {
            index = NEXT.fetch_add(1, Ordering::Relaxed) % (usize::MAX / 2);
            slot.set(index);
        }
        Stripe(index)
    }
}

/// A thread's place in striped counters: the order in which it first recorded. Numbers are
/// never handed out twice. In counters of `n` stripes the first `n - 1` threads each have a
/// stripe no other thread writes; every later thread writes the last one, shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stripe(usize);

impl Stripe {
    /// The stripe of `n` this thread writes.
    #[inline(always)]
    pub fn of(self, n: usize) -> usize {
        self.0.min(n - 1)
    }

    /// Whether this thread is the only writer of its stripe of `n`. Its counters are then
    /// bumped with a plain load and store: a locked read-modify-write is a full fence, and
    /// fences were most of what a hook cost. (Later threads cannot wrap around onto an owned
    /// stripe: they all share the last.)
    #[inline(always)]
    pub fn alone_in(self, n: usize) -> bool {
        self.0 < n - 1
    }

    /// A stripe numbered by hand, for tests.
    #[cfg(test)]
    pub fn numbered(index: usize) -> Stripe {
        Stripe(index)
    }
}

/// Held while an outer hook runs the program's own allocator beneath it (see
/// `ThreadSlots::passing_through`): nested hooks record nothing and pass straight through.
pub struct PassingThrough {
    slots: *const ThreadSlots,
}

impl PassingThrough {
    /// Begins passing through, or `None` when this thread is already inside the runtime.
    #[inline]
    pub fn try_begin() -> Option<PassingThrough> {
        SLOTS
            .try_with(|slots| {
                if slots.inside.replace(true) {
                    None
                } else {
                    slots.passing_through.set(true);
                    Some(PassingThrough { slots })
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for PassingThrough {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as for `Entered`: this thread's own thread-local slots.
        let slots = unsafe { &*self.slots };
        slots.passing_through.set(false);
        slots.inside.set(false);
    }
}

/// The unwinder's state of this thread is being freed (its thread exits): no hook may reach
/// it through the guard any more.
pub fn forget_unwinder() {
    let _ = SLOTS.try_with(|slots| slots.unwinder.set(std::ptr::null_mut()));
}

/// Whether this thread is passing an outer hook's allocation through (only meaningful when
/// [`Entered::try_enter`] just returned `None`).
#[inline]
pub fn passing_through() -> bool {
    SLOTS
        .try_with(|slots| slots.passing_through.get())
        .unwrap_or(false)
}

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        self.slots().inside.set(false);
    }
}
