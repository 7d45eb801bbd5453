//! CPython's own allocators, wrapped: Python objects (`PyObject_Malloc`) and the interpreter's
//! memory (`PyMem_Malloc`) come from its arenas, which `malloc` hooks never see, so a program
//! that keeps a growing list of records would show no leak without these.
//!
//! The wrappers go in with `PyMem_SetAllocator` for the MEM and OBJ domains (the RAW domain is
//! `malloc` itself, already hooked). CPython calls those two domains only with the GIL held, and
//! the setter swaps function pointers without a lock, so installing happens from Python code
//! (`msmemscope_track_python_objects`, called by the start-up module or by `msmemscope.start()`),
//! holding the GIL. Once in, the wrappers stay for the life of the process: each call forwards to
//! the allocator that was installed before them, and records only while a host-leak window that
//! accounts Python objects is open. (Removing them would need the GIL at window close, which the
//! closing thread may not hold; and a block allocated through them may be freed at any time.)
//!
//! Recording ends when the interpreter starts finalizing (`Py_IsFinalizing`): what the
//! program's Python objects held when its code was done stays unfreed in the report, rather than
//! being freed by the interpreter's teardown of every module (the C heap goes on being accounted
//! to the process's end, as for any program).
//!
//! A wrapped allocation is keyed by its Python frames alone: the C frames between the eval loop
//! and the allocator are the interpreter's own. The block's `malloc` underneath (objects over
//! 512 bytes, arena-less builds with `PYTHONMALLOC=malloc`) runs with the thread passing through
//! (`guard::PassingThrough`), so it is accounted once, as a Python object.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use super::malloc::caught_entered;
use crate::guard::{Entered, PassingThrough};
use crate::host_leak::ledger::{Ledger, Taken};
use crate::host_leak::window;

type MallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void);

/// `PyMemAllocatorEx`, as every CPython 3 lays it out.
#[repr(C)]
#[derive(Clone, Copy)]
struct PyMemAllocatorEx {
    ctx: *mut c_void,
    malloc: Option<MallocFn>,
    calloc: Option<CallocFn>,
    realloc: Option<ReallocFn>,
    free: Option<FreeFn>,
}

/// `PYMEM_DOMAIN_MEM` and `PYMEM_DOMAIN_OBJ`.
const DOMAINS: [c_int; 2] = [1, 2];

/// The allocator a domain had before ours: the wrappers' `ctx` points at it. Written once, under
/// the GIL and `INSTALL`, before the wrapper that reads it is installed; never changed after.
struct Original(UnsafeCell<PyMemAllocatorEx>);

// SAFETY: written once before any reader can reach it (see above), read-only afterwards.
unsafe impl Sync for Original {}

/// No allocator yet: what `ORIGINALS` holds until `install` fills it.
const UNSET: PyMemAllocatorEx = PyMemAllocatorEx {
    ctx: std::ptr::null_mut(),
    malloc: None,
    calloc: None,
    realloc: None,
    free: None,
};

static ORIGINALS: [Original; 2] = [
    Original(UnsafeCell::new(UNSET)),
    Original(UnsafeCell::new(UNSET)),
];

/// `Py_IsFinalizing` (3.13) or `_Py_IsFinalizing` (3.9-3.12); null until installed.
static IS_FINALIZING: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Mutex<()> = Mutex::new(());

/// Whether the wrappers are in.
pub fn installed() -> bool {
    crate::python::object_allocators_wrapped()
}

/// Why the wrappers could not go in.
#[derive(Debug, PartialEq, Eq)]
pub enum InstallError {
    /// No CPython this runtime can read runs in the process (its frames are what a Python
    /// object's site is made of).
    NoInterpreter,
    /// The interpreter exports no `PyMem_GetAllocator`/`PyMem_SetAllocator`.
    NoAllocatorApi,
}

/// Wraps the MEM and OBJ domains' allocators (once; later calls do nothing).
///
/// # Safety
/// The calling thread must hold the GIL of the process's interpreter.
pub unsafe fn install() -> Result<(), InstallError> {
    crate::python::detect();
    if crate::python::version().is_none() {
        return Err(InstallError::NoInterpreter);
    }
    let _one = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if installed() {
        return Ok(());
    }
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names only looks the names up.
    let (get, set) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"PyMem_GetAllocator".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"PyMem_SetAllocator".as_ptr()),
        )
    };
    if get.is_null() || set.is_null() {
        return Err(InstallError::NoAllocatorApi);
    }
    // SAFETY: as above.
    let finalizing = unsafe {
        let public = libc::dlsym(libc::RTLD_DEFAULT, c"Py_IsFinalizing".as_ptr());
        if public.is_null() {
            libc::dlsym(libc::RTLD_DEFAULT, c"_Py_IsFinalizing".as_ptr())
        } else {
            public
        }
    };
    IS_FINALIZING.store(finalizing, Ordering::Release);
    // SAFETY: both have these signatures in every CPython 3 (the domain is an enum, an int).
    let (get, set) = unsafe {
        (
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx)>(
                get,
            ),
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx)>(
                set,
            ),
        )
    };
    for (domain, original) in DOMAINS.iter().zip(ORIGINALS.iter()) {
        // SAFETY: the GIL is held (our contract) and INSTALL serialises installs: nothing reads
        // `original` before the wrapper pointing at it goes in just below.
        unsafe {
            get(*domain, original.0.get());
            let mut ours = PyMemAllocatorEx {
                ctx: original.0.get().cast(),
                malloc: Some(wrapped_malloc),
                calloc: Some(wrapped_calloc),
                realloc: Some(wrapped_realloc),
                free: Some(wrapped_free),
            };
            set(*domain, &mut ours);
        }
    }
    crate::python::note_object_allocators_wrapped();
    Ok(())
}

/// The window to record in, when it accounts Python objects and the interpreter is not yet
/// tearing itself down.
#[inline(always)]
fn recording() -> Option<&'static Ledger> {
    window::active().filter(|l| l.settings.python_objects_on() && !finalizing())
}

#[inline(always)]
fn finalizing() -> bool {
    let f = IS_FINALIZING.load(Ordering::Relaxed);
    if f.is_null() {
        return false;
    }
    // SAFETY: the interpreter's own `int (void)` query: a read of its runtime state.
    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(f)() != 0 }
}

/// # Safety
/// `ctx` is the pointer `install` gave CPython: one of `ORIGINALS`, written before.
#[inline(always)]
unsafe fn original<'a>(ctx: *mut c_void) -> &'a PyMemAllocatorEx {
    // SAFETY: the caller's guarantee.
    unsafe { &*(ctx as *const PyMemAllocatorEx) }
}

fn record_alloc(ptr: *mut c_void, size: usize) {
    if ptr.is_null() {
        return;
    }
    if let Some(ledger) = recording() {
        if let Some(entered) = Entered::try_enter() {
            caught_entered(&entered, || {
                ledger.on_python_alloc(ptr as usize, size, &entered)
            });
        }
    }
}

/// Takes `ptr` out of the ledger before the real free or realloc.
fn take(ptr: *mut c_void) -> Option<(&'static Ledger, Taken, u64)> {
    if ptr.is_null() {
        return None;
    }
    let ledger = recording()?;
    let entered = Entered::try_enter()?;
    let generation = ledger.stacks.generation();
    caught_entered(&entered, || ledger.take_python(ptr as usize, &entered))
        .map(|t| (ledger, t, generation))
}

unsafe extern "C" fn wrapped_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: CPython passes back the ctx it was given.
    let real = unsafe { original(ctx) };
    let ptr = {
        let _passing = PassingThrough::try_begin();
        // SAFETY: the original allocator, called as CPython would have called it.
        real.malloc
            .map_or(std::ptr::null_mut(), |f| unsafe { f(real.ctx, size) })
    };
    record_alloc(ptr, size);
    ptr
}

unsafe extern "C" fn wrapped_calloc(ctx: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // SAFETY: CPython passes back the ctx it was given.
    let real = unsafe { original(ctx) };
    let ptr = {
        let _passing = PassingThrough::try_begin();
        // SAFETY: the original allocator, called as CPython would have called it.
        real.calloc.map_or(std::ptr::null_mut(), |f| unsafe {
            f(real.ctx, count, size)
        })
    };
    record_alloc(ptr, count.wrapping_mul(size));
    ptr
}

unsafe extern "C" fn wrapped_realloc(
    ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    // SAFETY: CPython passes back the ctx it was given.
    let real = unsafe { original(ctx) };
    let taken = take(ptr);
    let new = {
        let _passing = PassingThrough::try_begin();
        // SAFETY: the original allocator, called as CPython would have called it, with the
        // caller's block.
        real.realloc
            .map_or(std::ptr::null_mut(), |f| unsafe { f(real.ctx, ptr, size) })
    };
    if new.is_null() {
        // Failed: the old block is still the program's (CPython's realloc never frees on
        // failure, whatever the size).
        if let Some((ledger, taken, generation)) = taken {
            if let Some(entered) = Entered::try_enter() {
                caught_entered(&entered, || {
                    ledger.restore(ptr as usize, taken, generation, &entered)
                });
            }
        }
        return new;
    }
    record_alloc(new, size);
    new
}

unsafe extern "C" fn wrapped_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: CPython passes back the ctx it was given.
    let real = unsafe { original(ctx) };
    // The block leaves the ledger before its address can be handed out again.
    let _ = take(ptr);
    let _passing = PassingThrough::try_begin();
    if let Some(f) = real.free {
        // SAFETY: the original allocator's free, with the caller's block.
        unsafe { f(real.ctx, ptr) };
    }
}
