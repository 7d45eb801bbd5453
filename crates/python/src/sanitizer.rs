//! The sanitizer from Python: core's `sanitizer-op:` parser and race checker (pure, usable
//! without the runtime), and the runtime's sanitizer entry points (enable with a forwarding
//! callback, synchronizations, the report so far).

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use msmemscope_core::sanitizer::message::{parse, Arg};
use msmemscope_core::sanitizer::race::{Access, AccessKind, Launch, Race, RaceChecker};
use msmemscope_core::sanitizer::report::RaceLog;
use msmemscope_core::sanitizer::SyncOp;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

type EnableFn = unsafe extern "C" fn(Option<ForwardFn>) -> i32;
type ForwardFn = unsafe extern "C" fn(*const c_char, u64);
type SyncFn = unsafe extern "C" fn(u32, u64, u64) -> i32;

/// The Python callable the runtime's well-formed marks are forwarded to.
static FORWARD_TO: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

fn mark_error(message: &str) -> PyResult<msmemscope_core::sanitizer::message::OpMark> {
    parse(message).map_err(|e| PyValueError::new_err(format!("invalid sanitizer-op mark: {e}")))
}

fn args_list<'py>(py: Python<'py>, args: &[Arg]) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<Bound<'py, PyTuple>> = args
        .iter()
        .map(|a| {
            PyTuple::new(
                py,
                [
                    a.alias.clone().into_pyobject(py)?.into_any(),
                    a.addr.into_pyobject(py)?.into_any(),
                    a.size.into_pyobject(py)?.into_any(),
                ],
            )
        })
        .collect::<PyResult<_>>()?;
    PyList::new(py, items)
}

/// `parse_sanitizer_mark(message) -> dict`: `name`, and `read_only`, `read_write` (in place),
/// `write_only` as lists of `(alias, addr, size)`. ValueError (column and reason) when the
/// message breaks a rule of the format.
#[pyfunction]
fn parse_sanitizer_mark<'py>(py: Python<'py>, message: &str) -> PyResult<Bound<'py, PyDict>> {
    let op = mark_error(message)?;
    let d = PyDict::new(py);
    d.set_item("name", &op.name)?;
    d.set_item("read_only", args_list(py, &op.read_only)?)?;
    d.set_item("read_write", args_list(py, &op.read_write)?)?;
    d.set_item("write_only", args_list(py, &op.write_only)?)?;
    Ok(d)
}

fn access_dict<'py>(py: Python<'py>, a: &Access) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let kind = match a.kind {
        AccessKind::Read => "read",
        AccessKind::Write => "write",
    };
    d.set_item("kind", kind)?;
    d.set_item("seq", a.seq)?;
    d.set_item("stream", a.stream)?;
    d.set_item("operator", &*a.operator)?;
    d.set_item("alias", &*a.alias)?;
    d.set_item("addr", a.addr)?;
    d.set_item("size", a.size)?;
    Ok(d)
}

fn race_dict<'py>(py: Python<'py>, r: &Race) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("current", access_dict(py, &r.current)?)?;
    d.set_item("previous", access_dict(py, &r.previous)?)?;
    d.set_item("overlap", (r.overlap_start, r.overlap_end))?;
    Ok(d)
}

/// The native race checker on its own (no runtime needed): feed it launches (sanitizer-op
/// messages with their stream) and synchronizations in program order.
#[pyclass(name = "RaceChecker", module = "msmemscope._native")]
struct PyRaceChecker {
    checker: RaceChecker,
    log: RaceLog,
}

#[pymethods]
impl PyRaceChecker {
    #[new]
    fn new() -> Self {
        PyRaceChecker {
            checker: RaceChecker::new(),
            log: RaceLog::default(),
        }
    }

    /// `launch(stream, message) -> list[dict]`: the races this launch is part of, each
    /// `{"current": access, "previous": access, "overlap": (start, end)}`, an access being
    /// `{"kind", "seq", "stream", "operator", "alias", "addr", "size"}`.
    fn launch<'py>(
        &mut self,
        py: Python<'py>,
        stream: u64,
        message: &str,
    ) -> PyResult<Bound<'py, PyList>> {
        let op = mark_error(message)?;
        self.log.marks += 1;
        let races = self.checker.launch(Launch {
            stream,
            op: &op,
            context: 0,
        });
        let list = PyList::empty(py);
        for race in races {
            list.append(race_dict(py, &race)?)?;
            self.log.add(race);
        }
        self.log.saturated = self.checker.saturated();
        Ok(list)
    }

    /// The memory `[addr, addr + size)` was freed: it starts without history.
    fn forget(&mut self, addr: u64, size: u64) {
        self.checker.forget(addr, size);
    }

    fn event_record(&mut self, event: u64, stream: u64) {
        self.checker.sync(SyncOp::EventRecord { event, stream });
    }

    fn stream_wait_event(&mut self, stream: u64, event: u64) {
        self.checker.sync(SyncOp::StreamWaitEvent { stream, event });
    }

    fn event_synchronize(&mut self, event: u64) {
        self.checker.sync(SyncOp::EventSynchronize { event });
    }

    fn stream_synchronize(&mut self, stream: u64) {
        self.checker.sync(SyncOp::StreamSynchronize { stream });
    }

    fn device_synchronize(&mut self) {
        self.checker.sync(SyncOp::DeviceSynchronize);
    }

    /// The report text of everything launched so far, as the runtime writes it at exit.
    fn report(&self) -> String {
        self.log.render(&mut |_| Vec::new())
    }
}

/// Called by the runtime on the marking thread for each well-formed mark.
unsafe extern "C" fn forward_trampoline(message: *const c_char, stream: u64) {
    // SAFETY: Py_IsInitialized may be called at any time, with or without the GIL.
    if message.is_null() || unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        return;
    }
    // SAFETY: the runtime passes a NUL-terminated string valid for the call.
    let text = unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned();
    // A panic must not unwind into the runtime's C caller.
    let _ = std::panic::catch_unwind(move || {
        Python::with_gil(|py| {
            let callback = FORWARD_TO
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|c| c.clone_ref(py));
            if let Some(callback) = callback {
                // An exception cannot cross the C caller: it is printed, as an unraisable one.
                if let Err(e) = callback.call1(py, (text, stream)) {
                    e.write_unraisable(py, Some(callback.bind(py)));
                }
            }
        })
    });
}

/// `sanitizer_enable(forward=None)`: turns the runtime's race checker on; with a callable,
/// also calls `forward(message, stream)` for every well-formed sanitizer-op mark.
#[pyfunction]
#[pyo3(signature = (forward = None))]
fn sanitizer_enable(forward: Option<Bound<'_, PyAny>>) -> PyResult<()> {
    if let Some(f) = &forward {
        if !f.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "forward must be callable or None, got {}",
                f.get_type().name()?
            )));
        }
    }
    let enable = crate::runtime_symbol(c"msmemscope_sanitizer_enable")?;
    let has_forward = forward.is_some();
    *FORWARD_TO.lock().unwrap_or_else(|e| e.into_inner()) = forward.map(Bound::unbind);
    // SAFETY: the runtime's `msmemscope_sanitizer_enable`, whose signature EnableFn spells.
    unsafe {
        let enable: EnableFn = std::mem::transmute::<*mut c_void, EnableFn>(enable);
        let trampoline: ForwardFn = forward_trampoline;
        enable(has_forward.then_some(trampoline));
    }
    Ok(())
}

/// `sanitizer_sync(kind, a=0, b=0)`: a synchronization for the runtime's checker; kinds as
/// `msmemscope/sanitizer.h` (1 event record (event, stream), 2 stream wait (stream, event),
/// 3 event sync (event), 4 stream sync (stream), 5 device sync).
#[pyfunction]
#[pyo3(signature = (kind, a = 0, b = 0))]
fn sanitizer_sync(kind: u32, a: u64, b: u64) -> PyResult<()> {
    let f = crate::runtime_symbol(c"msmemscope_sanitizer_sync")?;
    // SAFETY: the runtime's `msmemscope_sanitizer_sync`, whose signature SyncFn spells.
    let rc = unsafe { std::mem::transmute::<*mut c_void, SyncFn>(f)(kind, a, b) };
    if rc != 0 {
        return Err(PyValueError::new_err(format!(
            "unknown synchronization kind {kind}: accepted are 1 to 5"
        )));
    }
    Ok(())
}

/// `sanitizer_report() -> str`: the runtime's report so far (without stacks).
#[pyfunction]
fn sanitizer_report() -> PyResult<String> {
    crate::runtime_text(c"msmemscope_sanitizer_report", "the sanitizer report")
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_sanitizer_mark, m)?)?;
    m.add_function(wrap_pyfunction!(sanitizer_enable, m)?)?;
    m.add_function(wrap_pyfunction!(sanitizer_sync, m)?)?;
    m.add_function(wrap_pyfunction!(sanitizer_report, m)?)?;
    m.add_class::<PyRaceChecker>()?;
    Ok(())
}
