//! The allocator behind the hooks. Each hook forwards to the next definition of its name in the
//! process's lookup order (`dlsym(RTLD_NEXT)`): glibc's own exported functions, or those of an
//! allocator preloaded after the runtime (`LD_PRELOAD=libjemalloc.so.2 msmemscope …` puts the
//! runtime first, jemalloc next). Handing a jemalloc block to glibc's `free`, or asking glibc's
//! `malloc_usable_size` about it, corrupts the heap or crashes: so nothing here names glibc's
//! internals for the program's blocks. (The runtime's own data stays on glibc's `__libc_*`
//! functions: see private_alloc.)
//!
//! Forwarding to glibc's exported functions also keeps the host glibc's exact semantics (what
//! `aligned_alloc` does with an alignment that is not a power of two, how `posix_memalign` leaves
//! errno): the hooks add recording, never a rule of their own.
//!
//! An allocator that replaces `malloc` but not every aligned variant (the next `pvalloc` would
//! then be glibc's, on glibc's heap) gets the missing ones built from its own `posix_memalign`.
//!
//! Resolution happens at the first call (possibly inside a library constructor, before the
//! runtime's own) or from the runtime's constructor, whichever comes first; `dlsym` with a name
//! that exists allocates nothing. A call made on the resolving thread while it resolves (a
//! `dlsym` that allocates after all) goes to glibc's `__libc_*` functions, as before this
//! module existed.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use libc::{c_int, c_void, size_t};

use crate::libc_heap;

/// Whether this library's `malloc` is the process's `malloc` (the hooks are in force). Compares
/// the objects the two functions live in: taking our own `malloc`'s address would go through the
/// GOT and find whatever `malloc` the process uses, ours or not.
pub fn is_process_malloc() -> bool {
    fn object_of(address: *const libc::c_void) -> Option<usize> {
        // SAFETY: `Dl_info` is a C struct of four raw pointers, for which all-zero bytes (null
        // pointers) are a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
        (unsafe { libc::dladdr(address, &mut info) } != 0).then_some(info.dli_fbase as usize)
    }
    // A private function: its address is ours whatever the process interposes.
    fn here() {}
    // SAFETY: dlsym of a libc symbol name.
    let resolved = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = object_of(here as *const libc::c_void);
    ours.is_some() && object_of(resolved) == ours
}

type MallocFn = unsafe extern "C" fn(size_t) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type AlignFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, size_t, size_t) -> c_int;
type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> size_t;

/// The forwarded functions, in one order.
#[derive(Clone, Copy)]
enum Name {
    Malloc,
    Calloc,
    Realloc,
    Free,
    PosixMemalign,
    AlignedAlloc,
    Memalign,
    Valloc,
    Pvalloc,
    UsableSize,
}

const NAMES: [(Name, &std::ffi::CStr); 10] = [
    (Name::Malloc, c"malloc"),
    (Name::Calloc, c"calloc"),
    (Name::Realloc, c"realloc"),
    (Name::Free, c"free"),
    (Name::PosixMemalign, c"posix_memalign"),
    (Name::AlignedAlloc, c"aligned_alloc"),
    (Name::Memalign, c"memalign"),
    (Name::Valloc, c"valloc"),
    (Name::Pvalloc, c"pvalloc"),
    (Name::UsableSize, c"malloc_usable_size"),
];

/// Each name's next definition (0: not resolved yet, or built here from `posix_memalign`).
static NEXT: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];
static RESOLVED: AtomicBool = AtomicBool::new(false);
/// The next `malloc` is not glibc's.
static FOREIGN: AtomicBool = AtomicBool::new(false);

thread_local! {
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// The base address of the module that holds `addr` (0: none).
fn module_base(addr: usize) -> usize {
    // SAFETY: Dl_info is plain data; dladdr fills it or fails, reading only loader tables.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

extern "C" {
    fn gnu_get_libc_version() -> *const libc::c_char;
}

/// glibc's own module, found from a function no allocator replaces (tcmalloc, for one, also
/// exports `__libc_malloc`).
fn glibc_base() -> usize {
    module_base(gnu_get_libc_version as *const () as usize)
}

/// Looks every name up once. False on the resolving thread itself (re-entered from `dlsym`).
#[cold]
#[inline(never)]
fn resolve() -> bool {
    if RESOLVED.load(Ordering::Acquire) {
        return true;
    }
    if RESOLVING.try_with(|r| r.replace(true)).unwrap_or(true) {
        return false;
    }
    let mut found = [0usize; NAMES.len()];
    for (slot, (_, name)) in found.iter_mut().zip(NAMES.iter()) {
        // SAFETY: a lookup by a NUL-terminated name; the result is only stored.
        *slot = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    }
    let glibc = glibc_base();
    let foreign =
        found[Name::Malloc as usize] != 0 && module_base(found[Name::Malloc as usize]) != glibc;
    if foreign {
        // The replacement allocator's own definitions; glibc's where it has none would hand
        // out glibc blocks that its `free` cannot take.
        for (i, (name, _)) in NAMES.iter().enumerate() {
            let glibcs = found[i] == 0 || module_base(found[i]) == glibc;
            if glibcs && is_aligned_variant(*name) {
                found[i] = 0;
            }
        }
        if found[Name::UsableSize as usize] != 0
            && module_base(found[Name::UsableSize as usize]) == glibc
        {
            found[Name::UsableSize as usize] = 0;
        }
    }
    for (slot, value) in NEXT.iter().zip(found) {
        slot.store(value, Ordering::Relaxed);
    }
    FOREIGN.store(foreign, Ordering::Relaxed);
    RESOLVED.store(true, Ordering::Release);
    let _ = RESOLVING.try_with(|r| r.set(false));
    true
}

fn is_aligned_variant(name: Name) -> bool {
    matches!(
        name,
        Name::PosixMemalign | Name::AlignedAlloc | Name::Memalign | Name::Valloc | Name::Pvalloc
    )
}

/// Resolves now (from the runtime's constructor: a clean context).
pub fn init() {
    resolve();
}

/// Whether the hooks are known to forward to glibc's allocator (false until resolved, and when
/// another allocator comes next). Resolves nothing: callable under the loader's lock.
pub fn forwards_to_glibc() -> bool {
    RESOLVED.load(Ordering::Acquire) && !FOREIGN.load(Ordering::Relaxed)
}

/// The file of the module holding `addr`, as the loader names it ("" for the program).
fn module_file(addr: usize) -> Option<String> {
    // SAFETY: Dl_info is plain data; dladdr fills it or fails.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// The file of the allocator the hooks forward to when it is not glibc, and whether the C++
/// `operator new` the program calls is that allocator's own (which does not call `malloc`).
/// Asks the loader: not from inside a hook.
pub fn foreign_allocator() -> Option<(String, bool)> {
    if !RESOLVED.load(Ordering::Acquire) || forwards_to_glibc() {
        return None;
    }
    let f = NEXT[Name::Malloc as usize].load(Ordering::Relaxed);
    let file = module_file(f).unwrap_or_else(|| "another allocator".to_string());
    // SAFETY: a lookup by a NUL-terminated name (operator new(size_t)) in the global scope.
    let new = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Znwm".as_ptr()) } as usize;
    Some((file, new != 0 && module_base(new) == module_base(f)))
}

/// Who the program's `malloc` belongs to when it is not the runtime's: a module found ahead of
/// the runtime in the global lookup (the program itself, or a library preloaded before it).
/// Asks the loader (`dlsym`): not from inside a hook.
pub fn malloc_ahead_of_runtime() -> Option<String> {
    // SAFETY: a lookup by a NUL-terminated name in the global scope.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as usize;
    // The runtime's own module, from a function it does not export (taking an exported
    // function's address may go through the GOT and answer with whoever interposes it).
    let runtime = module_base(module_base as *const () as usize);
    if global == 0 || module_base(global) == runtime {
        return None;
    }
    let main = module_base(global) == program_base();
    Some(match module_file(global) {
        _ if main => "the program itself".to_string(),
        Some(file) if !file.is_empty() => file,
        _ => "an unnamed module".to_string(),
    })
}

/// The base address of the program's own image.
fn program_base() -> usize {
    // SAFETY: getauxval has no preconditions; AT_PHDR is the program's program headers.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) } as usize;
    module_base(phdr)
}

/// The next definition of `name`, once resolved (`None` while resolving on this thread, or for an
/// aligned variant the replacement allocator lacks).
#[inline(always)]
fn next(name: Name) -> Option<usize> {
    if !RESOLVED.load(Ordering::Acquire) && !resolve() {
        return None;
    }
    match NEXT[name as usize].load(Ordering::Relaxed) {
        0 => None,
        f => Some(f),
    }
}

/// # Safety
/// As C's `malloc`.
#[inline(always)]
pub unsafe fn malloc(size: size_t) -> *mut c_void {
    match next(Name::Malloc) {
        // SAFETY: the next definition of `malloc`, with the caller's argument.
        Some(f) => unsafe { std::mem::transmute::<usize, MallocFn>(f)(size) },
        // SAFETY: glibc's malloc accepts any size.
        None => unsafe { libc_heap::__libc_malloc(size) },
    }
}

/// # Safety
/// As C's `calloc`.
#[inline(always)]
pub unsafe fn calloc(count: size_t, size: size_t) -> *mut c_void {
    match next(Name::Calloc) {
        // SAFETY: the next definition of `calloc`, with the caller's arguments.
        Some(f) => unsafe { std::mem::transmute::<usize, CallocFn>(f)(count, size) },
        // SAFETY: glibc's calloc accepts any count and size.
        None => unsafe { libc_heap::__libc_calloc(count, size) },
    }
}

/// # Safety
/// As C's `realloc`: `ptr` is null or a live block of this allocator.
#[inline(always)]
pub unsafe fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    match next(Name::Realloc) {
        // SAFETY: the next definition of `realloc`, with the caller's block and size.
        Some(f) => unsafe { std::mem::transmute::<usize, ReallocFn>(f)(ptr, size) },
        // SAFETY: as above, glibc's.
        None => unsafe { libc_heap::__libc_realloc(ptr, size) },
    }
}

/// # Safety
/// As C's `free`: `ptr` is null or a live block of this allocator.
#[inline(always)]
pub unsafe fn free(ptr: *mut c_void) {
    match next(Name::Free) {
        // SAFETY: the next definition of `free`, with the caller's block.
        Some(f) => unsafe { std::mem::transmute::<usize, FreeFn>(f)(ptr) },
        // SAFETY: as above, glibc's.
        None => unsafe { libc_heap::__libc_free(ptr) },
    }
}

/// # Safety
/// As C's `posix_memalign`: `out` is valid for writing a pointer.
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    if let Some(f) = next(Name::PosixMemalign) {
        // SAFETY: the next definition, with the caller's arguments.
        return unsafe { std::mem::transmute::<usize, PosixMemalignFn>(f)(out, align, size) };
    }
    if !RESOLVED.load(Ordering::Acquire) {
        // Resolving on this thread: glibc's, as before.
        if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
            return libc::EINVAL;
        }
        // SAFETY: a power-of-two alignment, any size.
        let p = unsafe { libc_heap::__libc_memalign(align, size) };
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: `out` is valid for writing, by our contract.
        unsafe { *out = p };
        return 0;
    }
    // A replacement allocator without posix_memalign: nothing of its own to align with.
    libc::ENOMEM
}

/// An aligned variant the replacement allocator lacks, built from its `posix_memalign` (errno
/// set as C's functions set it on failure).
unsafe fn aligned_by_posix_memalign(align: size_t, size: size_t) -> *mut c_void {
    let mut p: *mut c_void = std::ptr::null_mut();
    // Round a small or odd alignment up to what posix_memalign takes, as glibc does.
    let align = align
        .max(std::mem::size_of::<usize>())
        .checked_next_power_of_two()
        .unwrap_or(0);
    if align == 0 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return std::ptr::null_mut();
    }
    // SAFETY: a valid out-pointer and a power-of-two alignment that is a multiple of a pointer.
    let rc = unsafe { posix_memalign(&mut p, align, size) };
    if rc != 0 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = rc };
        return std::ptr::null_mut();
    }
    p
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// `aligned_alloc`, `memalign`, `valloc`, `pvalloc`: the next definition, or built from
/// `posix_memalign` when the replacement allocator lacks it.
///
/// # Safety
/// As C's function of that name.
unsafe fn aligned(name: Name, align: size_t, size: size_t) -> *mut c_void {
    if let Some(f) = next(name) {
        // SAFETY: the next definition of the function `name` stands for.
        return unsafe {
            match name {
                Name::Valloc | Name::Pvalloc => std::mem::transmute::<usize, MallocFn>(f)(size),
                _ => std::mem::transmute::<usize, AlignFn>(f)(align, size),
            }
        };
    }
    if !RESOLVED.load(Ordering::Acquire) {
        // SAFETY: glibc's own, as before this module (resolving on this thread).
        return unsafe {
            match name {
                Name::Valloc => libc_heap::__libc_valloc(size),
                Name::Pvalloc => libc_heap::__libc_pvalloc(size),
                _ => libc_heap::__libc_memalign(align, size),
            }
        };
    }
    let (align, size) = match name {
        Name::Valloc => (page_size(), size),
        Name::Pvalloc => {
            let page = page_size();
            (page, size.max(1).div_ceil(page).saturating_mul(page))
        }
        _ => (align, size),
    };
    // SAFETY: as C's function of that name, by our contract.
    unsafe { aligned_by_posix_memalign(align, size) }
}

/// # Safety
/// As C's `aligned_alloc`.
pub unsafe fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the caller's arguments, as C's aligned_alloc takes them.
    unsafe { aligned(Name::AlignedAlloc, align, size) }
}

/// # Safety
/// As C's `memalign`.
pub unsafe fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the caller's arguments, as C's memalign takes them.
    unsafe { aligned(Name::Memalign, align, size) }
}

/// # Safety
/// As C's `valloc`.
pub unsafe fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: the caller's argument.
    unsafe { aligned(Name::Valloc, 0, size) }
}

/// # Safety
/// As C's `pvalloc`.
pub unsafe fn pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: the caller's argument.
    unsafe { aligned(Name::Pvalloc, 0, size) }
}

/// The usable size of a live block of the program's allocator (0 when that allocator cannot
/// tell).
pub fn usable_size(ptr: usize) -> usize {
    let ptr = ptr as *mut c_void;
    match next(Name::UsableSize) {
        // SAFETY: callers pass only live blocks of the allocator the hooks forward to, whose
        // own malloc_usable_size this is.
        Some(f) => unsafe { std::mem::transmute::<usize, UsableSizeFn>(f)(ptr) },
        None if !FOREIGN.load(Ordering::Relaxed) => {
            // SAFETY: glibc's, for a glibc block (no replacement allocator).
            unsafe { libc::malloc_usable_size(ptr) }
        }
        None => 0,
    }
}
