//! `dlclose`: after a library is unloaded its unwind tables are gone, so the unwinder must stop
//! using them at once. (`dlopen` is not interposed: new libraries are picked up when a stack
//! first meets their code, see `unwind::modules`.)

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_void};

use crate::guard::Entered;
use crate::unwind::modules;

static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

fn real_dlclose() -> Option<DlcloseFn> {
    let mut addr = REAL_DLCLOSE.load(Ordering::Relaxed);
    if addr == 0 {
        // SAFETY: RTLD_NEXT lookup of a libc symbol by a NUL-terminated name.
        addr = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlclose".as_ptr()) } as usize;
        REAL_DLCLOSE.store(addr, Ordering::Relaxed);
    }
    // SAFETY: a non-null result of dlsym("dlclose") is glibc's dlclose.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, DlcloseFn>(addr) })
}

/// # Safety
/// As C's `dlclose`: `handle` came from `dlopen`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = real_dlclose() else {
        return -1;
    };
    // SAFETY: the caller's handle, from `dlopen` by our contract, passed to the real dlclose.
    let result = unsafe { real(handle) };
    if crate::host_leak::window::active().is_some() {
        if let Some(_entered) = Entered::try_enter() {
            modules::refresh(false);
        }
    }
    result
}
