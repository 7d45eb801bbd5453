//! Push/pop ranges, kept per thread and per domain as NVTX defines them (start/end ranges may
//! end on any thread and need no state here).

use std::cell::RefCell;

use libc::c_int;

use super::handles::domain_name;
use super::Handle;
use crate::marks::{emit_range_end, emit_range_start, next_range_id};

struct Pushed {
    domain: usize,
    id: u64,
    message: String,
}

thread_local! {
    static PUSHED: RefCell<Vec<Pushed>> = const { RefCell::new(Vec::new()) };
}

/// Pushes a range; returns its depth in its domain on this thread (0 for the outermost), or a
/// negative value when the thread is exiting.
pub(super) fn push(domain: Handle, message: Option<String>) -> c_int {
    let id = next_range_id();
    let message = message.unwrap_or_default();
    let depth = PUSHED.try_with(|s| {
        let mut s = s.borrow_mut();
        let depth = s.iter().filter(|p| p.domain == domain as usize).count();
        s.push(Pushed {
            domain: domain as usize,
            id,
            message: message.clone(),
        });
        depth
    });
    let Ok(depth) = depth else { return -1 };
    emit_range_start(id, &message, None, domain_name(domain));
    c_int::try_from(depth).unwrap_or(c_int::MAX)
}

/// Pops this thread's innermost range of `domain`; returns its depth, or -1 when there is none.
pub(super) fn pop(domain: Handle) -> c_int {
    let popped = PUSHED.try_with(|s| {
        let mut s = s.borrow_mut();
        let i = s.iter().rposition(|p| p.domain == domain as usize)?;
        let p = s.remove(i);
        let depth = s[..i]
            .iter()
            .filter(|q| q.domain == domain as usize)
            .count();
        Some((p, depth))
    });
    let Ok(Some((p, depth))) = popped else {
        return -1;
    };
    emit_range_end(p.id, &p.message, domain_name(domain));
    c_int::try_from(depth).unwrap_or(c_int::MAX)
}
