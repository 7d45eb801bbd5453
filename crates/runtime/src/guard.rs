//! The per-thread reentrancy guard. A hook records only when the thread is not already inside
//! the runtime: allocations made by libc on our behalf (thread-stack queries, TLS destructor
//! registration, `dl_iterate_phdr`) pass straight through.

use std::cell::Cell;

thread_local! {
    // `const` initialisation and no destructor: reading it never allocates or registers anything.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread has entered the runtime; leaving happens on drop.
pub struct Entered(());

impl Entered {
    /// Enters the runtime, or returns `None` when this thread is already inside it (or its TLS
    /// is gone, at thread exit).
    #[inline]
    pub fn try_enter() -> Option<Entered> {
        INSIDE
            .try_with(|inside| {
                if inside.replace(true) {
                    None
                } else {
                    Some(Entered(()))
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.set(false));
    }
}
