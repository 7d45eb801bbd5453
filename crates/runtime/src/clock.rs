//! Clocks read on the hook path (vDSO, no system call).

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

/// Wall-clock nanoseconds since the Unix epoch, from the coarse clock (a few milliseconds'
/// resolution, a fraction of the precise clock's cost): for the allocation hooks.
#[inline]
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME_COARSE)
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
