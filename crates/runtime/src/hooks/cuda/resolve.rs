//! Finding the real CUDA functions behind the hooks, and a few helpers of the driver and
//! runtime (current device, kernel names) that the hooks call.
//!
//! A name is looked up after this library (`RTLD_NEXT`) first: that finds a libcuda/libcudart
//! in the global scope. A library loaded with `RTLD_LOCAL` (Python extensions, cudart's own
//! `dlopen` of libcuda) is not there, so the loaded modules are searched next, by file name,
//! through a handle of their own (`RTLD_NOLOAD`: nothing is loaded). Lookups that fail leave
//! no `dlerror` behind.

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_void};

use super::dlsym::real_dlsym;
use super::Layer;

impl Layer {
    /// Whether a loaded module's path is this layer's library.
    fn owns(self, path: &[u8]) -> bool {
        let base = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
        match self {
            Layer::Driver => base.starts_with(b"libcuda.so"),
            Layer::Runtime => base.starts_with(b"libcudart.so"),
        }
    }
}

/// The real function `name` of `layer`'s library, or 0.
pub fn real_symbol(name: &CStr, layer: Layer) -> usize {
    lookup(name, layer).0
}

/// (address, whether the layer's library is loaded at all).
fn lookup(name: &CStr, layer: Layer) -> (usize, bool) {
    let Some(dlsym) = real_dlsym() else {
        return (0, false);
    };
    // SAFETY: a lookup by a NUL-terminated name; RTLD_NEXT is relative to this library.
    let next = unsafe { dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if next != 0 {
        return (next, true);
    }
    clear_dlerror();
    let modules = loaded_modules(layer);
    for path in &modules {
        // SAFETY: RTLD_NOLOAD only returns a handle to a module already loaded.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let found = unsafe { dlsym(handle, name.as_ptr()) } as usize;
        // SAFETY: drops the reference RTLD_NOLOAD took.
        unsafe { libc::dlclose(handle) };
        if found != 0 {
            return (found, true);
        }
    }
    clear_dlerror();
    (0, !modules.is_empty())
}

fn clear_dlerror() {
    // SAFETY: dlerror has no preconditions; reading it clears the thread's pending error.
    unsafe { libc::dlerror() };
}

/// The paths of the loaded modules that are `layer`'s library.
fn loaded_modules(layer: Layer) -> Vec<CString> {
    struct Found {
        layer: Layer,
        paths: Vec<CString>,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `Found`.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Found)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: a module name is a NUL-terminated string.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) };
            if found.layer.owns(name.to_bytes()) {
                found.paths.push(name.to_owned());
            }
        }
        0
    }
    let mut found = Found {
        layer,
        paths: Vec::new(),
    };
    // SAFETY: the callback only reads the entries and writes `found`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut Found as *mut c_void) };
    found.paths
}

/// A helper function of the driver or runtime, looked up on first use. Absent for good only
/// once its library is loaded without it (an older driver); retried while no library is there.
pub struct Helper {
    name: &'static CStr,
    layer: Layer,
    addr: AtomicUsize,
}

const ABSENT: usize = 1;

impl Helper {
    pub const fn new(name: &'static CStr, layer: Layer) -> Helper {
        Helper {
            name,
            layer,
            addr: AtomicUsize::new(0),
        }
    }

    pub fn get(&self) -> Option<usize> {
        match self.addr.load(Ordering::Acquire) {
            ABSENT => None,
            0 => {
                let (addr, library_loaded) = lookup(self.name, self.layer);
                if addr != 0 {
                    self.addr.store(addr, Ordering::Release);
                    Some(addr)
                } else {
                    if library_loaded {
                        self.addr.store(ABSENT, Ordering::Release);
                    }
                    None
                }
            }
            addr => Some(addr),
        }
    }
}

/// `CUresult cuCtxGetDevice(CUdevice*)` / `cudaError_t cudaGetDevice(int*)`.
type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;

static CU_CTX_GET_DEVICE: Helper = Helper::new(c"cuCtxGetDevice", Layer::Driver);
static CUDA_GET_DEVICE: Helper = Helper::new(c"cudaGetDevice", Layer::Runtime);

/// The calling thread's current device, as the layer sees it.
pub fn current_device(layer: Layer) -> Option<u32> {
    let helper = match layer {
        Layer::Driver => &CU_CTX_GET_DEVICE,
        Layer::Runtime => &CUDA_GET_DEVICE,
    };
    let addr = helper.get()?;
    // SAFETY: the library's function of that name has this signature.
    let get: GetDeviceFn = unsafe { std::mem::transmute::<usize, GetDeviceFn>(addr) };
    let mut device: c_int = -1;
    // SAFETY: writes one int.
    let rc = unsafe { get(&mut device) };
    (rc == 0 && device >= 0).then_some(device as u32)
}
