//! What this process is to the runtime: a forked child of a traced process records nothing
//! (its copy of the parent's state is not its own). One flag, set in the child by the fork
//! handler the session registers, read by every layer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a forked child (which records nothing).
pub fn is_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::Relaxed)
}

/// Called in the child of a fork, before anything else of the runtime runs there.
pub(crate) fn mark_forked_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
}

/// Work an adapter left for the next safe point (0: none): a `fn()` the hooks run where the
/// program holds none of the allocator's locks. The control channel's thread is started this
/// way when a signal came at a moment it could not be (control/wake.rs).
static SAFE_POINT_WORK: AtomicUsize = AtomicUsize::new(0);

/// Leaves `work` for the next safe point (async-signal-safe: one store).
pub(crate) fn defer_to_safe_point(work: fn()) {
    SAFE_POINT_WORK.store(work as usize, Ordering::Release);
}

/// The deferred work is done (or no longer wanted).
pub(crate) fn clear_safe_point_work() {
    SAFE_POINT_WORK.store(0, Ordering::Release);
}

/// Called by the allocation hooks outside the allocator (after `malloc` returned, before
/// `free` runs): one relaxed load when nothing waits.
#[inline(always)]
pub(crate) fn at_safe_point() {
    let work = SAFE_POINT_WORK.load(Ordering::Relaxed);
    if work != 0 {
        run_safe_point_work(work);
    }
}

#[cold]
#[inline(never)]
fn run_safe_point_work(work: usize) {
    // SAFETY: only `defer_to_safe_point` stores here, and it stores a `fn()`.
    let work = unsafe { std::mem::transmute::<usize, fn()>(work) };
    work();
}
