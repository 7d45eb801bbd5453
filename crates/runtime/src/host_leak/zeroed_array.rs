//! A fixed-length array of zero-initialised values in its own anonymous mapping: the kernel
//! commits a page only when something in it is touched, so a table sized for the cap costs
//! memory only for the entries in use.

use std::ops::Deref;

/// Types for which all-zero bytes are a valid value (atomics, integers).
///
/// # Safety
/// Implementors must be valid when every byte is zero.
pub unsafe trait Zeroable {}

pub struct ZeroedArray<T: Zeroable> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the array owns its mapping; sharing it is as safe as sharing `[T]`.
unsafe impl<T: Zeroable + Sync> Sync for ZeroedArray<T> {}
// SAFETY: as above, for moving ownership between threads.
unsafe impl<T: Zeroable + Send> Send for ZeroedArray<T> {}

impl<T: Zeroable> ZeroedArray<T> {
    /// `None` when the mapping cannot be made (the caller then has no table: that is its cap).
    pub fn new(len: usize) -> Option<ZeroedArray<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?.max(1);
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(ZeroedArray {
            ptr: ptr as *mut T,
            len,
        })
    }
}

impl<T: Zeroable> Deref for ZeroedArray<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` zeroed (hence valid, by `Zeroable`) values of T and
        // page alignment satisfies any T's alignment.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Zeroable> Drop for ZeroedArray<T> {
    fn drop(&mut self) {
        let bytes = (self.len * std::mem::size_of::<T>()).max(1);
        // SAFETY: unmapping exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, bytes) };
    }
}
