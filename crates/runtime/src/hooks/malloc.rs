//! The malloc family. `malloc_usable_size` is deliberately not hooked: it passes through.
//!
//! Each function has the contract of its C namesake (the caller passes what C allows); the
//! symbols are exported only outside unit tests, so the test harness keeps glibc's allocator.
//! The real work is the next allocator's (forward.rs); recording leaves errno as that allocator
//! left it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use libc::{c_int, c_void, size_t};

use super::own_blocks;
use crate::forward;
use crate::guard::Entered;
use crate::host_leak::window;

/// Runs recording work, stopping a panic there: the program's allocation or free has been or
/// will be done exactly once by the caller either way, and a panic must not unwind into C.
/// errno is put back as it was: the program reads errno after a failed allocation (and glibc's
/// `free` promises to keep it), never ours. Only work that records goes through here, so a hook
/// with nothing to record costs nothing more.
#[inline(always)]
pub(super) fn caught<R>(work: impl FnOnce() -> R) -> Option<R> {
    // SAFETY: `__errno_location` has no precondition.
    keeping_errno(unsafe { libc::__errno_location() }, work)
}

/// [`caught`] on a thread inside the runtime: the guard keeps where its errno is.
#[inline(always)]
pub(super) fn caught_entered<R>(entered: &Entered, work: impl FnOnce() -> R) -> Option<R> {
    keeping_errno(entered.errno(), work)
}

/// `work`, stopped if it panics, with the errno at `at` (this thread's) put back after it.
#[inline(always)]
fn keeping_errno<R>(at: *mut c_int, work: impl FnOnce() -> R) -> Option<R> {
    // SAFETY: `at` is this thread's errno (the caller's), always valid to read and write.
    let errno = unsafe { *at };
    let result = catch_unwind(AssertUnwindSafe(work)).ok();
    // SAFETY: as above; a thread's errno stays where it is.
    unsafe { *at = errno };
    result
}

/// Before the runtime's constructor (a linked library's constructor allocating): begins the
/// launched run now, so this block and the ones after it are accounted. The module scans the
/// run makes carry the hooks' own work from the first one on.
#[inline(always)]
fn begin_run_now() -> Option<&'static crate::host_leak::ledger::Ledger> {
    crate::launch::begin_on_first_allocation(super::loader::ride_along);
    window::active()
}

#[inline(always)]
fn record_alloc(ptr: *mut c_void, size: usize, function: &'static str) {
    crate::process::at_safe_point();
    if ptr.is_null() {
        if size != 0 && crate::pipeline::oom::watching() {
            if let Some(_entered) = Entered::try_enter() {
                caught(|| crate::pipeline::on_malloc_failure(function, size));
            }
        }
        return;
    }
    if let Some(ledger) = window::active().or_else(begin_run_now) {
        match Entered::try_enter() {
            Some(entered) => {
                caught_entered(&entered, || {
                    // An entry for this address is stale (its free passed where no hook saw
                    // it). It only matters for a block the ledger does not hold, whose free
                    // would find it: looked up off the common path, for those alone.
                    if !ledger.on_alloc(ptr as usize, size, &entered) {
                        own_blocks::remove(ptr as usize);
                    }
                });
            }
            // The interpreter's allocator, already recording this block as a Python object.
            None if crate::guard::passing_through() => {}
            // glibc allocating for the runtime: see own_blocks.
            None => {
                caught(|| own_blocks::insert(ptr as usize));
            }
        }
    }
}

/// Frees `ptr` with `real`, taking it out of the ledger first.
#[inline(always)]
fn free_with(ptr: *mut c_void, real: impl FnOnce(*mut c_void)) {
    crate::process::at_safe_point();
    if !ptr.is_null() {
        if let Some(ledger) = window::active() {
            match Entered::try_enter() {
                Some(entered) => {
                    caught_entered(&entered, || {
                        let taken = ledger.take(ptr as usize, &entered);
                        if !(taken.not_in_ledger() && own_blocks::remove(ptr as usize)) {
                            ledger.settle_free(ptr as usize, taken, &entered);
                        }
                    });
                    drop(entered);
                }
                None if crate::guard::passing_through() => {}
                None => {
                    caught(|| own_blocks::remove(ptr as usize));
                }
            }
        }
    }
    real(ptr)
}

/// # Safety
/// As C's `malloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    // SAFETY: the next allocator's malloc accepts any size.
    let ptr = unsafe { forward::malloc(size) };
    record_alloc(ptr, size, "malloc");
    ptr
}

/// # Safety
/// As C's `calloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn calloc(count: size_t, size: size_t) -> *mut c_void {
    // SAFETY: C's calloc accepts any count and size (it checks the product for overflow).
    let ptr = unsafe { forward::calloc(count, size) };
    record_alloc(ptr, count.wrapping_mul(size), "calloc");
    ptr
}

/// # Safety
/// As C's `free`: `ptr` is null or a live block of this allocator, not used afterwards.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // SAFETY: forwards the caller's pointer, null or a live block by our contract, to the next
    // allocator's free, once.
    free_with(ptr, |p| unsafe { forward::free(p) })
}

/// `realloc` is a free of the old block and an allocation of the new one. The old block leaves
/// the ledger before the real call; if the call fails the old block is still allocated and is
/// put back.
///
/// # Safety
/// As C's `realloc`: `ptr` is null or a live block of this allocator, not used afterwards
/// unless the call fails.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    if ptr.is_null() {
        // SAFETY: `realloc(NULL, size)` is `malloc(size)`, which has no precondition.
        return unsafe { malloc(size) };
    }
    let Some(ledger) = window::active() else {
        // SAFETY: the caller's live block (our contract), passed to glibc's realloc unchanged.
        let new = unsafe { forward::realloc(ptr, size) };
        if new.is_null() && size != 0 {
            record_alloc(new, size, "realloc");
        }
        return new;
    };
    let failed = |new: *mut c_void| new.is_null() && size != 0;
    let Some(entered) = Entered::try_enter() else {
        if crate::guard::passing_through() {
            // SAFETY: as below: the caller's live block, unchanged.
            return unsafe { forward::realloc(ptr, size) };
        }
        // glibc reallocating for the runtime: the new block is the runtime's too.
        let was_own = caught(|| own_blocks::remove(ptr as usize)).unwrap_or(false);
        // SAFETY: the caller's live block (our contract), passed to glibc's realloc unchanged.
        let new = unsafe { forward::realloc(ptr, size) };
        caught(|| {
            if failed(new) {
                if was_own {
                    own_blocks::insert(ptr as usize);
                }
            } else if !new.is_null() {
                own_blocks::insert(new as usize);
            }
        });
        return new;
    };
    let generation = ledger.stacks.generation();
    // `None`: the recording panicked; the reallocation still happens, once.
    let taken = caught_entered(&entered, || {
        let taken = ledger.take(ptr as usize, &entered);
        let own = taken.not_in_ledger() && own_blocks::remove(ptr as usize);
        (taken, own)
    });
    // SAFETY: the caller's live block (our contract), passed to glibc's realloc unchanged; the
    // ledger work above only read its address.
    let new = unsafe { forward::realloc(ptr, size) };
    if failed(new) {
        if let Some((taken, own)) = taken {
            caught_entered(&entered, || {
                if own {
                    own_blocks::insert(ptr as usize);
                }
                ledger.restore(ptr as usize, taken, generation, &entered)
            });
        }
        drop(entered);
        record_alloc(new, size, "realloc");
        return new;
    }
    caught_entered(&entered, || {
        let own = match taken {
            Some((_, true)) => true,
            Some((taken, false)) => {
                ledger.settle_free(ptr as usize, taken, &entered);
                false
            }
            None => false,
        };
        if new.is_null() {
            return;
        }
        if own {
            own_blocks::insert(new as usize);
        } else {
            if !ledger.on_alloc(new as usize, size, &entered) {
                own_blocks::remove(new as usize);
            }
        }
    });
    drop(entered);
    new
}

/// # Safety
/// As C's `reallocarray`: `ptr` as for [`realloc`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn reallocarray(
    ptr: *mut c_void,
    count: size_t,
    size: size_t,
) -> *mut c_void {
    match count.checked_mul(size) {
        // SAFETY: `ptr` is what `realloc` requires, by our contract.
        Some(total) => unsafe { realloc(ptr, total) },
        None => {
            // SAFETY: `__errno_location` returns this thread's errno, always valid to write.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// As C's `posix_memalign`: `out` is valid for writing a pointer.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    // SAFETY: the caller's arguments, as C's posix_memalign takes them; the next allocator
    // checks the alignment as the host's allocator does.
    let rc = unsafe { forward::posix_memalign(out, align, size) };
    if rc == 0 {
        // SAFETY: on success `out` holds the new block.
        record_alloc(unsafe { *out }, size, "posix_memalign");
    } else if rc == libc::ENOMEM {
        record_alloc(std::ptr::null_mut(), size, "posix_memalign");
    }
    rc
}

/// # Safety
/// As C's `aligned_alloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the caller's arguments; what an unusual alignment does is the next allocator's
    // rule (glibc 2.36 rounds it up, later ones fail with EINVAL).
    let ptr = unsafe { forward::aligned_alloc(align, size) };
    record_alloc(ptr, size, "aligned_alloc");
    ptr
}

/// # Safety
/// As C's `memalign`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the caller's arguments, unchanged.
    let ptr = unsafe { forward::memalign(align, size) };
    record_alloc(ptr, size, "memalign");
    ptr
}

/// # Safety
/// As C's `valloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: C's valloc accepts any size.
    let ptr = unsafe { forward::valloc(size) };
    record_alloc(ptr, size, "valloc");
    ptr
}

/// # Safety
/// As C's `pvalloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: C's pvalloc accepts any size.
    let ptr = unsafe { forward::pvalloc(size) };
    record_alloc(ptr, size, "pvalloc");
    ptr
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in recording work stops at the hook: the caller goes on, and the guard taken
    /// around the work is released on the way out.
    #[test]
    fn recording_panics_stop_at_the_hook() {
        let outcome = caught(|| -> u32 {
            let _entered = Entered::try_enter().expect("not inside the runtime");
            panic!("inside the ledger")
        });
        assert_eq!(outcome, None);
        assert!(Entered::try_enter().is_some(), "guard released");
        assert_eq!(caught(|| 7), Some(7));
    }
}
