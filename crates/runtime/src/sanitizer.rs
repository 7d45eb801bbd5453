//! The runtime's side of the stream-race sanitizer: synchronization calls intercepted by the
//! CUDA hooks and `sanitizer-op:` marks feed one process-wide checker.

use std::sync::atomic::{AtomicBool, Ordering};

use msmemscope_core::sanitizer::SyncOp;

use crate::guard::Entered;

/// Set once the checker has something to check (the first sanitizer-op mark, or
/// `enable_sanitizer()`); until then a synchronization call costs one relaxed load.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// A stream/event synchronization call the hooks saw. Callable from inside a hook, with or
/// without the hook's reentrancy guard held: cheap while the sanitizer is off, never panics.
pub fn on_sync(op: SyncOp) {
    if !ACTIVE.load(Ordering::Relaxed) || crate::pipeline::is_detached() {
        return;
    }
    // Held by the hook already, or taken here: either way nothing below is recorded.
    let _entered = Entered::try_enter();
    let _ = std::panic::catch_unwind(|| apply_sync(op));
}

fn apply_sync(_op: SyncOp) {
    // Filled in by the checker (next commit).
}
