//! The malloc family. `malloc_usable_size` is deliberately not hooked: it passes through.
//!
//! Each function has the contract of its C namesake (the caller passes what C allows); the
//! symbols are exported only outside unit tests, so the test harness keeps glibc's allocator.
#![allow(clippy::missing_safety_doc)]

use libc::{c_int, c_void, size_t};

use crate::guard::Entered;
use crate::host_leak::window;
use crate::libc_heap::*;

#[inline(always)]
fn record_alloc(ptr: *mut c_void, size: usize, function: &'static str) {
    if ptr.is_null() {
        if size != 0 && crate::pipeline::oom::watching() {
            if let Some(_entered) = Entered::try_enter() {
                crate::pipeline::on_malloc_failure(function, size);
            }
        }
        return;
    }
    if let Some(ledger) = window::active() {
        if let Some(_entered) = Entered::try_enter() {
            ledger.on_alloc(ptr as usize, size);
        }
    }
}

/// Frees `ptr` with `real`, taking it out of the ledger first.
#[inline(always)]
fn free_with(ptr: *mut c_void, real: impl FnOnce(*mut c_void)) {
    if !ptr.is_null() {
        if let Some(ledger) = window::active() {
            if let Some(entered) = Entered::try_enter() {
                let taken = ledger.take(ptr as usize);
                ledger.settle_free(ptr as usize, taken);
                drop(entered);
            }
        }
    }
    real(ptr)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    let ptr = __libc_malloc(size);
    record_alloc(ptr, size, "malloc");
    ptr
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn calloc(count: size_t, size: size_t) -> *mut c_void {
    let ptr = __libc_calloc(count, size);
    record_alloc(ptr, count.wrapping_mul(size), "calloc");
    ptr
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // SAFETY: forwards the caller's pointer to glibc's free, as the caller asked.
    free_with(ptr, |p| unsafe { __libc_free(p) })
}

/// `realloc` is a free of the old block and an allocation of the new one. The old block leaves
/// the ledger before the real call; if the call fails the old block is still allocated and is
/// put back.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    if ptr.is_null() {
        return malloc(size);
    }
    let Some(ledger) = window::active() else {
        let new = __libc_realloc(ptr, size);
        if new.is_null() && size != 0 {
            record_alloc(new, size, "realloc");
        }
        return new;
    };
    let Some(entered) = Entered::try_enter() else {
        return __libc_realloc(ptr, size);
    };
    let generation = ledger.stacks.generation();
    let taken = ledger.take(ptr as usize);
    let new = __libc_realloc(ptr, size);
    if new.is_null() && size != 0 {
        ledger.restore(ptr as usize, taken, generation);
        drop(entered);
        record_alloc(new, size, "realloc");
        return new;
    }
    ledger.settle_free(ptr as usize, taken);
    if !new.is_null() {
        ledger.on_alloc(new as usize, size);
    }
    drop(entered);
    new
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn reallocarray(
    ptr: *mut c_void,
    count: size_t,
    size: size_t,
) -> *mut c_void {
    match count.checked_mul(size) {
        Some(total) => realloc(ptr, total),
        None => {
            *libc::__errno_location() = libc::ENOMEM;
            std::ptr::null_mut()
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let saved_errno = *libc::__errno_location();
    let ptr = __libc_memalign(align, size);
    if ptr.is_null() {
        record_alloc(ptr, size, "posix_memalign");
        *libc::__errno_location() = saved_errno;
        return libc::ENOMEM;
    }
    *out = ptr;
    record_alloc(ptr, size, "posix_memalign");
    0
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        *libc::__errno_location() = libc::EINVAL;
        return std::ptr::null_mut();
    }
    let ptr = __libc_memalign(align, size);
    record_alloc(ptr, size, "aligned_alloc");
    ptr
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    let ptr = __libc_memalign(align, size);
    record_alloc(ptr, size, "memalign");
    ptr
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    let ptr = __libc_valloc(size);
    record_alloc(ptr, size, "valloc");
    ptr
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let ptr = __libc_pvalloc(size);
    record_alloc(ptr, size, "pvalloc");
    ptr
}
