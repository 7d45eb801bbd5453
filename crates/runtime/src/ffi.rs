//! The C ABI the Python extension (and any other producer) calls. Layouts and codes are in
//! `msmemscope_core::events::abi`; every function here is safe to call from any thread, never
//! panics across the boundary and reports failure by return code.

use std::panic::{catch_unwind, AssertUnwindSafe};

use msmemscope_core::config::RunConfig;
use msmemscope_core::events::abi::{
    BlockAttrs, BlockRecord, EventRecord, StrRef, ABI_VERSION, ATTRS_CHECKED, DEVICE_CPU,
    DEVICE_CUDA, WANT_C_STACK,
};
use msmemscope_core::events::{DeviceId, Event, EventType};

use crate::guard::Entered;
use crate::{pipeline, session};

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

/// Records one event row.
///
/// # Safety
/// `record` is null or points at a valid record whose strings live for the call.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_emit(record: *const EventRecord) -> i32 {
    if record.is_null() {
        return INVALID;
    }
    // SAFETY: the caller passes a valid record whose strings live for the call.
    let r = unsafe { &*record };
    emitting(r.event, r.event_type, |event, event_type| {
        let device = device_of(r.device_kind, r.device_index);
        // The name and the stack are copied as bytes: the writer, not the program's thread,
        // reads them as UTF-8 (an invalid sequence becomes U+FFFD there).
        // SAFETY: as above.
        let (name, python_stack) = unsafe { (r.name.as_bytes(), r.python_stack.as_bytes()) };
        let vouched = r.want_c_stack & ATTRS_CHECKED != 0;
        let attrs_json = if vouched {
            // One well-formed object, as the producer promised (our PyTorch capture).
            // SAFETY: as above.
            Some(unsafe { r.attrs_json.as_bytes() }).filter(|a| !a.is_empty())
        } else {
            // SAFETY: as above.
            let attrs = unsafe { r.attrs_json.as_str() }.trim();
            // The same check the dump's readers make, so every row written can be read back.
            if !attrs.is_empty() && msmemscope_core::events::reader::check_attrs(attrs).is_err() {
                return INVALID;
            }
            Some(attrs.as_bytes()).filter(|a| !a.is_empty())
        };
        if attrs_json.is_some_and(|a| a.first() != Some(&b'{')) {
            return INVALID;
        }
        let texts = pipeline::Texts {
            name,
            attrs: attrs_json.map_or(pipeline::Attrs::None, pipeline::Attrs::Json),
            python_stack,
        };
        let ptr = (r.has_ptr != 0).then_some(r.ptr);
        let want_c_stack = r.want_c_stack & WANT_C_STACK != 0;
        pipeline::emit_borrowed(event, event_type, device, ptr, &texts, want_c_stack);
        OK
    })
}

/// Inside the runtime, while tracing (else FILTERED), `f` with a record's event and type codes
/// read (INVALID when either is unknown).
fn emitting(event: u32, event_type: u32, f: impl FnOnce(Event, EventType) -> i32) -> i32 {
    guarded(|| {
        if !pipeline::is_tracing() {
            return FILTERED;
        }
        match (Event::from_u32(event), EventType::from_u32(event_type)) {
            (Some(event), Some(event_type)) => f(event, event_type),
            _ => INVALID,
        }
    })
}

fn device_of(kind: u32, index: u32) -> DeviceId {
    match kind {
        DEVICE_CPU => DeviceId::Cpu,
        DEVICE_CUDA => DeviceId::Cuda(index),
        _ => DeviceId::None,
    }
}

/// Records one block row (MALLOC or FREE): its Attr column is rendered from the record's
/// numbers and interned texts on the writer's thread.
///
/// # Safety
/// `record` is null or points at a valid record: its `python_stack` lives for the call, and
/// its other texts until the process exits.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_emit_block(record: *const BlockRecord) -> i32 {
    if record.is_null() {
        return INVALID;
    }
    // SAFETY: the caller passes a valid record.
    let r = unsafe { &*record };
    emitting(r.event, r.event_type, |event, event_type| {
        if !matches!(event, Event::Malloc | Event::Free) {
            return INVALID;
        }
        let texts = pipeline::Texts {
            name: b"N/A",
            attrs: pipeline::Attrs::Block(BlockAttrs::of(r)),
            // SAFETY: as above.
            python_stack: unsafe { r.python_stack.as_bytes() },
        };
        let device = device_of(r.device_kind, r.device_index);
        let want_c_stack = r.flags & WANT_C_STACK != 0;
        pipeline::emit_borrowed(event, event_type, device, Some(r.ptr), &texts, want_c_stack);
        OK
    })
}

/// Records an operator's ATEN_START or ATEN_END row (OP_LAUNCH, no device, no Ptr): the hot
/// producer's op rows, without a record to read and with no copy of the name.
///
/// # Safety
/// `name` points at `len` bytes that stay valid and unchanged until the process exits (or is
/// null with `len` 0).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_emit_op(
    event_type: u32,
    name: *const std::ffi::c_char,
    len: usize,
) -> i32 {
    let event_type = match EventType::from_u32(event_type) {
        Some(t @ (EventType::AtenStart | EventType::AtenEnd)) => t,
        _ => return INVALID,
    };
    if name.is_null() && len != 0 {
        return INVALID;
    }
    // SAFETY: as above (a null name is the empty one); the bytes outlive every row.
    let name: &'static [u8] = unsafe { StrRef { ptr: name, len }.as_bytes() };
    guarded(|| {
        if !pipeline::is_tracing() {
            return FILTERED;
        }
        pipeline::emit_op(event_type, name);
        OK
    })
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_tracing() -> i32 {
    pipeline::is_tracing() as i32
}

/// Replaces the configuration with a full `RunConfig` (JSON). Refused while a host-leak window
/// is open: its settings are fixed until it closes.
///
/// # Safety
/// `config_json` points at valid UTF-8 that lives for the call.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_configure(config_json: StrRef) -> i32 {
    // SAFETY: the caller's string lives for the call.
    let text = unsafe { config_json.as_str() };
    guarded(|| {
        // API mode: the first start()/config() opens the control channel, which the exit
        // handler closes.
        if !crate::process::is_forked_child() {
            crate::lifecycle::ensure_exit_handler();
        }
        crate::control::start();
        let Ok(config) = RunConfig::from_json(text) else {
            return INVALID;
        };
        match session::configure(config) {
            Ok(()) => OK,
            Err(session::ConfigureError::WindowOpen) => WINDOW_OPEN,
        }
    })
}

/// Writes the active configuration as JSON into `buf` (up to `cap` bytes); returns its length.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_current_config(buf: *mut u8, cap: usize) -> i64 {
    let _entered = Entered::try_enter();
    let Ok(json) = catch_unwind(|| session::config().to_json()) else {
        return FAILED as i64;
    };
    if !buf.is_null() && cap >= json.len() {
        // SAFETY: the caller's buffer holds `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(json.as_ptr(), buf, json.len()) };
    }
    json.len() as i64
}

/// Starts recording: a host-leak window when the configuration asks for host-leaks (in a
/// launched run, with the launcher's settings), else the event trace.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_start() -> i32 {
    guarded(|| {
        if !crate::process::is_forked_child() {
            // The run's end (its report, the dump's last rows) happens at exit, and the
            // control channel is closed then.
            crate::lifecycle::ensure_exit_handler();
        }
        crate::control::start();
        match session::start() {
            Ok(_) => OK,
            Err(session::StartError::WindowOpen(_)) => WINDOW_OPEN,
            Err(session::StartError::NoHostHooks) => NO_HOST_HOOKS,
            Err(session::StartError::NoRunDir(_) | session::StartError::ForkedChild) => FAILED,
        }
    })
}

/// Stops recording: closes the open window into the run directory (its report is written
/// now), or stops the event trace.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_stop() -> i32 {
    guarded(|| match session::stop() {
        Ok(session::Stopped::Window(_, None)) | Err(_) => FAILED,
        Ok(_) => OK,
    })
}

/// Writes the run directory's path into `buf` (up to `cap` bytes) and returns its length,
/// creating the directory if this run has none yet; `FAILED` when it cannot be created. For
/// producers that write files of their own there (the Python watch dumps).
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_run_dir(buf: *mut u8, cap: usize) -> i64 {
    let _entered = Entered::try_enter();
    let Ok(Ok(dir)) = catch_unwind(session::run_dir) else {
        return FAILED as i64;
    };
    let path = dir.as_os_str().as_encoded_bytes();
    if !buf.is_null() && cap >= path.len() {
        // SAFETY: the caller's buffer holds `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(path.as_ptr(), buf, path.len()) };
    }
    path.len() as i64
}

/// A new descriptor (close-on-exec, the caller's to close) of the run directory this run holds
/// open, creating the directory if this run has none yet; `FAILED` when there is none. Producers
/// that write files of their own there (the Python watch dumps) create them relative to it, so
/// a run directory renamed and replaced by a symlink is not followed.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_run_dir_fd() -> i32 {
    use std::os::fd::AsRawFd;
    let _entered = Entered::try_enter();
    let Ok(Ok(dir)) = catch_unwind(session::run_dir_handle) else {
        return FAILED;
    };
    let Ok(fd) = dir.fd() else {
        return FAILED;
    };
    // SAFETY: F_DUPFD_CLOEXEC on the held, checked descriptor; the copy belongs to the caller
    // (who keeps it checked by identity too: python's RunDir::from_fd moves it high).
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return FAILED;
    }
    copy
}

/// An optimizer's `step()` ended (the PyTorch tracker calls this): 1 when it was taken as the
/// end of a step (the program marks no steps itself), 0 when not.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_optimizer_step() -> i32 {
    catch_unwind(session::optimizer_step).map_or(0, i32::from)
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_step() -> i32 {
    guarded(|| {
        session::step();
        OK
    })
}

/// Turns the stream-race checker on and sets (or, with None, clears) the callback that also
/// receives every well-formed mark. Returns 0.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_sanitizer_enable(forward: Option<crate::sanitizer::Forward>) -> i32 {
    guarded(|| {
        crate::sanitizer::enable(forward);
        // The report is written at exit.
        crate::lifecycle::ensure_exit_handler();
        OK
    })
}

/// The sanitizer's report so far, as at exit (without stacks), into `buf` (`cap` bytes).
/// Returns the report's length (call again with a larger buffer when it exceeds `cap`); -1 for
/// a NULL buffer with a nonzero `cap`.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_sanitizer_report(buf: *mut u8, cap: usize) -> i64 {
    if buf.is_null() && cap != 0 {
        return -1;
    }
    let text = crate::sanitizer::report_so_far();
    let n = text.len().min(cap);
    if n > 0 {
        // SAFETY: the caller's buffer holds `cap` >= `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    }
    text.len() as i64
}

/// The live blocks of the sites the leaks analysis judges leaking now, after every row queued so
/// far was written, as text: one line per block, `ptr device size site` separated by tabs (Ptr
/// in hex, `0x…`; device as the dump writes it). Returns the text's length (call again with a
/// larger buffer when it exceeds `cap`); -1 for a NULL buffer with a nonzero `cap`.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_leak_suspects(buf: *mut u8, cap: usize) -> i64 {
    if buf.is_null() && cap != 0 {
        return -1;
    }
    let text = catch_unwind(|| {
        let mut text = String::new();
        for (device, ptr, size, site) in
            crate::pipeline::leak_suspects(std::time::Duration::from_secs(5))
        {
            let site = site.replace(['\t', '\n'], " ");
            text.push_str(&format!("0x{ptr:x}\t{device}\t{size}\t{site}\n"));
        }
        text
    })
    .unwrap_or_default();
    let n = text.len().min(cap);
    if n > 0 {
        // SAFETY: the caller's buffer holds `cap` >= `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    }
    text.len() as i64
}

/// What the online analyses found so far, as JSON (`msmemscope.findings()`): the sites the
/// leaks analysis judges leaking now, with their growth per step, and each device's highest
/// bytes in use; every row queued so far is written first (waits 2 s at most). When nothing
/// is traced, or the writer does not answer in time, `{"available": false, ...}`. Returns the
/// text's length (call again with a larger buffer when it exceeds `cap`); -1 for a NULL buffer
/// with a nonzero `cap`.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_findings(buf: *mut u8, cap: usize) -> i64 {
    if buf.is_null() && cap != 0 {
        return -1;
    }
    let _entered = Entered::try_enter();
    let text = catch_unwind(|| pipeline::findings(std::time::Duration::from_secs(2)))
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            format!(
                "{{\"schema\":\"{}\",\"available\":false,\"tracing\":{}}}",
                pipeline::FINDINGS_SCHEMA,
                pipeline::is_tracing()
            )
        });
    let n = text.len().min(cap);
    if n > 0 {
        // SAFETY: the caller's buffer holds `cap` >= `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    }
    text.len() as i64
}

/// Asks a bounded dump (`--dump-budget`) to keep the rows of `n` steps at `steps` in full, as
/// it keeps the peak's step (`msmemscope.keep_steps`): 0 taken, 1 nothing traced yet (no
/// writer), -1 a NULL `steps` with a nonzero `n`.
///
/// # Safety
/// `steps` is null or holds `n` readable `u64`s.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn msmemscope_keep_steps(steps: *const u64, n: usize) -> i32 {
    if steps.is_null() && n != 0 {
        return -1;
    }
    let _entered = Entered::try_enter();
    let wanted: &[u64] = if n == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(steps, n) }
    };
    catch_unwind(|| pipeline::keep_steps(wanted)).map_or(1, |taken| if taken { 0 } else { 1 })
}

/// 1 when this library's `malloc` is the process's `malloc` (it was preloaded). Compares the
/// objects the two functions live in: taking our own `malloc`'s address would go through the
/// GOT and find whatever `malloc` the process uses, ours or not.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_host_hooks_active() -> i32 {
    catch_unwind(crate::forward::is_process_malloc).map_or(0, i32::from)
}

/// For producers that only need a string view (tests).
pub fn str_ref(s: &str) -> StrRef {
    StrRef::new(s)
}

/// Wraps CPython's own allocators so that host-leak windows account Python objects (see
/// `hooks::pymem`). Call from Python, holding the GIL (ctypes' `PyDLL`, or the extension
/// module): the start-up module of a launched run calls it, and so does `msmemscope.start()`.
/// Returns 1 once the wrappers are in; -1 when this run does not look for host leaks (nothing
/// done); -2 when `--python-objects=off`; -3 when the interpreter cannot be wrapped (no CPython
/// whose frames this runtime reads, or no allocator API).
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_track_python_objects() -> i32 {
    catch_unwind(|| {
        let config = crate::session::config();
        let open = crate::host_leak::window::active();
        if open.is_none() && !config.host_leaks() {
            return -1;
        }
        let wanted = open.map_or(config.tracks_python_objects(), |l| {
            l.settings.python_objects_on()
        });
        if !wanted {
            return -2;
        }
        // SAFETY: our contract: the caller holds the GIL.
        match unsafe { crate::hooks::pymem::install() } {
            Ok(()) => 1,
            Err(_) => -3,
        }
    })
    .unwrap_or(-3)
}
