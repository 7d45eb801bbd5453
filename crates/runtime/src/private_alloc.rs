//! The runtime's global allocator: glibc's `__libc_*` functions directly, so the runtime's own
//! data structures never re-enter the hooks (and never show up in the user's report).

use crate::libc_heap::{
    __libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc,
};
use std::alloc::{GlobalAlloc, Layout};

/// glibc's malloc returns memory aligned to 16 bytes on 64-bit targets.
const MALLOC_ALIGN: usize = 16;

pub struct LibcDirect;

// SAFETY: every method forwards to glibc's allocator with a size and alignment that satisfy the
// layout; memory is returned to the same allocator family it came from.
unsafe impl GlobalAlloc for LibcDirect {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            __libc_malloc(layout.size()) as *mut u8
        } else {
            __libc_memalign(layout.align(), layout.size()) as *mut u8
        }
    }

    /// calloc hands out fresh mmap'd memory for large requests, so big zeroed tables cost no
    /// resident memory until touched.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            __libc_calloc(1, layout.size()) as *mut u8
        } else {
            let ptr = self.alloc(layout);
            if !ptr.is_null() {
                std::ptr::write_bytes(ptr, 0, layout.size());
            }
            ptr
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        __libc_free(ptr as *mut _)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            return __libc_realloc(ptr as *mut _, new_size) as *mut u8;
        }
        let new = __libc_memalign(layout.align(), new_size) as *mut u8;
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            __libc_free(ptr as *mut _);
        }
        new
    }
}
