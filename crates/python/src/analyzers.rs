//! The offline analyses over a dump file, straight from core (no runtime library needed):
//! `check_leaks` and `check_inefficient`. Arguments are checked here so that misuse is a
//! `TypeError` or `ValueError` naming the argument; the scans run without the GIL.
//! `python/msmemscope/analyzers.py` wraps them with the original msMemScope's signatures.

use std::path::{Path, PathBuf};

use msmemscope_core::analysis::check_leaks::{self as leak_check, CheckLeaksError};
use msmemscope_core::analysis::decompose;
use msmemscope_core::analysis::inefficient::{self, InefficientType, Options};
use msmemscope_core::events::reader::ReadError;
use msmemscope_core::events::DeviceId;
use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString};

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A path argument: a `str` or an `os.PathLike`.
fn path_arg(name: &str, value: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let py = value.py();
    let text = if let Ok(s) = value.downcast::<PyString>() {
        s.to_cow()?.into_owned()
    } else if value.hasattr("__fspath__")? {
        let fspath = py.import("os")?.getattr("fspath")?.call1((value,))?;
        match fspath.downcast::<PyString>() {
            Ok(s) => s.to_cow()?.into_owned(),
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "{name} must be a str path, got a path of {}",
                    type_name(&fspath)
                )))
            }
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a str or os.PathLike, got {}",
            type_name(value)
        )));
    };
    if text.is_empty() {
        return Err(PyValueError::new_err(format!("{name} must not be empty")));
    }
    Ok(PathBuf::from(text))
}

/// A non-negative integer argument (`bool` is refused: it is almost always a mistake).
fn count_arg(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {}",
            type_name(value)
        )));
    }
    if let Ok(n) = value.extract::<u64>() {
        return Ok(n);
    }
    match value.extract::<i64>() {
        Ok(n) if n < 0 => Err(PyValueError::new_err(format!(
            "{name} must be >= 0, got {n}"
        ))),
        _ => Err(PyValueError::new_err(format!(
            "{name} is too large: at most {}",
            u64::MAX
        ))),
    }
}

fn read_error(e: ReadError) -> PyErr {
    match e {
        ReadError::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// `check_leaks(input_path, mstx_info, start_index)`: (the report text, the leaked blocks as
/// dicts: id, ptr, size, device, pool, python_stack, site, op; site and op are None when the
/// dump has none).
#[pyfunction]
pub fn check_leaks<'py>(
    py: Python<'py>,
    input_path: &Bound<'py, PyAny>,
    mstx_info: &Bound<'py, PyAny>,
    start_index: &Bound<'py, PyAny>,
) -> PyResult<(String, Bound<'py, PyList>)> {
    let path = path_arg("input_path", input_path)?;
    let mstx_info = match mstx_info.downcast::<PyString>() {
        Ok(s) => s.to_cow()?.into_owned(),
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "mstx_info must be a str (the message of the marks), got {}",
                type_name(mstx_info)
            )))
        }
    };
    let start_index = usize::try_from(count_arg("start_index", start_index)?)
        .map_err(|_| PyValueError::new_err("start_index is too large"))?;
    let result = py
        .allow_threads(|| leak_check::check_leaks(&path, &mstx_info, start_index))
        .map_err(|e| match e {
            CheckLeaksError::Read(e) => read_error(e),
            e => PyValueError::new_err(e.to_string()),
        })?;
    let list = PyList::empty(py);
    for leak in &result.leaks {
        let d = PyDict::new(py);
        d.set_item("id", leak.row_id)?;
        d.set_item("ptr", leak.ptr)?;
        d.set_item("size", leak.size)?;
        d.set_item("device", leak.device.to_string())?;
        d.set_item("pool", leak.pool.as_str())?;
        d.set_item("python_stack", &leak.python_stack)?;
        d.set_item("site", leak.site.as_deref())?;
        d.set_item("op", leak.op.as_deref())?;
        list.append(d)?;
    }
    Ok((result.console, list))
}

/// `check_inefficient(input_path, mem_size=0, inefficient_type=None, idle_threshold=3000, *,
/// output_path=None)`: the marked blocks as dicts (id, ptr, size, device, inefficient_type),
/// one per block and kind. With `output_path`, also writes them there as CSV (the online
/// analysis's `inefficient_blocks.csv` format); otherwise writes nothing.
#[pyfunction]
#[pyo3(signature = (input_path, mem_size = None, inefficient_type = None, idle_threshold = None, *, output_path = None))]
pub fn check_inefficient<'py>(
    py: Python<'py>,
    input_path: &Bound<'py, PyAny>,
    mem_size: Option<&Bound<'py, PyAny>>,
    inefficient_type: Option<&Bound<'py, PyAny>>,
    idle_threshold: Option<&Bound<'py, PyAny>>,
    output_path: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let path = path_arg("input_path", input_path)?;
    let mut options = Options::default();
    if let Some(v) = mem_size {
        options.mem_size = count_arg("mem_size", v)?;
    }
    if let Some(v) = idle_threshold {
        options.idle_threshold = count_arg("idle_threshold", v)?;
    }
    if let Some(v) = inefficient_type.filter(|v| !v.is_none()) {
        let Ok(s) = v.downcast::<PyString>() else {
            return Err(PyTypeError::new_err(format!(
                "inefficient_type must be a str or None, got {}",
                type_name(v)
            )));
        };
        let s = s.to_cow()?;
        options.kind = Some(InefficientType::parse(&s).ok_or_else(|| {
            PyValueError::new_err(format!(
                "inefficient_type must be one of {} or None, got {s:?}",
                InefficientType::accepted()
            ))
        })?);
    }
    let output = match output_path.filter(|v| !v.is_none()) {
        Some(v) => {
            let out = path_arg("output_path", v)?;
            // Before the scan, so that a mistake costs no wait; checked again on the open file.
            if let Ok(meta) = std::fs::symlink_metadata(&out) {
                refuse_output(&path, &out, &meta)?;
            }
            Some(out)
        }
        None => None,
    };
    let marks = py
        .allow_threads(|| inefficient::check_inefficient(&path, &options))
        .map_err(read_error)?;
    if let Some(out) = output {
        write_output(&path, &out, inefficient::render_csv(&marks).as_bytes())?;
    }
    // A dump can mark a million blocks: the keys, kinds and devices are made once as Python
    // strings and shared by every dict, not made again for each.
    let keys = [
        pyo3::intern!(py, "id"),
        pyo3::intern!(py, "ptr"),
        pyo3::intern!(py, "size"),
        pyo3::intern!(py, "device"),
        pyo3::intern!(py, "inefficient_type"),
    ];
    let kinds = InefficientType::ALL.map(|k| PyString::new(py, k.as_str()));
    let mut devices: Vec<(DeviceId, Bound<'py, PyString>)> = Vec::new();
    let mut dicts = Vec::with_capacity(marks.len());
    for m in &marks {
        let device = match devices.iter().find(|(d, _)| *d == m.device) {
            Some((_, name)) => name.clone(),
            None => {
                let name = PyString::new(py, &m.device.to_string());
                devices.push((m.device, name.clone()));
                name
            }
        };
        let d = PyDict::new(py);
        d.set_item(keys[0], m.id)?;
        d.set_item(keys[1], m.ptr)?;
        d.set_item(keys[2], m.size)?;
        d.set_item(keys[3], device)?;
        d.set_item(keys[4], &kinds[m.kind as usize])?;
        dicts.push(d);
    }
    PyList::new(py, dicts)
}

/// Why `output` must not be written: it is a symlink (the file it names could be anything,
/// the dump included), not a regular file, or the input itself (writing would replace the dump
/// with the result). `meta` is `output`'s own metadata, not its target's.
fn refuse_output(input: &Path, output: &Path, meta: &std::fs::Metadata) -> PyResult<()> {
    use std::os::unix::fs::MetadataExt;
    let shown = output.display();
    if meta.file_type().is_symlink() {
        return Err(PyValueError::new_err(format!(
            "output_path: {shown} is a symlink; give the path of a regular file"
        )));
    }
    if !meta.is_file() {
        return Err(PyValueError::new_err(format!(
            "output_path: {shown} is not a regular file"
        )));
    }
    if let Ok(input_meta) = std::fs::metadata(input) {
        if (input_meta.dev(), input_meta.ino()) == (meta.dev(), meta.ino()) {
            return Err(PyValueError::new_err(format!(
                "output_path: {shown} is the input file; give another path"
            )));
        }
    }
    Ok(())
}

/// Writes the result to `output`, never through a symlink (`O_NOFOLLOW`) nor onto the input:
/// the file is opened without truncating it, checked on its descriptor, and only then emptied.
fn write_output(input: &Path, output: &Path, bytes: &[u8]) -> PyResult<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| {
        PyOSError::new_err(format!(
            "output_path: cannot write {}: {e}",
            output.display()
        ))
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        // A FIFO would block the open until some reader came.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(output);
    let mut file = match file {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(PyValueError::new_err(format!(
                "output_path: {} is a symlink; give the path of a regular file",
                output.display()
            )))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(PyValueError::new_err(format!(
                "output_path: {} is not a regular file",
                output.display()
            )))
        }
        Err(e) => return Err(cannot(e)),
    };
    let meta = file.metadata().map_err(cannot)?;
    refuse_output(input, output, &meta)?;
    file.set_len(0).map_err(cannot)?;
    file.write_all(bytes).map_err(cannot)
}

/// `check_decompose(input_path)`: the per-step table of bytes by owner, as dicts (step, device,
/// pool, owner, current, peak, max) in step order; the `total` owner sums each step.
#[pyfunction]
pub fn check_decompose<'py>(
    py: Python<'py>,
    input_path: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let path = path_arg("input_path", input_path)?;
    let table = py
        .allow_threads(|| decompose::check_decompose(&path))
        .map_err(read_error)?;
    let list = PyList::empty(py);
    for line in &table {
        let d = PyDict::new(py);
        d.set_item("step", line.step)?;
        d.set_item("device", line.device.to_string())?;
        d.set_item("pool", line.pool.as_str())?;
        d.set_item("owner", &line.owner)?;
        d.set_item("current", line.current)?;
        d.set_item("peak", line.peak)?;
        d.set_item("max", line.max)?;
        list.append(d)?;
    }
    Ok(list)
}

/// `check_peak(input_path)`: what each device's peak is made of, as `leaks/peak.json`'s text.
#[pyfunction]
pub fn check_peak(py: Python<'_>, input_path: &Bound<'_, PyAny>) -> PyResult<String> {
    let path = path_arg("input_path", input_path)?;
    py.allow_threads(|| msmemscope_core::analysis::leaks::peak::check_peak(&path))
        .map_err(read_error)
}

/// The `inefficient_type` values, for the Python layer's documentation and config.
pub fn inefficient_types() -> Vec<&'static str> {
    InefficientType::ALL.iter().map(|k| k.as_str()).collect()
}

/// Registers the functions and constants in `_native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_leaks, m)?)?;
    m.add_function(wrap_pyfunction!(check_inefficient, m)?)?;
    m.add_function(wrap_pyfunction!(check_decompose, m)?)?;
    m.add_function(wrap_pyfunction!(check_peak, m)?)?;
    m.add("INEFFICIENT_TYPES", inefficient_types())?;
    m.add(
        "DEFAULT_IDLE_THRESHOLD",
        inefficient::DEFAULT_IDLE_THRESHOLD,
    )?;
    Ok(())
}
