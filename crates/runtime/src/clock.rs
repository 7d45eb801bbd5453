//! Clocks read on the hook path (vDSO, no system call, or a value a thread of ours keeps).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Milliseconds of a coarse monotonic clock: for rate limits.
pub fn coarse_millis() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC_COARSE never fails on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Wall-clock nanoseconds since the Unix epoch, a few milliseconds' resolution: for the
/// allocation hooks, which take it twice per malloc/free pair. While a keeper ticks (see
/// [`tick`]) a read is one load of what it stored; even the coarse clock, a vDSO call, was a
/// fifth of a hooked pair's added time. Otherwise the coarse clock itself.
#[inline]
pub fn realtime_ns() -> u64 {
    match TICKED_NS.load(Ordering::Relaxed) {
        0 => read(libc::CLOCK_REALTIME_COARSE),
        ticked => ticked,
    }
}

/// The time the keeper stored at its last tick; 0 while none keeps it fresh.
static TICKED_NS: AtomicU64 = AtomicU64::new(0);
/// Whether the hooks record (a host-leak window is open), so ticks are worth their wake-ups.
static TICKS_WANTED: AtomicBool = AtomicBool::new(false);

/// How often a keeper ticks while ticks are wanted: the coarse clock's resolution on a kernel of
/// 250 Hz, so the hooks' times are as fine as when each hook read that clock.
pub const TICK: Duration = Duration::from_millis(4);

/// Whether a keeper should [`tick`] every [`TICK`].
pub fn ticks_wanted() -> bool {
    TICKS_WANTED.load(Ordering::SeqCst)
}

/// Says whether the hooks record. Reads go to the clock itself until the keeper's next tick,
/// which may be a while (it wakes every [`TICK`] only once it has seen this).
pub fn want_ticks(wanted: bool) {
    TICKS_WANTED.store(wanted, Ordering::SeqCst);
    if !wanted {
        TICKED_NS.store(0, Ordering::SeqCst);
    }
}

/// The keeper (a thread that wakes every [`TICK`] while ticks are wanted, never held up for
/// longer): stores the time now, or nothing when ticks are not wanted.
pub fn tick() {
    if TICKS_WANTED.load(Ordering::SeqCst) {
        TICKED_NS.store(read(libc::CLOCK_REALTIME), Ordering::SeqCst);
        // Unwanted meanwhile: the store above must not outlive `want_ticks(false)`.
        if !TICKS_WANTED.load(Ordering::SeqCst) {
            TICKED_NS.store(0, Ordering::SeqCst);
        }
    }
}

/// The keeper is about to be busy for an unknown time (serving a command): reads go to the
/// clock itself until its next tick, never to a time gone stale.
pub fn pause_ticks() {
    TICKED_NS.store(0, Ordering::SeqCst);
}

/// In a forked child: the keeper is the parent's thread.
pub fn forget_ticks_after_fork() {
    TICKS_WANTED.store(false, Ordering::SeqCst);
    TICKED_NS.store(0, Ordering::SeqCst);
}

/// Wall-clock nanoseconds since the Unix epoch, precise: event timestamps.
#[inline]
pub fn precise_realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; the realtime clocks never fail on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While ticks are wanted the hooks' clock is what the keeper stored, behind the precise
    /// clock; paused or unwanted, it is the clock itself again.
    #[test]
    fn the_hooks_clock_is_the_keepers_while_it_ticks() {
        tick();
        assert_eq!(
            TICKED_NS.load(Ordering::SeqCst),
            0,
            "no tick while unwanted"
        );
        want_ticks(true);
        assert_eq!(
            TICKED_NS.load(Ordering::SeqCst),
            0,
            "fresh only from the keeper's tick"
        );
        tick();
        let kept = realtime_ns();
        assert_eq!(kept, TICKED_NS.load(Ordering::SeqCst));
        std::thread::sleep(TICK * 3);
        assert_eq!(realtime_ns(), kept, "one load of the kept time");
        assert!(kept < precise_realtime_ns());
        tick();
        assert!(realtime_ns() >= kept + (TICK * 3).as_nanos() as u64);
        pause_ticks();
        assert_eq!(TICKED_NS.load(Ordering::SeqCst), 0);
        tick();
        want_ticks(false);
        assert_eq!(TICKED_NS.load(Ordering::SeqCst), 0);
        tick();
        assert_eq!(TICKED_NS.load(Ordering::SeqCst), 0);
        assert!(realtime_ns() > kept);
    }
}
