//! `dlsym`, interposed so that a program (or cudart) which looks a hooked CUDA function up in a
//! library handle gets the wrapper.
//!
//! `dlsym` decides *where* to look from its caller's address: `RTLD_NEXT` means "after the
//! calling module" and `RTLD_DEFAULT` searches the caller's scope, which for a library loaded
//! with `RTLD_LOCAL` includes its own dependencies. A wrapper written in Rust would make the
//! runtime library the caller and change those answers. So the exported `dlsym` is a few
//! instructions of assembly that *jump* (not call) to glibc's `dlsym` — the return address, and
//! with it the caller, stays the program's. Only names starting with `cu` go further, through
//! one call that asks [`dlsym_wants_us`] whether the name is one of ours; only then does the
//! lookup run here ([`dlsym_cuda`]), and only for a real library handle (where glibc ignores
//! the caller) or `RTLD_DEFAULT` of one of our exports (answered as if we were absent when no
//! CUDA library provides the function).
//!
//! glibc's `dlsym` is found with `dlvsym(RTLD_NEXT, "dlsym", version)` (which is not
//! interposed), on the first call; nothing in that path allocates through the hooked `malloc`
//! or calls `dlsym` again. Without x86-64 (no jump stub), `dlsym` is not interposed and the
//! direct-linking and `cuGetProcAddress` paths still work.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_void};

use super::procaddr;
use crate::guard::Entered;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym` (0 until found). Read by the stub with one load.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

/// Finds glibc's `dlsym` (its default version on glibc ≥ 2.34, the original one before).
extern "C" fn resolve_real_dlsym() -> usize {
    std::panic::catch_unwind(find_real_dlsym).unwrap_or(0)
}

fn find_real_dlsym() -> usize {
    let current = REAL_DLSYM.load(Ordering::Acquire);
    if current != 0 {
        return current;
    }
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: a versioned lookup by NUL-terminated names, relative to this library.
        let addr = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
        if addr != 0 {
            REAL_DLSYM.store(addr, Ordering::Release);
            // The failed versions left an error message; the program never asked for it.
            // SAFETY: dlerror has no preconditions.
            unsafe { libc::dlerror() };
            return addr;
        }
    }
    0
}

/// glibc's `dlsym`, called directly (the runtime's own lookups never go through the stub).
pub fn real_dlsym() -> Option<DlsymFn> {
    let addr = resolve_real_dlsym();
    // SAFETY: a non-zero address is glibc's dlsym.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(addr) })
}

/// Whether a lookup of `name` (which starts with `cu`) is answered here rather than by glibc.
// The unit-test build, and targets without the jump stub, export no `dlsym`.
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
extern "C" fn dlsym_wants_us(handle: *mut c_void, name: *const c_char) -> usize {
    // A fault of ours answers "not ours": glibc's lookup then runs as without the runtime.
    std::panic::catch_unwind(|| wants_us(handle, name)).unwrap_or(0)
}

fn wants_us(handle: *mut c_void, name: *const c_char) -> usize {
    if handle == libc::RTLD_NEXT {
        return 0;
    }
    // The runtime's own lookups are never wrapped.
    let Some(_entered) = Entered::try_enter() else {
        return 0;
    };
    // SAFETY: the stub checked `name` is not null; dlsym's contract makes it a C string.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    let ours = if handle.is_null() {
        procaddr::exported(name).is_some()
    } else {
        procaddr::by_symbol(name).is_some()
    };
    ours as usize
}

/// The lookup of a hooked name (see the module comment).
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
extern "C" fn dlsym_cuda(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // A fault of ours: the plain lookup, as without the wrapper.
    std::panic::catch_unwind(|| lookup_cuda(real, handle, name)).unwrap_or_else(|_| {
        let handle = if handle.is_null() {
            libc::RTLD_NEXT
        } else {
            handle
        };
        // SAFETY: the caller's handle (or the lookup after this library) and name.
        unsafe { real(handle, name) as usize }
    }) as *mut c_void
}

fn lookup_cuda(real: DlsymFn, handle: *mut c_void, name: *const c_char) -> usize {
    lookup_cuda_ptr(real, handle, name) as usize
}

fn lookup_cuda_ptr(real: DlsymFn, handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let _entered = Entered::try_enter();
    // SAFETY: checked by the stub and `dlsym_wants_us`.
    let symbol = unsafe { CStr::from_ptr(name) }.to_bytes();
    if handle.is_null() {
        if let Some(hook) = procaddr::exported(symbol) {
            if hook.exported_real() != 0 {
                return hook.exported() as *mut c_void;
            }
        }
        // No CUDA library provides it: what the lookup finds without us (nothing, and the
        // `dlerror` message that goes with it).
        // SAFETY: a lookup by the caller's name, after this library.
        return unsafe { real(libc::RTLD_NEXT, name) };
    }
    // SAFETY: the caller's handle and name, as the caller passed them; for a library handle
    // glibc does not depend on who calls.
    let found = unsafe { real(handle, name) };
    if found.is_null() {
        return found;
    }
    match procaddr::by_symbol(symbol) {
        Some(hook) => hook.wrap(found as usize) as *mut c_void,
        None => found,
    }
}

/// The interposed `dlsym`.
///
/// # Safety
/// As C's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        // Names that do not start with "cu" (and a null name): straight to glibc.
        "test rsi, rsi",
        "jz 2f",
        "cmp byte ptr [rsi], 0x63",
        "jne 2f",
        "cmp byte ptr [rsi + 1], 0x75",
        "jne 2f",
        // Ask whether the name is ours; rdi/rsi survive the call (stack stays 16-aligned).
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {wants}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp {lookup}",
        // glibc's dlsym, entered with the caller's return address still on the stack.
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "xor eax, eax",
        "ret",
        wants = sym dlsym_wants_us,
        lookup = sym dlsym_cuda,
        real = sym REAL_DLSYM,
        resolve = sym resolve_real_dlsym,
    )
}
