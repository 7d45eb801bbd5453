//! glibc's own entry points into its allocator. The runtime's private global allocator uses
//! them, so nothing the runtime allocates for itself ever passes through the hooked `malloc`
//! (the program's blocks go to the next allocator: hooks/forward.rs).

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
