//! The runtime's global allocator: glibc's `__libc_*` functions directly, so the runtime's own
//! data structures never re-enter the hooks (and never show up in the user's report).
//!
//! Memory pressure must not end the program: when glibc has nothing left for us (`ulimit -v`,
//! the program having used up the address space), Rust would abort the process. Instead the
//! allocation comes from a reserve set aside in the library's own image, and the runtime is
//! told ([`out_of_memory_since`]) so that it stops recording (the host-leak ledger stops
//! accounting and says so in Data Health; the event pipeline drops rows): what it needs to
//! finish and write its report then comes from the reserve. Reserve blocks are never reused.

use crate::libc_heap::{
    __libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc,
};
use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The emergency reserve's size: enough to stop recording and write a report.
const RESERVE_BYTES: usize = 16 << 20;

#[repr(C, align(4096))]
struct Reserve(UnsafeCell<[u8; RESERVE_BYTES]>);

// SAFETY: bytes are handed out once each, by an atomic bump offset, never shared.
unsafe impl Sync for Reserve {}

/// In .bss: no memory is used until a page of it is touched.
static RESERVE: Reserve = Reserve(UnsafeCell::new([0; RESERVE_BYTES]));
static RESERVE_USED: AtomicUsize = AtomicUsize::new(0);
/// When glibc first refused the runtime memory (realtime ns; 0: never).
static OUT_OF_MEMORY_AT: AtomicU64 = AtomicU64::new(0);

/// When the runtime first ran out of memory of its own (then it is living on its reserve).
pub fn out_of_memory_since() -> Option<u64> {
    match OUT_OF_MEMORY_AT.load(Ordering::Relaxed) {
        0 => None,
        at => Some(at),
    }
}

fn reserve_range() -> (usize, usize) {
    let start = RESERVE.0.get() as usize;
    (start, start + RESERVE_BYTES)
}

fn in_reserve(ptr: *mut u8) -> bool {
    let (start, end) = reserve_range();
    (start..end).contains(&(ptr as usize))
}

/// A block from the reserve (null when it is used up: then Rust's handler ends the process,
/// as it would have without the reserve).
fn from_reserve(layout: Layout) -> *mut u8 {
    let _ = OUT_OF_MEMORY_AT.compare_exchange(
        0,
        crate::clock::realtime_ns().max(1),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let (start, _) = reserve_range();
    let mut used = RESERVE_USED.load(Ordering::Relaxed);
    loop {
        let begin = (start + used).next_multiple_of(layout.align()) - start;
        let Some(end) = begin.checked_add(layout.size()) else {
            return std::ptr::null_mut();
        };
        if end > RESERVE_BYTES {
            return std::ptr::null_mut();
        }
        match RESERVE_USED.compare_exchange_weak(used, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return (start + begin) as *mut u8,
            Err(now) => used = now,
        }
    }
}

/// glibc's malloc returns memory aligned to 16 bytes on 64-bit targets.
const MALLOC_ALIGN: usize = 16;

pub struct LibcDirect;

// SAFETY: glibc's blocks (see `Glibc`) or, when glibc has none, reserve blocks of the layout's
// size and alignment that nothing else uses; each is returned to where it came from (reserve
// blocks are never reused).
unsafe impl GlobalAlloc for LibcDirect {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller's layout, as GlobalAlloc requires.
        let ptr = unsafe { Glibc.alloc(layout) };
        if ptr.is_null() {
            return from_reserve(layout);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller's layout, as GlobalAlloc requires.
        let ptr = unsafe { Glibc.alloc_zeroed(layout) };
        if ptr.is_null() {
            // Reserve memory is zero until handed out, and handed out once.
            return from_reserve(layout);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !in_reserve(ptr) {
            // SAFETY: a glibc block of this allocator, as GlobalAlloc requires.
            unsafe { Glibc.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !in_reserve(ptr) {
            // SAFETY: a glibc block of this allocator, as GlobalAlloc requires.
            let new = unsafe { Glibc.realloc(ptr, layout, new_size) };
            if !new.is_null() {
                return new;
            }
        }
        // SAFETY: a layout with the new size and the old alignment, valid as GlobalAlloc's
        // contract for realloc says.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new = from_reserve(new_layout);
        if !new.is_null() {
            // SAFETY: `ptr` is live with `layout.size()` bytes, `new` a fresh reserve block of
            // `new_size`; they cannot overlap. The old block is given back where it came from.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

/// glibc's allocator, used directly.
struct Glibc;

// SAFETY: every method forwards to glibc's allocator with a size and alignment that satisfy the
// layout; memory is returned to the same allocator family it came from.
unsafe impl GlobalAlloc for Glibc {
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
