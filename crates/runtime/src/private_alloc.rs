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
            // SAFETY: glibc's malloc accepts any size, and its blocks are aligned to
            // MALLOC_ALIGN, enough for this layout.
            unsafe { __libc_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: a layout's alignment is a power of two, as memalign requires.
            unsafe { __libc_memalign(layout.align(), layout.size()) as *mut u8 }
        }
    }

    /// calloc hands out fresh mmap'd memory for large requests, so big zeroed tables cost no
    /// resident memory until touched.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: glibc's calloc accepts any size, aligned to MALLOC_ALIGN as for `alloc`.
            unsafe { __libc_calloc(1, layout.size()) as *mut u8 }
        } else {
            // SAFETY: our caller's layout, which `GlobalAlloc::alloc_zeroed` requires to have a
            // non-zero size, as `alloc` does.
            let ptr = unsafe { self.alloc(layout) };
            if !ptr.is_null() {
                // SAFETY: `ptr` is a fresh block of `layout.size()` bytes, just allocated.
                unsafe { std::ptr::write_bytes(ptr, 0, layout.size()) };
            }
            ptr
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `GlobalAlloc::dealloc` requires `ptr` to be a live block of this allocator,
        // which came from glibc's malloc, calloc, realloc or memalign, all freed by `free`.
        unsafe { __libc_free(ptr as *mut _) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: `GlobalAlloc::realloc` requires `ptr` to be a live block of this allocator
            // (a glibc block); realloc keeps glibc's MALLOC_ALIGN alignment, enough here.
            return unsafe { __libc_realloc(ptr as *mut _, new_size) as *mut u8 };
        }
        // SAFETY: a layout's alignment is a power of two, as memalign requires.
        let new = unsafe { __libc_memalign(layout.align(), new_size) as *mut u8 };
        if !new.is_null() {
            // SAFETY: `ptr` is live with `layout.size()` bytes and `new` is a fresh block of
            // `new_size` bytes, so both hold the bytes copied, and they cannot overlap; `ptr`
            // is a glibc block, freed once and not used again.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                __libc_free(ptr as *mut _);
            }
        }
        new
    }
}
