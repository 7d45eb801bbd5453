//! glibc's own entry points into its allocator. The hooks forward to these, and the runtime's
//! private global allocator uses them too, so nothing the runtime allocates for itself ever
//! passes through the hooked `malloc`.

use libc::{c_void, size_t};

extern "C" {
    pub fn __libc_malloc(size: size_t) -> *mut c_void;
    pub fn __libc_calloc(count: size_t, size: size_t) -> *mut c_void;
    pub fn __libc_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
    pub fn __libc_free(ptr: *mut c_void);
    pub fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
    pub fn __libc_valloc(size: size_t) -> *mut c_void;
    pub fn __libc_pvalloc(size: size_t) -> *mut c_void;
}

/// `malloc_usable_size` is not hooked; glibc's answers for any pointer it handed out.
pub fn usable_size(ptr: *mut c_void) -> usize {
    // SAFETY: callers pass only live pointers that glibc's allocator returned.
    unsafe { libc::malloc_usable_size(ptr) }
}
