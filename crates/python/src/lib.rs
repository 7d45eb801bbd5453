//! `msmemscope._native`: the Python package's bridge to the rest of msmemscope.
//!
//! Configuration is validated with core's own parsers ([`config`]), so `msmemscope.config(...)`
//! accepts exactly what the command line does. Everything that touches the running process goes
//! through the runtime library's C ABI (`crates/core/src/events/abi.rs`), found in the process
//! or `dlopen`ed ([`runtime`]); the extension never links the runtime itself, so there is one
//! instance of its state per process whichever way it got there.

mod analyzers;
mod config;
mod emit;
mod runtime;
mod sanitizer;
// Memory block watch: checksums and dumps of watched blocks, the run directory.
mod watch;

use std::ffi::{c_void, CStr, CString};
use std::sync::Mutex;

use msmemscope_core::config::RunConfig;
use msmemscope_core::events::abi::{StrRef, ABI_VERSION};
use msmemscope_core::events::{Event, EventType};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// What `start()` answers when host-leaks is configured but the malloc hooks are not the
/// process's malloc.
const HOST_HOOKS_MISSING: &str = "host-leaks needs the host hooks: run `source msmemscope \
     --load-api-env=host` before starting Python, or launch under msmemscope";

/// The runtime, or a RuntimeError saying how to get one.
pub(crate) fn require_runtime() -> PyResult<&'static runtime::Runtime> {
    match runtime::find() {
        Ok(Some(rt)) => Ok(rt),
        Ok(None) => Err(PyRuntimeError::new_err(
            "the msmemscope runtime library is not loaded: call load_runtime(path) first",
        )),
        Err(e) => Err(PyRuntimeError::new_err(e)),
    }
}

/// A runtime function by name, or RuntimeError naming it. Looked up once per name: `dlsym`
/// walks every loaded object's symbol table, and some of these run at every optimizer step.
pub(crate) fn runtime_symbol(name: &'static CStr) -> PyResult<*mut c_void> {
    static FOUND: Mutex<Vec<(&'static CStr, usize)>> = Mutex::new(Vec::new());
    require_runtime()?;
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, address)) = found.iter().find(|(known, _)| *known == name) {
        return Ok(address as *mut c_void);
    }
    // SAFETY: RTLD_DEFAULT with a NUL-terminated name; the runtime is loaded globally
    // (preloaded, or dlopen'ed with RTLD_GLOBAL).
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return Err(PyRuntimeError::new_err(format!(
            "the loaded msmemscope runtime library does not export {}",
            name.to_string_lossy()
        )));
    }
    // A loaded runtime stays loaded (it is preloaded, or dlopen'ed and never closed).
    found.push((name, p as usize));
    Ok(p)
}

/// The text a runtime function of the `(buf, cap) -> length` shape writes, grown until it fits.
pub(crate) fn runtime_text(name: &'static CStr, what: &str) -> PyResult<String> {
    let f = runtime_symbol(name)?;
    type ReportFn = unsafe extern "C" fn(*mut u8, usize) -> i64;
    // SAFETY: a runtime function whose signature ReportFn spells (the caller names one).
    let f = unsafe { std::mem::transmute::<*mut c_void, ReportFn>(f) };
    let mut cap = 4096usize;
    loop {
        let mut buf = vec![0u8; cap];
        // SAFETY: `buf` has `cap` writable bytes.
        let n = unsafe { f(buf.as_mut_ptr(), cap) };
        if n < 0 {
            return Err(PyRuntimeError::new_err(format!(
                "{} failed with code {n}",
                name.to_string_lossy()
            )));
        }
        let n = n as usize;
        if n <= cap {
            buf.truncate(n);
            return String::from_utf8(buf)
                .map_err(|_| PyRuntimeError::new_err(format!("{what} is not UTF-8")));
        }
        cap = n;
    }
}

/// The ABI version this extension was built for (core's `ABI_VERSION`).
#[pyfunction]
fn abi_version() -> u32 {
    ABI_VERSION
}

/// Whether the runtime library's C ABI is available: already loaded by `load_runtime`, or
/// present in the process (preloaded by the launcher or `--load-api-env`).
#[pyfunction]
fn runtime_loaded() -> PyResult<bool> {
    runtime::find()
        .map(|rt| rt.is_some())
        .map_err(PyRuntimeError::new_err)
}

/// The path of the runtime library in use, or None when none is loaded (or its path is unknown).
#[pyfunction]
fn runtime_path() -> PyResult<Option<String>> {
    Ok(runtime::find()
        .map_err(PyRuntimeError::new_err)?
        .and_then(|rt| rt.path.clone()))
}

/// Whether the runtime library was in the process before this extension looked (preloaded),
/// rather than loaded by `load_runtime`. None when no runtime is loaded.
#[pyfunction]
fn runtime_preloaded() -> PyResult<Option<bool>> {
    Ok(runtime::find()
        .map_err(PyRuntimeError::new_err)?
        .map(|rt| rt.preloaded))
}

/// Loads the runtime library at `path` unless one is present already; returns the path of the
/// one in use. RuntimeError when it cannot be loaded or speaks another ABI version.
#[pyfunction]
fn load_runtime(path: &str) -> PyResult<String> {
    let rt = runtime::load(path).map_err(PyRuntimeError::new_err)?;
    Ok(rt.path.clone().unwrap_or_else(|| path.to_owned()))
}

/// The default RunConfig as JSON: the configuration of a run given no options.
#[pyfunction]
fn default_config() -> String {
    RunConfig::default().to_json()
}

/// Hands a full RunConfig JSON to the runtime. True: applied. False: refused because a
/// host-leak window is open (nothing changed).
#[pyfunction]
fn configure(py: Python<'_>, json: &str) -> PyResult<bool> {
    let rt = require_runtime()?;
    let json = json.to_owned();
    // SAFETY: the string lives until the call returns; the runtime copies what it keeps.
    let rc = py.allow_threads(|| unsafe { (rt.configure)(StrRef::new(&json)) });
    match rc {
        0 => Ok(true),
        -2 => Ok(false),
        -1 => Err(PyValueError::new_err(
            "the runtime library rejected the configuration as invalid",
        )),
        rc => Err(PyRuntimeError::new_err(format!(
            "msmemscope_configure failed with code {rc}"
        ))),
    }
}

/// The runtime's active RunConfig as JSON.
#[pyfunction]
fn current_config() -> PyResult<String> {
    require_runtime()?
        .current_config_json()
        .map_err(PyRuntimeError::new_err)
}

/// Starts tracing, or opens a host-leak window when host-leaks is configured.
#[pyfunction]
fn start(py: Python<'_>) -> PyResult<()> {
    let rt = require_runtime()?;
    // SAFETY: a resolved ABI function without arguments.
    let rc = py.allow_threads(|| unsafe { (rt.start)() });
    match rc {
        rc if rc >= 0 => Ok(()),
        -2 => Err(PyValueError::new_err(
            "a host-leak window is already open: call msmemscope.stop() before starting another",
        )),
        -3 => Err(PyValueError::new_err(HOST_HOOKS_MISSING)),
        rc => Err(PyRuntimeError::new_err(format!(
            "msmemscope start failed with code {rc}"
        ))),
    }
}

/// Stops tracing, or closes the open host-leak window (its report is written now).
#[pyfunction]
fn stop(py: Python<'_>) -> PyResult<()> {
    let rt = require_runtime()?;
    // SAFETY: a resolved ABI function without arguments.
    let rc = py.allow_threads(|| unsafe { (rt.stop)() });
    status("stop", rc)
}

/// Marks the end of a step.
#[pyfunction]
fn step() -> PyResult<()> {
    let rt = require_runtime()?;
    // SAFETY: a resolved ABI function without arguments.
    status("step", unsafe { (rt.step)() })
}

fn status(what: &str, rc: i32) -> PyResult<()> {
    if rc >= 0 {
        Ok(())
    } else {
        Err(PyRuntimeError::new_err(format!(
            "msmemscope {what} failed with code {rc}"
        )))
    }
}

/// Whether events are being recorded now.
#[pyfunction]
fn tracing() -> PyResult<bool> {
    let rt = require_runtime()?;
    // SAFETY: a resolved ABI function without arguments.
    Ok(unsafe { (rt.tracing)() } == 1)
}

/// The addresses of the runtime's `msmemscope_emit`, `msmemscope_tracing`,
/// `msmemscope_emit_block` and `msmemscope_emit_op`, for an in-process producer that calls the
/// C ABI without Python (the native PyTorch capture).
#[pyfunction]
fn abi_entry_points() -> PyResult<(usize, usize, usize, usize)> {
    let rt = require_runtime()?;
    Ok((
        rt.emit as usize,
        rt.tracing as usize,
        rt.emit_block as usize,
        rt.emit_op as usize,
    ))
}

/// Whether the runtime's malloc hooks are the process's malloc (the library was preloaded).
#[pyfunction]
fn host_hooks_active() -> PyResult<bool> {
    let rt = require_runtime()?;
    // SAFETY: a resolved ABI function without arguments.
    Ok(unsafe { (rt.host_hooks_active)() } == 1)
}

/// Wraps CPython's allocators so that the open host-leak window accounts Python objects (the
/// runtime's `msmemscope_track_python_objects`, called holding the GIL as it requires): 1 once
/// in, -1 not a host-leak run, -2 turned off, -3 this interpreter (or runtime) cannot.
#[pyfunction]
fn track_python_objects() -> PyResult<i32> {
    let rt = require_runtime()?;
    // SAFETY: a resolved ABI function without arguments; a pyfunction runs holding the GIL.
    Ok(rt.track_python_objects.map_or(-3, |f| unsafe { f() }))
}

fn mstx_message(message: &str) -> PyResult<CString> {
    CString::new(message)
        .map_err(|_| PyValueError::new_err("message must not contain a NUL character"))
}

fn mstx_missing(name: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "the loaded msmemscope runtime library does not export {name}"
    ))
}

/// `mstxMarkA(message, stream)`.
#[pyfunction]
#[pyo3(signature = (message, stream = 0))]
fn mstx_mark(message: &str, stream: usize) -> PyResult<()> {
    let rt = require_runtime()?;
    let f = rt.mstx_mark.ok_or_else(|| mstx_missing("mstxMarkA"))?;
    let message = mstx_message(message)?;
    // SAFETY: a NUL-terminated message valid for the call; the stream is an opaque handle.
    unsafe { f(message.as_ptr(), stream as *mut c_void) };
    Ok(())
}

/// `mstxRangeStartA(message, stream)`: the new range's id.
#[pyfunction]
#[pyo3(signature = (message, stream = 0))]
fn mstx_range_start(message: &str, stream: usize) -> PyResult<u64> {
    let rt = require_runtime()?;
    let f = rt
        .mstx_range_start
        .ok_or_else(|| mstx_missing("mstxRangeStartA"))?;
    let message = mstx_message(message)?;
    // SAFETY: as in mstx_mark.
    Ok(unsafe { f(message.as_ptr(), stream as *mut c_void) })
}

/// `mstxRangeEnd(range_id)`.
#[pyfunction]
fn mstx_range_end(range_id: u64) -> PyResult<()> {
    let rt = require_runtime()?;
    let f = rt
        .mstx_range_end
        .ok_or_else(|| mstx_missing("mstxRangeEnd"))?;
    // SAFETY: a resolved ABI function taking a plain integer.
    unsafe { f(range_id) };
    Ok(())
}

/// `leak_suspects() -> str`: the live blocks of the sites the leaks analysis judges leaking
/// now, one `ptr\tdevice\tsize\tsite` line each (the runtime writes every queued row first).
#[pyfunction]
fn leak_suspects(py: Python<'_>) -> PyResult<String> {
    // The writer may take a moment: other Python threads run meanwhile.
    py.allow_threads(|| runtime_text(c"msmemscope_leak_suspects", "the leak suspects"))
}

/// `findings() -> str`: what the running analyses found so far, as JSON (the runtime's
/// `msmemscope_findings`: the sites judged leaking with their growth per step, each device's
/// peak; `{"available": false}` when nothing is traced).
#[pyfunction]
fn findings(py: Python<'_>) -> PyResult<String> {
    // The writer may take a moment: other Python threads run meanwhile.
    py.allow_threads(|| runtime_text(c"msmemscope_findings", "the findings"))
}

/// `keep_steps(steps) -> bool`: asks a bounded dump to keep these steps' rows in full; False
/// when nothing is traced yet.
#[pyfunction]
fn keep_steps(steps: Vec<u64>) -> PyResult<bool> {
    type KeepFn = unsafe extern "C" fn(*const u64, usize) -> i32;
    let f = runtime_symbol(c"msmemscope_keep_steps")?;
    // SAFETY: the runtime exports msmemscope_keep_steps with this signature.
    let f = unsafe { std::mem::transmute::<*mut c_void, KeepFn>(f) };
    // SAFETY: `steps` holds `len` u64s for the call.
    let rc = unsafe { f(steps.as_ptr(), steps.len()) };
    Ok(rc == 0)
}

/// `optimizer_step() -> bool`: an optimizer's `step()` ended; True when the runtime took it as
/// the end of a step (the program marks none itself).
#[pyfunction]
fn optimizer_step() -> PyResult<bool> {
    type StepFn = unsafe extern "C" fn() -> i32;
    let f = runtime_symbol(c"msmemscope_optimizer_step")?;
    // SAFETY: the runtime's `msmemscope_optimizer_step`, whose signature StepFn spells.
    let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, StepFn>(f) };
    // SAFETY: a resolved ABI function without arguments.
    Ok(unsafe { f() } == 1)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(abi_version, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_loaded, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_path, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_preloaded, m)?)?;
    m.add_function(wrap_pyfunction!(load_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(default_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::validate_config, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(current_config, m)?)?;
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(step, m)?)?;
    m.add_function(wrap_pyfunction!(tracing, m)?)?;
    m.add_function(wrap_pyfunction!(leak_suspects, m)?)?;
    m.add_function(wrap_pyfunction!(findings, m)?)?;
    m.add_function(wrap_pyfunction!(keep_steps, m)?)?;
    m.add_function(wrap_pyfunction!(optimizer_step, m)?)?;
    m.add_function(wrap_pyfunction!(host_hooks_active, m)?)?;
    m.add_function(wrap_pyfunction!(track_python_objects, m)?)?;
    m.add_function(wrap_pyfunction!(abi_entry_points, m)?)?;
    m.add_function(wrap_pyfunction!(emit::emit, m)?)?;
    m.add_function(wrap_pyfunction!(mstx_mark, m)?)?;
    m.add_function(wrap_pyfunction!(mstx_range_start, m)?)?;
    m.add_function(wrap_pyfunction!(mstx_range_end, m)?)?;
    analyzers::register(m)?;
    sanitizer::register(m)?;
    watch::register(m)?;
    m.add("ABI_VERSION", ABI_VERSION)?;
    m.add("HOST_HOOKS_MISSING", HOST_HOOKS_MISSING)?;
    m.add("CONFIG_KEYS", config::accepted_keys())?;
    for event in Event::ALL {
        m.add(format!("EVENT_{}", event.as_str()), event as u32)?;
    }
    for event_type in EventType::ALL {
        m.add(
            format!("TYPE_{}", event_type.as_str().to_ascii_uppercase()),
            event_type as u32,
        )?;
    }
    Ok(())
}
