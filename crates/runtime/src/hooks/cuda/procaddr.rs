//! `cuGetProcAddress` (CUDA 11.3, 4 arguments) and `cuGetProcAddress_v2` (CUDA 12, with a
//! status out-parameter): the way cudart — and with it PyTorch, NCCL, cuBLAS — obtains every
//! driver entry point. The hooks call the real function and hand out wrappers for the entry
//! points we hook; and the tables of which names are ours, for `dlsym` too.
//!
//! `cuGetProcAddress` takes base names (`cuMemAlloc`) and a CUDA version, and returns the
//! variant of that version: a `_v2` ABI for `cuMemAlloc`/`cuMemFree`/`cuMemAllocPitch` from
//! 3.2 on (older versions get the 32-bit ABI, which is never wrapped), per-thread-stream
//! variants under a flag. The wrapper is chosen by the real pointer returned, so each variant
//! keeps its own. `cuCtxSynchronize` is wrapped only for versions before 13.0, in case a later
//! one maps the name to `cuCtxSynchronize_v2`, which takes a context.

use std::ffi::CStr;

use libc::{c_char, c_void};

use super::hook::{cuda_hook, Wrap};
use super::{launch, memory, sync, CuResult, Layer, CUDA_ERROR_NOT_INITIALIZED};

cuda_hook! {
    /// `CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
    /// cuuint64_t flags)`.
    GET_PROC_ADDRESS: GetProcAddressFn = cuGetProcAddress / get_proc_address, Layer::Driver,
    (symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        // SAFETY: the caller's arguments, passed on unchanged to the real `cuGetProcAddress` under
        // its contract, which our caller upholds.
        let rc = unsafe { real(symbol, pfn, version, flags) };
        // SAFETY: `symbol` and `pfn` are the caller's, just passed to the real call.
        unsafe { wrap_result(rc, symbol, pfn, version) };
        rc
    }
}

cuda_hook! {
    /// `CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
    /// cuuint64_t flags, CUdriverProcAddressQueryResult* symbolStatus)`.
    GET_PROC_ADDRESS_V2: GetProcAddressV2Fn = cuGetProcAddress_v2 / get_proc_address_v2,
    Layer::Driver,
    (symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut i32)
        -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        // SAFETY: the caller's arguments, passed on unchanged to the real `cuGetProcAddress_v2`
        // under its contract, which our caller upholds.
        let rc = unsafe { real(symbol, pfn, version, flags, status) };
        // SAFETY: `symbol` and `pfn` are the caller's, just passed to the real call.
        unsafe { wrap_result(rc, symbol, pfn, version) };
        rc
    }
}

/// Replaces the entry point a successful lookup wrote by its wrapper.
///
/// # Safety
/// `symbol` and `pfn` as the real call received them.
unsafe fn wrap_result(rc: CuResult, symbol: *const c_char, pfn: *mut *mut c_void, version: i32) {
    if rc != 0 || symbol.is_null() || pfn.is_null() {
        return;
    }
    let Some(_entered) = crate::guard::Entered::try_enter() else {
        return;
    };
    // SAFETY: both are non-null (checked above) and, the real call having succeeded with them,
    // `symbol` is a NUL-terminated name and `pfn` holds the entry point it wrote.
    let (name, real) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn as usize) };
    if real == 0 {
        return;
    }
    if let Some(hook) = by_base_name(name, version) {
        // SAFETY: the caller's out-parameter, non-null and just written by the real call.
        unsafe { *pfn = hook.wrap(real) as *mut c_void };
    }
}

/// A hooked function under the names a lookup may use.
struct Entry {
    /// The exported (direct-linking) symbol, which `RTLD_DEFAULT` finds.
    export: &'static str,
    /// Other exact symbols `dlsym` may be asked for (per-thread default stream variants).
    also: &'static [&'static str],
    /// The name `cuGetProcAddress` takes, with the versions whose variant has our signature.
    base: &'static str,
    versions: std::ops::Range<i32>,
    hook: &'static dyn Wrap,
}

const ANY: std::ops::Range<i32> = 0..i32::MAX;
const NO_BASE: &str = "";

#[rustfmt::skip]
static TABLE: &[Entry] = &[
    Entry { export: "cuMemAlloc_v2", also: &[], base: "cuMemAlloc", versions: 3020..i32::MAX, hook: &memory::MEM_ALLOC },
    Entry { export: "cuMemAllocPitch_v2", also: &[], base: "cuMemAllocPitch", versions: 3020..i32::MAX, hook: &memory::MEM_ALLOC_PITCH },
    Entry { export: "cuMemAllocAsync", also: &["cuMemAllocAsync_ptsz"], base: "cuMemAllocAsync", versions: ANY, hook: &memory::MEM_ALLOC_ASYNC },
    Entry { export: "cuMemAllocManaged", also: &[], base: "cuMemAllocManaged", versions: ANY, hook: &memory::MEM_ALLOC_MANAGED },
    Entry { export: "cuMemFree_v2", also: &[], base: "cuMemFree", versions: 3020..i32::MAX, hook: &memory::MEM_FREE },
    Entry { export: "cuMemFreeAsync", also: &["cuMemFreeAsync_ptsz"], base: "cuMemFreeAsync", versions: ANY, hook: &memory::MEM_FREE_ASYNC },
    Entry { export: "cuMemCreate", also: &[], base: "cuMemCreate", versions: ANY, hook: &memory::MEM_CREATE },
    Entry { export: "cuMemRelease", also: &[], base: "cuMemRelease", versions: ANY, hook: &memory::MEM_RELEASE },
    Entry { export: "cuMemMap", also: &[], base: "cuMemMap", versions: ANY, hook: &memory::MEM_MAP },
    Entry { export: "cuMemUnmap", also: &[], base: "cuMemUnmap", versions: ANY, hook: &memory::MEM_UNMAP },
    Entry { export: "cuLaunchKernel", also: &["cuLaunchKernel_ptsz"], base: "cuLaunchKernel", versions: ANY, hook: &launch::LAUNCH_KERNEL },
    Entry { export: "cuLaunchKernelEx", also: &["cuLaunchKernelEx_ptsz"], base: "cuLaunchKernelEx", versions: ANY, hook: &launch::LAUNCH_KERNEL_EX },
    Entry { export: "cuEventRecord", also: &["cuEventRecord_ptsz"], base: "cuEventRecord", versions: ANY, hook: &sync::EVENT_RECORD },
    Entry { export: "cuStreamWaitEvent", also: &["cuStreamWaitEvent_ptsz"], base: "cuStreamWaitEvent", versions: ANY, hook: &sync::STREAM_WAIT_EVENT },
    Entry { export: "cuStreamSynchronize", also: &["cuStreamSynchronize_ptsz"], base: "cuStreamSynchronize", versions: ANY, hook: &sync::STREAM_SYNCHRONIZE },
    Entry { export: "cuEventSynchronize", also: &[], base: "cuEventSynchronize", versions: ANY, hook: &sync::EVENT_SYNCHRONIZE },
    Entry { export: "cuCtxSynchronize", also: &[], base: "cuCtxSynchronize", versions: 0..13000, hook: &sync::CTX_SYNCHRONIZE },
    // cuGetProcAddress("cuGetProcAddress") returns the 5-argument variant from CUDA 12.0 on.
    Entry { export: "cuGetProcAddress", also: &[], base: "cuGetProcAddress", versions: 0..12000, hook: &GET_PROC_ADDRESS },
    Entry { export: "cuGetProcAddress_v2", also: &[], base: "cuGetProcAddress", versions: 12000..i32::MAX, hook: &GET_PROC_ADDRESS_V2 },
    Entry { export: "cudaMalloc", also: &[], base: NO_BASE, versions: ANY, hook: &memory::CUDA_MALLOC },
    Entry { export: "cudaMallocAsync", also: &["cudaMallocAsync_ptsz"], base: NO_BASE, versions: ANY, hook: &memory::CUDA_MALLOC_ASYNC },
    Entry { export: "cudaMallocManaged", also: &[], base: NO_BASE, versions: ANY, hook: &memory::CUDA_MALLOC_MANAGED },
    Entry { export: "cudaMallocPitch", also: &[], base: NO_BASE, versions: ANY, hook: &memory::CUDA_MALLOC_PITCH },
    Entry { export: "cudaFree", also: &[], base: NO_BASE, versions: ANY, hook: &memory::CUDA_FREE },
    Entry { export: "cudaFreeAsync", also: &["cudaFreeAsync_ptsz"], base: NO_BASE, versions: ANY, hook: &memory::CUDA_FREE_ASYNC },
    Entry { export: "cudaLaunchKernel", also: &["cudaLaunchKernel_ptsz"], base: NO_BASE, versions: ANY, hook: &launch::CUDA_LAUNCH_KERNEL },
    Entry { export: "cudaLaunchKernelExC", also: &["cudaLaunchKernelExC_ptsz"], base: NO_BASE, versions: ANY, hook: &launch::CUDA_LAUNCH_KERNEL_EX },
    Entry { export: "cudaEventRecord", also: &["cudaEventRecord_ptsz"], base: NO_BASE, versions: ANY, hook: &sync::CUDA_EVENT_RECORD },
    Entry { export: "cudaStreamWaitEvent", also: &["cudaStreamWaitEvent_ptsz"], base: NO_BASE, versions: ANY, hook: &sync::CUDA_STREAM_WAIT_EVENT },
    Entry { export: "cudaStreamSynchronize", also: &["cudaStreamSynchronize_ptsz"], base: NO_BASE, versions: ANY, hook: &sync::CUDA_STREAM_SYNCHRONIZE },
    Entry { export: "cudaEventSynchronize", also: &[], base: NO_BASE, versions: ANY, hook: &sync::CUDA_EVENT_SYNCHRONIZE },
    Entry { export: "cudaDeviceSynchronize", also: &[], base: NO_BASE, versions: ANY, hook: &sync::CUDA_DEVICE_SYNCHRONIZE },
];

/// The hook exported under `name`.
pub fn exported(name: &[u8]) -> Option<&'static dyn Wrap> {
    TABLE
        .iter()
        .find(|e| e.export.as_bytes() == name)
        .map(|e| e.hook)
}

/// The hook for a `dlsym` of the exact symbol `name`.
pub fn by_symbol(name: &[u8]) -> Option<&'static dyn Wrap> {
    TABLE
        .iter()
        .find(|e| e.export.as_bytes() == name || e.also.iter().any(|a| a.as_bytes() == name))
        .map(|e| e.hook)
}

/// The hook for a `cuGetProcAddress` of the base name `name` at CUDA `version`.
fn by_base_name(name: &[u8], version: i32) -> Option<&'static dyn Wrap> {
    TABLE
        .iter()
        .find(|e| !e.base.is_empty() && e.base.as_bytes() == name && e.versions.contains(&version))
        .map(|e| e.hook)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: Option<&'static dyn Wrap>, b: &'static dyn Wrap) -> bool {
        a.is_some_and(|a| std::ptr::addr_eq(a as *const dyn Wrap, b as *const dyn Wrap))
    }

    #[test]
    fn versions_pick_the_abi_we_wrap() {
        assert!(by_base_name(b"cuMemAlloc", 3010).is_none());
        assert!(same(by_base_name(b"cuMemAlloc", 12000), &memory::MEM_ALLOC));
        assert!(same(
            by_base_name(b"cuGetProcAddress", 11030),
            &GET_PROC_ADDRESS
        ));
        assert!(same(
            by_base_name(b"cuGetProcAddress", 12040),
            &GET_PROC_ADDRESS_V2
        ));
        assert!(by_base_name(b"cuCtxSynchronize", 13000).is_none());
        assert!(by_base_name(b"cudaMalloc", 12000).is_none());
        assert!(by_base_name(b"", 12000).is_none());
    }

    #[test]
    fn exact_symbols() {
        assert!(same(
            by_symbol(b"cuLaunchKernel_ptsz"),
            &launch::LAUNCH_KERNEL
        ));
        assert!(exported(b"cuLaunchKernel_ptsz").is_none());
        assert!(
            by_symbol(b"cuMemAlloc").is_none(),
            "the 32-bit ABI is never wrapped"
        );
        assert!(same(exported(b"cudaFree"), &memory::CUDA_FREE));
        assert!(by_symbol(b"cuInit").is_none());
    }

    #[test]
    fn a_wrapper_is_bound_to_one_real_function() {
        let hook: &dyn Wrap = &launch::CUDA_LAUNCH_KERNEL_EX;
        let (a, b) = (0x1000usize, 0x2000usize);
        let wa = hook.wrap(a);
        let wb = hook.wrap(b);
        assert!(wa != a && wb != b && wa != wb);
        assert_eq!(hook.wrap(a), wa);
        assert_eq!(hook.wrap(wa), wa, "a wrapper is never wrapped again");
        // Two instances left after a and b (instance 0 is the export): then the real one.
        let wc = hook.wrap(0x3000);
        assert!(wc != 0x3000);
        assert_eq!(hook.wrap(0x4000), 0x4000);
        assert_eq!(hook.wrap(0), 0);
    }
}
