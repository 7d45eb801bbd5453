//! A fixed-length array of zero-initialised values in its own anonymous mapping: the kernel
//! commits a page only when something in it is touched, so a table sized for the cap costs
//! memory only for the entries in use. A closed window unmaps it with
//! [`ZeroedArray::release`], which gives back the pages and the address range.

use std::ops::Deref;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Types for which all-zero bytes are a valid value (atomics, integers).
///
/// # Safety
/// Implementors must be valid when every byte is zero.
pub unsafe trait Zeroable {}

pub struct ZeroedArray<T: Zeroable> {
    // Atomics because `release` changes them through a shared reference; the hot path reads
    // them with plain loads (relaxed and acquire loads are plain moves on x86-64).
    ptr: AtomicPtr<T>,
    len: AtomicUsize,
    /// The mapping's length in bytes, 0 once released.
    mapped: AtomicUsize,
}

// SAFETY: the array owns its mapping; sharing it is as safe as sharing `[T]` (and `release`
// has its own contract).
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
            ptr: AtomicPtr::new(ptr as *mut T),
            len: AtomicUsize::new(len),
            mapped: AtomicUsize::new(bytes),
        })
    }

    /// Unmaps the array; from then on it is empty (`get` finds nothing), so a caller that
    /// looks it up afresh afterwards reads no freed memory. Idempotent.
    ///
    /// # Safety
    /// No slice obtained from this array before the call may be used after it: no other thread
    /// may be reading or writing an element, or hold a reference from an earlier `deref`.
    pub unsafe fn release(&self) {
        // Empty first, then the pointer: a `deref` that sees the new pointer (acquire) sees the
        // zero length too, so it never pairs the old length with a dangling pointer.
        self.len.store(0, Ordering::Release);
        let old = self
            .ptr
            .swap(std::ptr::NonNull::dangling().as_ptr(), Ordering::AcqRel);
        let bytes = self.mapped.swap(0, Ordering::AcqRel);
        if bytes != 0 {
            // SAFETY: unmapping exactly the mapping made in `new`, once (`mapped` was swapped
            // to 0); the caller guarantees nothing uses it any more.
            unsafe { libc::munmap(old as *mut libc::c_void, bytes) };
        }
    }
}

impl<T: Zeroable> ZeroedArray<T> {
    /// Gives the array's pages back to the kernel and keeps the mapping: every element reads
    /// zero afterwards. Unlike [`ZeroedArray::release`] it is safe while other threads still
    /// read or write elements (they see zeros, or fault a fresh zero page in).
    pub fn zero_and_give_back(&self) {
        let bytes = self.mapped.load(Ordering::Acquire);
        let ptr = self.ptr.load(Ordering::Acquire);
        if bytes != 0 {
            // SAFETY: advice on exactly the private anonymous mapping made in `new`, which stays
            // mapped; MADV_DONTNEED makes its pages read as zeros, a valid value of T.
            unsafe { libc::madvise(ptr as *mut libc::c_void, bytes, libc::MADV_DONTNEED) };
        }
    }
}

impl<T: Zeroable> Deref for ZeroedArray<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        let ptr = self.ptr.load(Ordering::Acquire);
        let len = self.len.load(Ordering::Acquire);
        // SAFETY: until `release`, the mapping holds `len` zeroed (hence valid, by `Zeroable`)
        // values of T and page alignment satisfies any T's alignment; after it, `len` is 0 and
        // `ptr` dangling but aligned, a valid empty slice. `release`'s contract keeps a slice
        // made before it from being used after it.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

impl<T: Zeroable> Drop for ZeroedArray<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no slice of the array is alive.
        unsafe { self.release() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    // SAFETY: an atomic integer; all-zero bytes are 0.
    unsafe impl Zeroable for AtomicU64 {}

    #[test]
    fn released_arrays_are_empty_and_unmapped() {
        let a = ZeroedArray::<AtomicU64>::new(1 << 20).expect("mmap");
        assert_eq!(a.len(), 1 << 20);
        a[12345].store(7, Ordering::Relaxed);
        assert_eq!(a[12345].load(Ordering::Relaxed), 7);
        assert_eq!(a[0].load(Ordering::Relaxed), 0);
        // SAFETY: no slice of `a` is alive.
        unsafe { a.release() };
        assert!(a.is_empty());
        assert!(a.get(12345).is_none());
        // Twice is harmless, and so is the drop after it.
        // SAFETY: as above.
        unsafe { a.release() };
    }
}
