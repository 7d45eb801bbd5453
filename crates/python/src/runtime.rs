//! Finding the runtime library's C ABI in this process.
//!
//! The extension never links the runtime library: a program started under `msmemscope` (or after
//! `source msmemscope --load-api-env`) already has it preloaded, and the extension finds it with
//! `dlsym(RTLD_DEFAULT, "msmemscope_abi_version")`. Otherwise the Python side passes candidate
//! paths to [`load`], which `dlopen`s one. Either way the functions are resolved once, checked
//! against core's [`ABI_VERSION`], and kept for the life of the process (the library is never
//! closed).

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

use msmemscope_core::events::abi::{BlockRecord, EventRecord, StrRef, ABI_VERSION};

type AbiVersionFn = unsafe extern "C" fn() -> u32;
type EmitFn = unsafe extern "C" fn(*const EventRecord) -> i32;
type EmitBlockFn = unsafe extern "C" fn(*const BlockRecord) -> i32;
type EmitOpFn = unsafe extern "C" fn(u32, *const u8, usize) -> i32;
type StatusFn = unsafe extern "C" fn() -> i32;
type ConfigureFn = unsafe extern "C" fn(StrRef) -> i32;
type CurrentConfigFn = unsafe extern "C" fn(*mut u8, usize) -> i64;
type RunDirFdFn = unsafe extern "C" fn() -> i32;
type MstxMarkFn = unsafe extern "C" fn(*const c_char, *mut c_void);
type MstxRangeStartFn = unsafe extern "C" fn(*const c_char, *mut c_void) -> u64;
type MstxRangeEndFn = unsafe extern "C" fn(u64);

/// The runtime library's functions, resolved once.
pub struct Runtime {
    /// Where the library was found (from `dladdr`), when known.
    pub path: Option<String>,
    /// Whether it was already in the process (preloaded) rather than loaded by us.
    pub preloaded: bool,
    pub emit: EmitFn,
    pub emit_block: EmitBlockFn,
    pub emit_op: EmitOpFn,
    pub tracing: StatusFn,
    pub configure: ConfigureFn,
    pub current_config: CurrentConfigFn,
    pub start: StatusFn,
    pub stop: StatusFn,
    pub step: StatusFn,
    pub host_hooks_active: StatusFn,
    /// `msmemscope_track_python_objects`; optional so an older runtime still serves the rest.
    pub track_python_objects: Option<StatusFn>,
    /// The MSTX C API; optional so an older runtime still serves everything else.
    pub mstx_mark: Option<MstxMarkFn>,
    pub mstx_range_start: Option<MstxRangeStartFn>,
    pub mstx_range_end: Option<MstxRangeEndFn>,
    /// `msmemscope_run_dir` (same shape as `current_config`); optional for older runtimes.
    pub run_dir: Option<CurrentConfigFn>,
    /// `msmemscope_run_dir_fd`: a descriptor of the held run directory; optional likewise.
    pub run_dir_fd: Option<RunDirFdFn>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
/// Serializes the slow path (probe, dlopen, resolve) so two threads never resolve twice.
static LOADING: Mutex<()> = Mutex::new(());

/// The runtime, looking for an already present (preloaded) one first if none was found yet.
/// `Ok(None)`: no runtime library in the process.
pub fn find() -> Result<Option<&'static Runtime>, String> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(Some(rt));
    }
    let _guard = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = RUNTIME.get() {
        return Ok(Some(rt));
    }
    // SAFETY: RTLD_DEFAULT with a NUL-terminated name is always a valid dlsym call.
    let probe = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"msmemscope_abi_version".as_ptr()) };
    if probe.is_null() {
        return Ok(None);
    }
    let path = library_of(probe);
    // A handle of the library that defines the probe, so every other symbol comes from that
    // same library (not from whichever object happens to be first in the global scope).
    let handle = match &path {
        Some(p) => {
            let c = CString::new(p.as_str()).map_err(|e| e.to_string())?;
            // SAFETY: RTLD_NOLOAD only returns a handle of a library already loaded.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
            if h.is_null() {
                libc::RTLD_DEFAULT
            } else {
                h
            }
        }
        None => libc::RTLD_DEFAULT,
    };
    let rt = resolve(handle, path, true)?;
    Ok(Some(RUNTIME.get_or_init(|| rt)))
}

/// `dlopen`s the runtime library at `path` (RTLD_NOW | RTLD_GLOBAL, so the MSTX and NVTX symbols
/// it exports are visible to the rest of the process) unless one is present already.
pub fn load(path: &str) -> Result<&'static Runtime, String> {
    if let Some(rt) = find()? {
        return Ok(rt);
    }
    let _guard = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let c = CString::new(path).map_err(|_| format!("{path:?}: the path contains a NUL byte"))?;
    // SAFETY: a NUL-terminated path; the library is kept loaded for the life of the process.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(format!("cannot load {path}: {}", dlerror_text()));
    }
    match resolve(handle, Some(path.to_owned()), false) {
        Ok(rt) => Ok(RUNTIME.get_or_init(|| rt)),
        Err(e) => {
            // Unload it again, so a later probe of the process does not find the rejected one.
            // SAFETY: our own handle; nothing of the library has been called but its version.
            unsafe { libc::dlclose(handle) };
            Err(e)
        }
    }
}

/// Resolves every function from `handle` and checks the ABI version.
fn resolve(handle: *mut c_void, path: Option<String>, preloaded: bool) -> Result<Runtime, String> {
    let where_ = path.as_deref().unwrap_or("the runtime library");
    let sym = |name: &CStr| -> *mut c_void {
        // SAFETY: `handle` is a dlopen handle or RTLD_DEFAULT; `name` is NUL-terminated.
        unsafe { libc::dlsym(handle, name.as_ptr()) }
    };
    let mut missing = Vec::new();
    let mut need = |name: &'static CStr| -> *mut c_void {
        let p = sym(name);
        if p.is_null() {
            missing.push(name.to_str().unwrap_or("?"));
        }
        p
    };
    let version = need(c"msmemscope_abi_version");
    let emit = need(c"msmemscope_emit");
    let tracing = need(c"msmemscope_tracing");
    let configure = need(c"msmemscope_configure");
    let current_config = need(c"msmemscope_current_config");
    let start = need(c"msmemscope_start");
    let stop = need(c"msmemscope_stop");
    let step = need(c"msmemscope_step");
    let host_hooks_active = need(c"msmemscope_host_hooks_active");
    let emit_block = need(c"msmemscope_emit_block");
    let emit_op = need(c"msmemscope_emit_op");
    if !missing.is_empty() {
        return Err(format!(
            "{where_} does not export {}: it was built from other sources than this package \
             (run scripts/setup.sh again)",
            missing.join(", ")
        ));
    }
    // SAFETY: each pointer was resolved by dlsym for the name whose C signature the type
    // alias spells (the ABI of crates/core/src/events/abi.rs), and is non-null.
    unsafe {
        let version_fn: AbiVersionFn = std::mem::transmute::<*mut c_void, AbiVersionFn>(version);
        let found = version_fn();
        if found != ABI_VERSION {
            return Err(format!(
                "{where_} speaks ABI version {found}, this msmemscope package speaks {ABI_VERSION}: \
                 use the runtime library built with this package"
            ));
        }
        let opt = |p: *mut c_void| if p.is_null() { None } else { Some(p) };
        Ok(Runtime {
            path,
            preloaded,
            emit: std::mem::transmute::<*mut c_void, EmitFn>(emit),
            emit_block: std::mem::transmute::<*mut c_void, EmitBlockFn>(emit_block),
            emit_op: std::mem::transmute::<*mut c_void, EmitOpFn>(emit_op),
            tracing: std::mem::transmute::<*mut c_void, StatusFn>(tracing),
            configure: std::mem::transmute::<*mut c_void, ConfigureFn>(configure),
            current_config: std::mem::transmute::<*mut c_void, CurrentConfigFn>(current_config),
            start: std::mem::transmute::<*mut c_void, StatusFn>(start),
            stop: std::mem::transmute::<*mut c_void, StatusFn>(stop),
            step: std::mem::transmute::<*mut c_void, StatusFn>(step),
            host_hooks_active: std::mem::transmute::<*mut c_void, StatusFn>(host_hooks_active),
            track_python_objects: opt(sym(c"msmemscope_track_python_objects"))
                .map(|p| std::mem::transmute::<*mut c_void, StatusFn>(p)),
            mstx_mark: opt(sym(c"mstxMarkA"))
                .map(|p| std::mem::transmute::<*mut c_void, MstxMarkFn>(p)),
            mstx_range_start: opt(sym(c"mstxRangeStartA"))
                .map(|p| std::mem::transmute::<*mut c_void, MstxRangeStartFn>(p)),
            mstx_range_end: opt(sym(c"mstxRangeEnd"))
                .map(|p| std::mem::transmute::<*mut c_void, MstxRangeEndFn>(p)),
            run_dir: opt(sym(c"msmemscope_run_dir"))
                .map(|p| std::mem::transmute::<*mut c_void, CurrentConfigFn>(p)),
            run_dir_fd: opt(sym(c"msmemscope_run_dir_fd"))
                .map(|p| std::mem::transmute::<*mut c_void, RunDirFdFn>(p)),
        })
    }
}

/// The path of the object that contains `addr`, from `dladdr`.
fn library_of(addr: *mut c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data; dladdr fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is a symbol address; `info` is a valid out-pointer.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr's dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".to_owned()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Runtime {
    /// The active RunConfig JSON, growing the buffer until it fits.
    pub fn current_config_json(&self) -> Result<String, String> {
        let mut cap = 4096usize;
        loop {
            let mut buf = vec![0u8; cap];
            // SAFETY: `buf` has `cap` writable bytes.
            let n = unsafe { (self.current_config)(buf.as_mut_ptr(), cap) };
            if n < 0 {
                return Err(format!("msmemscope_current_config failed with code {n}"));
            }
            let n = n as usize;
            if n <= cap {
                buf.truncate(n);
                return String::from_utf8(buf)
                    .map_err(|_| "the runtime returned a config that is not UTF-8".to_owned());
            }
            cap = n;
        }
    }
}
