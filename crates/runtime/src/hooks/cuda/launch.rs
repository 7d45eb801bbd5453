//! Kernel launches: `cuLaunchKernel`, `cuLaunchKernelEx`, `cudaLaunchKernel` and
//! `cudaLaunchKernelExC` become KERNEL_LAUNCH rows (Name = the kernel, Attr `streamId` = the
//! stream handle, 0 for the legacy default stream) when `--level=kernel` asks for them.
//!
//! Kernel names: the driver's `cuFuncGetName` for a `CUfunction` (CUDA ≥ 12.3); for the
//! runtime's host stub, `cudaFuncGetName` (CUDA ≥ 12.3), else the stub's symbol (`dladdr`),
//! else its address. Names are demangled and remembered per function.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::Mutex;

use libc::{c_char, c_void};

use super::hook::cuda_hook;
use super::resolve::Helper;
use super::{record, records, CuResult, Layer, RuntimeCall, CUDA_ERROR_NOT_INITIALIZED};

/// `dim3`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dim3 {
    x: u32,
    y: u32,
    z: u32,
}

/// The start of `CUlaunchConfig`: grid and block sizes, shared memory, then `CUstream hStream`.
#[repr(C)]
pub struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: *mut c_void,
}

/// The start of `cudaLaunchConfig_t`: `dim3 gridDim, blockDim; size_t dynamicSmemBytes;
/// cudaStream_t stream; ...`.
#[repr(C)]
pub struct CudaLaunchConfig {
    grid: Dim3,
    block: Dim3,
    shared_mem: usize,
    stream: *mut c_void,
}

type GetNameFn = unsafe extern "C" fn(*mut *const c_char, *const c_void) -> CuResult;

static CU_FUNC_GET_NAME: Helper = Helper::new(c"cuFuncGetName", Layer::Driver);
static CUDA_FUNC_GET_NAME: Helper = Helper::new(c"cudaFuncGetName", Layer::Runtime);

static NAMES: Mutex<Option<HashMap<(bool, usize), String>>> = Mutex::new(None);

/// The kernel's name, asked once per function.
fn kernel_name(layer: Layer, func: *const c_void) -> String {
    let key = (layer == Layer::Driver, func as usize);
    if let Some(name) = NAMES
        .lock()
        .ok()
        .and_then(|names| names.as_ref()?.get(&key).cloned())
    {
        return name;
    }
    let name = look_up_name(layer, func);
    if let Ok(mut names) = NAMES.lock() {
        names
            .get_or_insert_with(HashMap::new)
            .insert(key, name.clone());
    }
    name
}

fn look_up_name(layer: Layer, func: *const c_void) -> String {
    let helper = match layer {
        Layer::Driver => &CU_FUNC_GET_NAME,
        Layer::Runtime => &CUDA_FUNC_GET_NAME,
    };
    if let Some(addr) = helper.get() {
        // SAFETY: `cuFuncGetName(const char**, CUfunction)` / `cudaFuncGetName(const char**,
        // const void*)`: both write a pointer to a string the library keeps.
        let get = unsafe { std::mem::transmute::<usize, GetNameFn>(addr) };
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: see above.
        if unsafe { get(&mut name, func) } == 0 && !name.is_null() {
            // SAFETY: a NUL-terminated string owned by the library.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            if !name.is_empty() {
                return demangle(&name);
            }
        }
    }
    if layer == Layer::Runtime {
        // SAFETY: `Dl_info` is a C struct of four raw pointers, for which all-zero bytes (null
        // pointers) are a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables.
        if unsafe { libc::dladdr(func, &mut info) } != 0
            && !info.dli_sname.is_null()
            && std::ptr::eq(info.dli_saddr, func)
        {
            // SAFETY: a NUL-terminated symbol name.
            let name = unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy();
            return demangle(&name);
        }
    }
    format!("0x{:x}", func as usize)
}

fn demangle(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

fn stream_id(stream: *mut c_void) -> u64 {
    stream as u64
}

cuda_hook! {
    /// `CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ,
    /// blockDimX, blockDimY, blockDimZ, unsigned sharedMemBytes, CUstream, void** params,
    /// void** extra)`.
    LAUNCH_KERNEL: LaunchKernelFn = cuLaunchKernel / launch_kernel, Layer::Driver,
    (
        func: *mut c_void, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
        shared_mem: u32, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        // SAFETY: the caller's arguments, passed on unchanged to the real `cuLaunchKernel` under
        // its contract, which our caller upholds.
        let rc = unsafe { real(func, gx, gy, gz, bx, by, bz, shared_mem, stream, params, extra) };
        if rc == 0 && records(Layer::Driver) {
            record::launched(Layer::Driver, || kernel_name(Layer::Driver, func), stream_id(stream));
        }
        rc
    }
}

cuda_hook! {
    /// `CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** params,
    /// void** extra)`.
    LAUNCH_KERNEL_EX: LaunchKernelExFn = cuLaunchKernelEx / launch_kernel_ex, Layer::Driver,
    (config: *const LaunchConfig, func: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
        -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        // SAFETY: the caller's arguments, passed on unchanged to the real `cuLaunchKernelEx` under
        // its contract, which our caller upholds.
        let rc = unsafe { real(config, func, params, extra) };
        if rc == 0 && records(Layer::Driver) && !config.is_null() {
            // SAFETY: the caller's config, valid for the call.
            let stream = unsafe { (*config).stream };
            record::launched(Layer::Driver, || kernel_name(Layer::Driver, func), stream_id(stream));
        }
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
    /// size_t sharedMem, cudaStream_t)`.
    CUDA_LAUNCH_KERNEL: CudaLaunchKernelFn = cudaLaunchKernel / cuda_launch_kernel, Layer::Runtime,
    (
        func: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared_mem: usize,
        stream: *mut c_void,
    ) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaLaunchKernel`
            // under its contract, which our caller upholds.
            return unsafe { real(func, grid, block, args, shared_mem, stream) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(func, grid, block, args, shared_mem, stream) }
        };
        if rc == 0 {
            record::launched(Layer::Runtime, || kernel_name(Layer::Runtime, func), stream_id(stream));
        }
        rc
    }
}

cuda_hook! {
    /// `cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void* func,
    /// void** args)` (what the `cudaLaunchKernelEx` template calls).
    CUDA_LAUNCH_KERNEL_EX: CudaLaunchKernelExFn = cudaLaunchKernelExC / cuda_launch_kernel_ex,
    Layer::Runtime,
    (config: *const CudaLaunchConfig, func: *const c_void, args: *mut *mut c_void) -> CuResult,
    missing = CUDA_ERROR_NOT_INITIALIZED,
    |real| {
        if !records(Layer::Runtime) {
            // SAFETY: the caller's arguments, passed on unchanged to the real `cudaLaunchKernelExC`
            // under its contract, which our caller upholds.
            return unsafe { real(config, func, args) };
        }
        let rc = {
            let _nested = RuntimeCall::enter();
            // SAFETY: as above, the caller's arguments passed on unchanged.
            unsafe { real(config, func, args) }
        };
        if rc == 0 && !config.is_null() {
            // SAFETY: the caller's config, valid for the call.
            let stream = unsafe { (*config).stream };
            record::launched(Layer::Runtime, || kernel_name(Layer::Runtime, func), stream_id(stream));
        }
        rc
    }
}
