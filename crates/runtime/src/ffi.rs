//! The C ABI the Python extension (and any other producer) calls. Layouts and codes are in
//! `msmemscope_core::events::abi`; every function here is safe to call from any thread, never
//! panics across the boundary and reports failure by return code.
#![allow(clippy::missing_safety_doc)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use msmemscope_core::config::RunConfig;
use msmemscope_core::events::abi::{EventRecord, StrRef, ABI_VERSION, DEVICE_CPU, DEVICE_CUDA};
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

use crate::guard::Entered;
use crate::host_leak::settings::{CapOverrides, WindowSettings};
use crate::host_leak::window;
use crate::pipeline;

/// Return codes.
pub const OK: i32 = 0;
pub const FILTERED: i32 = 1;
pub const INVALID: i32 = -1;
pub const WINDOW_OPEN: i32 = -2;
pub const NO_HOST_HOOKS: i32 = -3;
pub const FAILED: i32 = -4;

/// Runs `f` inside the runtime (reentrancy guard held) and turns a panic into `FAILED`.
fn guarded(f: impl FnOnce() -> i32) -> i32 {
    let _entered = Entered::try_enter();
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(FAILED)
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_abi_version() -> u32 {
    ABI_VERSION
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_emit(record: *const EventRecord) -> i32 {
    if record.is_null() {
        return INVALID;
    }
    // SAFETY: the caller passes a valid record whose strings live for the call.
    let r = unsafe { &*record };
    guarded(|| {
        if !pipeline::is_tracing() {
            return FILTERED;
        }
        let (Some(event), Some(event_type)) =
            (Event::from_u32(r.event), EventType::from_u32(r.event_type))
        else {
            return INVALID;
        };
        // SAFETY: as above.
        let (name, attrs, python_stack) = unsafe {
            (
                r.name.as_str(),
                r.attrs_json.as_str(),
                r.python_stack.as_str(),
            )
        };
        let mut row = EventRow::new(event, event_type, name);
        row.device = match r.device_kind {
            DEVICE_CPU => DeviceId::Cpu,
            DEVICE_CUDA => DeviceId::Cuda(r.device_index),
            _ => DeviceId::None,
        };
        row.ptr = (r.has_ptr != 0).then_some(r.ptr);
        if !attrs.is_empty() {
            // Checked (an object, well formed) without building it: the writer copies the text.
            let trimmed = attrs.trim();
            if !trimmed.starts_with('{')
                || serde_json::from_str::<serde::de::IgnoredAny>(trimmed).is_err()
            {
                return INVALID;
            }
            row.attrs_json = Some(trimmed.to_string());
        }
        row.python_stack = python_stack.to_string();
        pipeline::emit(row, r.want_c_stack != 0);
        OK
    })
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_tracing() -> i32 {
    pipeline::is_tracing() as i32
}

/// Replaces the configuration with a full `RunConfig` (JSON). Refused while a host-leak window
/// is open: its settings are fixed until it closes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_configure(config_json: StrRef) -> i32 {
    // SAFETY: the caller's string lives for the call.
    let text = unsafe { config_json.as_str() };
    guarded(|| {
        // API mode: the first start()/config() opens the control channel.
        crate::control::start();
        if window::active().is_some() {
            return WINDOW_OPEN;
        }
        match RunConfig::from_json(text) {
            Ok(config) => {
                pipeline::set_config(config);
                OK
            }
            Err(_) => INVALID,
        }
    })
}

/// Writes the active configuration as JSON into `buf` (up to `cap` bytes); returns its length.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_current_config(buf: *mut u8, cap: usize) -> i64 {
    let _entered = Entered::try_enter();
    let json = pipeline::config().to_json();
    if !buf.is_null() && cap >= json.len() {
        // SAFETY: the caller's buffer holds `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(json.as_ptr(), buf, json.len()) };
    }
    json.len() as i64
}

/// Starts recording: a host-leak window when the configuration asks for host-leaks, else the
/// event trace.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_start() -> i32 {
    guarded(|| {
        crate::lifecycle::register_exit_handler();
        crate::control::start();
        let config = pipeline::config();
        if config.host_leaks() {
            if msmemscope_host_hooks_active() == 0 {
                return NO_HOST_HOOKS;
            }
            if pipeline::run_dir().is_err() {
                return FAILED;
            }
            crate::lifecycle::mark_own_code();
            let settings = WindowSettings::new(&config, &CapOverrides::from_env());
            return match window::open(settings) {
                Some(_) => OK,
                None => WINDOW_OPEN,
            };
        }
        pipeline::start_tracing();
        OK
    })
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_stop() -> i32 {
    guarded(|| {
        if window::active().is_some() {
            return match pipeline::run_dir() {
                Ok(dir) => {
                    window::close(&dir);
                    OK
                }
                Err(_) => FAILED,
            };
        }
        pipeline::stop_tracing();
        OK
    })
}

/// Writes the run directory's path into `buf` (up to `cap` bytes) and returns its length,
/// creating the directory if this run has none yet; `FAILED` when it cannot be created. For
/// producers that write files of their own there (the Python watch dumps).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_run_dir(buf: *mut u8, cap: usize) -> i64 {
    let _entered = Entered::try_enter();
    let Ok(Ok(dir)) = catch_unwind(pipeline::run_dir) else {
        return FAILED as i64;
    };
    let path = dir.as_os_str().as_encoded_bytes();
    if !buf.is_null() && cap >= path.len() {
        // SAFETY: the caller's buffer holds `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(path.as_ptr(), buf, path.len()) };
    }
    path.len() as i64
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_step() -> i32 {
    guarded(|| {
        pipeline::step();
        OK
    })
}

/// 1 when this library's `malloc` is the process's `malloc` (it was preloaded). Compares the
/// objects the two functions live in: taking our own `malloc`'s address would go through the
/// GOT and find whatever `malloc` the process uses, ours or not.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_host_hooks_active() -> i32 {
    fn object_of(address: *const libc::c_void) -> Option<usize> {
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
        (unsafe { libc::dladdr(address, &mut info) } != 0).then_some(info.dli_fbase as usize)
    }
    // A private function: its address is ours whatever the process interposes.
    fn here() {}
    // SAFETY: dlsym of a libc symbol name.
    let resolved = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = object_of(here as *const libc::c_void);
    (ours.is_some() && object_of(resolved) == ours) as i32
}

/// For producers that only need a string view (tests).
pub fn str_ref(s: &str) -> StrRef {
    StrRef::new(s)
}
