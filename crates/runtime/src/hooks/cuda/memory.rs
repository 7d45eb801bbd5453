//! Device memory: the driver's `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemAllocAsync`,
//! `cuMemAllocManaged`, `cuMemFree_v2`, `cuMemFreeAsync`, the virtual memory API
//! (`cuMemCreate`, `cuMemRelease`, `cuMemMap`, `cuMemUnmap`) and the runtime's `cudaMalloc`,
//! `cudaMallocAsync`, `cudaMallocManaged`, `cudaMallocPitch`, `cudaFree`, `cudaFreeAsync`.
//! Managed memory is recorded on the device current at the call.
//!
//! The virtual memory API is recorded by its physical allocations: a MALLOC when `cuMemCreate`
//! makes one (Ptr = the allocation handle), a FREE once it is both released and unmapped
//! everywhere, which is when the driver gives the memory back.

use libc::c_void;

use super::hook::cuda_hook;
use super::record;
use super::{records, CuResult, Layer, RuntimeCall, CUDA_ERROR_NOT_INITIALIZED};
use msmemscope_core::events::DeviceId;

/// Reads an out-parameter the real call filled (0 when it is null or the call failed).
///
/// # Safety
/// `out` is null or points to a `T` the caller passed for the real call to fill.
unsafe fn out<T: Copy + Into<u64>>(rc: CuResult, out: *const T) -> u64 {
    if rc != 0 || out.is_null() {
        return 0;
    }
    // SAFETY: non-null, so by this function's contract it points to a `T` the real call filled
    // (it succeeded); an unaligned read makes no assumption about the caller's alignment.
    unsafe { std::ptr::read_unaligned(out) }.into()
}

cuda_hook! {
    /// `CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize)`.
    MEM_ALLOC: MemAllocFn = cuMemAlloc_v2 / mem_alloc, Layer::Driver,
    (dptr: *mut u64, size: usize) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemAlloc_v2` under
            // its contract, which our caller upholds.
            return unsafe { real(dptr, size) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(dptr, size) };
        // SAFETY: `dptr` is the caller's `CUdeviceptr*` out-parameter, which the real call
        // filled if it succeeded (`out` reads it only then, and only if non-null).
        let addr = unsafe { out(rc, dptr) };
        record::allocated(Layer::Driver, "cuMemAlloc_v2", rc, addr, size as u64);
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemAllocPitch_v2(CUdeviceptr*, size_t* pitch, size_t width, size_t height,
    /// unsigned elementSize)`: `pitch * height` bytes.
    MEM_ALLOC_PITCH: MemAllocPitchFn = cuMemAllocPitch_v2 / mem_alloc_pitch, Layer::Driver,
    (dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element: u32) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemAllocPitch_v2`
            // under its contract, which our caller upholds.
            return unsafe { real(dptr, pitch, width, height, element) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(dptr, pitch, width, height, element) };
        // SAFETY: `pitch` is the caller's `size_t*` out-parameter (a `size_t` is 64 bits
        // here), filled by the real call if it succeeded; `out` reads it only then.
        let row_bytes = match unsafe { out(rc, pitch as *const u64) } {
            0 => width as u64,
            p => p,
        };
        let size = row_bytes.saturating_mul(height as u64);
        // SAFETY: `dptr` is the caller's `CUdeviceptr*` out-parameter, which the real call
        // filled if it succeeded (`out` reads it only then, and only if non-null).
        let addr = unsafe { out(rc, dptr) };
        record::allocated(Layer::Driver, "cuMemAllocPitch_v2", rc, addr, size);
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemAllocAsync(CUdeviceptr*, size_t, CUstream)`.
    MEM_ALLOC_ASYNC: MemAllocAsyncFn = cuMemAllocAsync / mem_alloc_async, Layer::Driver,
    (dptr: *mut u64, size: usize, stream: *mut c_void) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemAllocAsync`
            // under its contract, which our caller upholds.
            return unsafe { real(dptr, size, stream) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(dptr, size, stream) };
        // SAFETY: `dptr` is the caller's `CUdeviceptr*` out-parameter, which the real call
        // filled if it succeeded (`out` reads it only then, and only if non-null).
        let addr = unsafe { out(rc, dptr) };
        record::allocated(Layer::Driver, "cuMemAllocAsync", rc, addr, size as u64);
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemAllocManaged(CUdeviceptr*, size_t, unsigned flags)`.
    MEM_ALLOC_MANAGED: MemAllocManagedFn = cuMemAllocManaged / mem_alloc_managed, Layer::Driver,
    (dptr: *mut u64, size: usize, flags: u32) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemAllocManaged`
            // under its contract, which our caller upholds.
            return unsafe { real(dptr, size, flags) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(dptr, size, flags) };
        // SAFETY: `dptr` is the caller's `CUdeviceptr*` out-parameter, which the real call
        // filled if it succeeded (`out` reads it only then, and only if non-null).
        let addr = unsafe { out(rc, dptr) };
        record::allocated(Layer::Driver, "cuMemAllocManaged", rc, addr, size as u64);
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemFree_v2(CUdeviceptr)`.
    MEM_FREE: MemFreeFn = cuMemFree_v2 / mem_free, Layer::Driver,
    (dptr: u64) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemFree_v2` under
            // its contract, which our caller upholds.
            return unsafe { real(dptr) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(dptr) };
        if record::ok(rc) {
            record::freed(Layer::Driver, dptr);
        }
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemFreeAsync(CUdeviceptr, CUstream)`.
    MEM_FREE_ASYNC: MemFreeAsyncFn = cuMemFreeAsync / mem_free_async, Layer::Driver,
    (dptr: u64, stream: *mut c_void) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemFreeAsync`
            // under its contract, which our caller upholds.
            return unsafe { real(dptr, stream) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(dptr, stream) };
        if record::ok(rc) {
            record::freed(Layer::Driver, dptr);
        }
        rc
    }
}

/// The start of `CUmemAllocationProp`: `{ CUmemAllocationType type; CUmemAllocationHandleType
/// requestedHandleTypes; CUmemLocation location { CUmemLocationType type; int id; }; ... }`.
#[repr(C)]
pub struct MemAllocationProp {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

cuda_hook! {
    /// `CUresult cuMemCreate(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
    /// unsigned long long flags)`.
    MEM_CREATE: MemCreateFn = cuMemCreate / mem_create, Layer::Driver,
    (handle: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemCreate` under
            // its contract, which our caller upholds.
            return unsafe { real(handle, size, prop, flags) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(handle, size, prop, flags) };
        if record::ok(rc) && !handle.is_null() {
            let device = if prop.is_null() {
                DeviceId::None
            } else {
                // SAFETY: the caller passed a valid property struct for the real call.
                let prop = unsafe { &*prop };
                if prop.location_type == LOCATION_DEVICE && prop.location_id >= 0 {
                    DeviceId::Cuda(prop.location_id as u32)
                } else {
                    DeviceId::Cpu
                }
            };
            // SAFETY: `handle` is the caller's out-parameter (non-null, checked above), which
            // the successful real call filled.
            let handle = unsafe { out(rc, handle) };
            record::created(handle, size as u64, device);
        } else if rc == super::CUDA_ERROR_OUT_OF_MEMORY {
            record::allocated(Layer::Driver, "cuMemCreate", rc, 0, size as u64);
        }
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemRelease(CUmemGenericAllocationHandle)`.
    MEM_RELEASE: MemReleaseFn = cuMemRelease / mem_release, Layer::Driver,
    (handle: u64) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemRelease` under
            // its contract, which our caller upholds.
            return unsafe { real(handle) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(handle) };
        if record::ok(rc) {
            record::released(handle);
        }
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemMap(CUdeviceptr, size_t, size_t offset, CUmemGenericAllocationHandle,
    /// unsigned long long flags)`.
    MEM_MAP: MemMapFn = cuMemMap / mem_map, Layer::Driver,
    (ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemMap` under its
            // contract, which our caller upholds.
            return unsafe { real(ptr, size, offset, handle, flags) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(ptr, size, offset, handle, flags) };
        if record::ok(rc) {
            record::mapped(ptr, size as u64, handle);
        }
        rc
    }
}

cuda_hook! {
    /// `CUresult cuMemUnmap(CUdeviceptr, size_t)`.
    MEM_UNMAP: MemUnmapFn = cuMemUnmap / mem_unmap, Layer::Driver,
    (ptr: u64, size: usize) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Driver) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cuMemUnmap` under
            // its contract, which our caller upholds.
            return unsafe { real(ptr, size) };
        }
        // SAFETY: as above, the caller's arguments passed on unchanged.
        let rc = unsafe { real(ptr, size) };
        if record::ok(rc) {
            record::unmapped(ptr, size as u64);
        }
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaMalloc(void** devPtr, size_t size)`.
    CUDA_MALLOC: CudaMallocFn = cudaMalloc / cuda_malloc, Layer::Runtime,
    (dev_ptr: *mut *mut c_void, size: usize) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaMalloc` under
            // its contract, which our caller upholds.
            return unsafe { real(dev_ptr, size) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(dev_ptr, size) }
        };
        // SAFETY: `dev_ptr` is the caller's `void**` out-parameter, filled by the real call if
        // it succeeded (`out` reads it only then); the pointer is read as a 64-bit address.
        let addr = unsafe { out(rc, dev_ptr as *const usize as *const u64) };
        record::allocated(Layer::Runtime, "cudaMalloc", rc, addr, size as u64);
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t)`.
    CUDA_MALLOC_ASYNC: CudaMallocAsyncFn = cudaMallocAsync / cuda_malloc_async, Layer::Runtime,
    (dev_ptr: *mut *mut c_void, size: usize, stream: *mut c_void) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaMallocAsync`
            // under its contract, which our caller upholds.
            return unsafe { real(dev_ptr, size, stream) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(dev_ptr, size, stream) }
        };
        // SAFETY: `dev_ptr` is the caller's `void**` out-parameter, filled by the real call if
        // it succeeded (`out` reads it only then); the pointer is read as a 64-bit address.
        let addr = unsafe { out(rc, dev_ptr as *const usize as *const u64) };
        record::allocated(Layer::Runtime, "cudaMallocAsync", rc, addr, size as u64);
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned flags)`.
    CUDA_MALLOC_MANAGED: CudaMallocManagedFn = cudaMallocManaged / cuda_malloc_managed,
    Layer::Runtime,
    (dev_ptr: *mut *mut c_void, size: usize, flags: u32) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaMallocManaged`
            // under its contract, which our caller upholds.
            return unsafe { real(dev_ptr, size, flags) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(dev_ptr, size, flags) }
        };
        // SAFETY: `dev_ptr` is the caller's `void**` out-parameter, filled by the real call if
        // it succeeded (`out` reads it only then); the pointer is read as a 64-bit address.
        let addr = unsafe { out(rc, dev_ptr as *const usize as *const u64) };
        record::allocated(Layer::Runtime, "cudaMallocManaged", rc, addr, size as u64);
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height)`:
    /// `pitch * height` bytes.
    CUDA_MALLOC_PITCH: CudaMallocPitchFn = cudaMallocPitch / cuda_malloc_pitch, Layer::Runtime,
    (dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaMallocPitch`
            // under its contract, which our caller upholds.
            return unsafe { real(dev_ptr, pitch, width, height) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(dev_ptr, pitch, width, height) }
        };
        // SAFETY: `pitch` is the caller's `size_t*` out-parameter (a `size_t` is 64 bits
        // here), filled by the real call if it succeeded; `out` reads it only then.
        let row_bytes = match unsafe { out(rc, pitch as *const u64) } {
            0 => width as u64,
            p => p,
        };
        // SAFETY: `dev_ptr` is the caller's `void**` out-parameter, filled by the real call if
        // it succeeded (`out` reads it only then); the pointer is read as a 64-bit address.
        let addr = unsafe { out(rc, dev_ptr as *const usize as *const u64) };
        let size = row_bytes.saturating_mul(height as u64);
        record::allocated(Layer::Runtime, "cudaMallocPitch", rc, addr, size);
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaFree(void*)`.
    CUDA_FREE: CudaFreeFn = cudaFree / cuda_free, Layer::Runtime,
    (ptr: *mut c_void) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaFree` under its
            // contract, which our caller upholds.
            return unsafe { real(ptr) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(ptr) }
        };
        if record::ok(rc) {
            record::freed(Layer::Runtime, ptr as u64);
        }
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaFreeAsync(void*, cudaStream_t)`.
    CUDA_FREE_ASYNC: CudaFreeAsyncFn = cudaFreeAsync / cuda_free_async, Layer::Runtime,
    (ptr: *mut c_void, stream: *mut c_void) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaFreeAsync` under
            // its contract, which our caller upholds.
            return unsafe { real(ptr, stream) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(ptr, stream) }
        };
        if record::ok(rc) {
            record::freed(Layer::Runtime, ptr as u64);
        }
        rc
    }
}
