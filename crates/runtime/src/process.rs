//! What this process is to the runtime: a forked child of a traced process records nothing
//! (its copy of the parent's state is not its own). One flag, set in the child by the fork
//! handler the session registers, read by every layer.

use std::sync::atomic::{AtomicBool, Ordering};

static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a forked child (which records nothing).
pub fn is_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::Relaxed)
}

/// Called in the child of a fork, before anything else of the runtime runs there.
pub(crate) fn mark_forked_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
}
