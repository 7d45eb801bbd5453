//! The block shards' lock: taken and left by every hooked allocation and free.
//!
//! `std::sync::Mutex` leaves with an atomic swap, because it must learn whether a waiter sleeps
//! on the futex. On x86 a swap is a locked instruction and so a full fence: the hook waits for
//! the program's pending stores to reach the cache, twice a pair counting the free. This lock
//! leaves with a release store (a plain `mov`), so a hook pays one locked instruction, taking
//! it. Nobody sleeps on it: a waiter spins a little, then yields its core, then naps. Holders
//! keep it for one table operation (a sweep at the window's close, or a recycling pass, for one
//! shard's blocks), and a holder that is descheduled gets the core back from the yielding
//! waiters.
//!
//! It is not a fair lock and it has no poisoning: a panic under it (never expected: every entry
//! point catches unwinding) drops the guard, which leaves the lock.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Spins before a waiter gives its core away.
const SPINS: u32 = 128;
/// Yields before a waiter naps between tries.
const YIELDS: u32 = 64;
/// A napping waiter's nap: a holder taking this long is sweeping a shard or descheduled.
const NAP: Duration = Duration::from_micros(50);

pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and a guard exists only while `locked` is
// held by it, so one thread at a time has it (as with a Mutex).
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SpinLock<T> {}

pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline(always)]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // A guard is made only once the lock is had: one made and dropped on failure would
        // leave the holder's lock.
        match self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Some(SpinGuard { lock: self }),
            Err(_) => None,
        }
    }

    /// Waits for the lock as long as it takes.
    #[inline(always)]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        match self.try_lock() {
            Some(guard) => guard,
            None => self
                .wait(None)
                .unwrap_or_else(|| unreachable!("no deadline")),
        }
    }

    /// Waits for the lock until `deadline`: the window's readers never wait forever on a holder
    /// that may be a thread frozen in a signal handler.
    pub fn lock_until(&self, deadline: Instant) -> Option<SpinGuard<'_, T>> {
        self.try_lock().or_else(|| self.wait(Some(deadline)))
    }

    #[cold]
    #[inline(never)]
    fn wait(&self, deadline: Option<Instant>) -> Option<SpinGuard<'_, T>> {
        let mut tries: u32 = 0;
        loop {
            // Read before trying again: waiters share the line instead of taking it in turn.
            if !self.locked.load(Ordering::Relaxed) {
                if let Some(guard) = self.try_lock() {
                    return Some(guard);
                }
            }
            tries = tries.saturating_add(1);
            if tries < SPINS {
                std::hint::spin_loop();
                continue;
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return None;
            }
            if tries < SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (type comment on `SpinLock`'s `Sync`).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads that take the lock in turn lose no update, and each sees the others' writes.
    #[test]
    fn holders_exclude_each_other() {
        let lock = SpinLock::new((0u64, 0u64));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..50_000 {
                        let mut pair = lock.lock();
                        pair.0 += 1;
                        pair.1 = pair.0 * 2;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), (200_000, 400_000));
    }

    /// A held lock is refused to `try_lock`, and to `lock_until` once its deadline passes; a
    /// dropped guard leaves it.
    #[test]
    fn a_held_lock_is_refused_until_it_is_left() {
        let lock = SpinLock::new(7);
        let held = lock.lock();
        assert!(lock.try_lock().is_none());
        let started = Instant::now();
        assert!(lock
            .lock_until(started + Duration::from_millis(20))
            .is_none());
        assert!(started.elapsed() >= Duration::from_millis(20));
        drop(held);
        assert_eq!(lock.lock_until(Instant::now()).as_deref(), Some(&7));
    }
}
