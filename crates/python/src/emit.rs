//! `emit(...)`: one event from Python (the PyTorch tracker, marks) into the runtime's pipeline.

use msmemscope_core::events::abi::{EventRecord, StrRef, DEVICE_CPU, DEVICE_CUDA, DEVICE_NONE};
use msmemscope_core::events::{Event, EventType};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// `"cpu"` or `"cuda:N"` (`None`: no device) as the ABI's kind and index.
fn parse_device(device: Option<&str>) -> PyResult<(u32, u32)> {
    let Some(text) = device else {
        return Ok((DEVICE_NONE, 0));
    };
    if text == "cpu" {
        return Ok((DEVICE_CPU, 0));
    }
    if let Some(index) = text.strip_prefix("cuda:") {
        if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(index) = index.parse::<u32>() {
                return Ok((DEVICE_CUDA, index));
            }
        }
    }
    Err(PyValueError::new_err(format!(
        "invalid device {text:?}: accepted values are cpu, cuda:N, or None"
    )))
}

/// One attribute value as JSON: int, float, str, bool, None, or a list/tuple of ints.
fn attr_value(key: &str, value: &Bound<'_, PyAny>) -> PyResult<Value> {
    if value.is_none() {
        return Ok(Value::Null);
    }
    // bool before int: Python's bool is an int subclass.
    if let Ok(b) = value.downcast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        return int_value(key, value);
    }
    if let Ok(f) = value.downcast::<PyFloat>() {
        let f = f.value();
        return Number::from_f64(f).map(Value::Number).ok_or_else(|| {
            PyValueError::new_err(format!("attribute {key:?}: {f} is not a finite number"))
        });
    }
    if let Ok(s) = value.downcast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for item in value.try_iter()? {
            let item = item?;
            if !item.is_instance_of::<PyInt>() || item.is_instance_of::<PyBool>() {
                return Err(PyTypeError::new_err(format!(
                    "attribute {key:?}: a list may hold only ints"
                )));
            }
            items.push(int_value(key, &item)?);
        }
        return Ok(Value::Array(items));
    }
    Err(PyTypeError::new_err(format!(
        "attribute {key:?}: values must be int, float, str, bool, None or a list of ints, got {}",
        value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    )))
}

fn int_value(key: &str, value: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(i) = value.extract::<i64>() {
        return Ok(Value::from(i));
    }
    if let Ok(u) = value.extract::<u64>() {
        return Ok(Value::from(u));
    }
    Err(PyValueError::new_err(format!(
        "attribute {key:?}: the integer does not fit in 64 bits"
    )))
}

/// The Attr column's JSON object text, keys in insertion order.
fn attrs_json(attrs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let Some(attrs) = attrs else {
        return Ok(String::new());
    };
    if attrs.is_empty() {
        return Ok(String::new());
    }
    let mut map = Map::with_capacity(attrs.len());
    for (key, value) in attrs.iter() {
        let key = key
            .downcast::<PyString>()
            .map_err(|_| PyTypeError::new_err("attribute names must be str"))?
            .to_cow()?
            .into_owned();
        let value = attr_value(&key, &value)?;
        map.insert(key, value);
    }
    Ok(Value::Object(map).to_string())
}

/// Sends one event; returns 0 when recorded, 1 when filtered out or not tracing.
#[pyfunction]
#[pyo3(signature = (event, event_type, name, device, ptr, attrs, python_stack = "", want_c_stack = false))]
#[allow(clippy::too_many_arguments)]
pub fn emit(
    event: u32,
    event_type: u32,
    name: &str,
    device: Option<&str>,
    ptr: Option<u64>,
    attrs: Option<&Bound<'_, PyDict>>,
    python_stack: &str,
    want_c_stack: bool,
) -> PyResult<i32> {
    if Event::from_u32(event).is_none() {
        return Err(PyValueError::new_err(format!("unknown event code {event}")));
    }
    if !EventType::ALL.iter().any(|t| *t as u32 == event_type) {
        return Err(PyValueError::new_err(format!(
            "unknown event type code {event_type}"
        )));
    }
    let rt = crate::require_runtime()?;
    let (device_kind, device_index) = parse_device(device)?;
    let attrs = attrs_json(attrs)?;
    let record = EventRecord {
        event,
        event_type,
        name: StrRef::new(name),
        device_kind,
        device_index,
        has_ptr: u32::from(ptr.is_some()),
        ptr: ptr.unwrap_or(0),
        attrs_json: StrRef::new(&attrs),
        python_stack: StrRef::new(python_stack),
        want_c_stack: u32::from(want_c_stack),
    };
    // SAFETY: `record` and every string it points at live until the call returns; the runtime
    // copies what it keeps.
    let rc = unsafe { (rt.emit)(&record) };
    if rc < 0 {
        return Err(PyRuntimeError::new_err(format!(
            "msmemscope_emit rejected the event ({}): code {rc}",
            describe(event, event_type)
        )));
    }
    Ok(rc)
}

fn describe(event: u32, event_type: u32) -> String {
    let e = Event::from_u32(event).map_or("?", Event::as_str);
    let t = EventType::ALL
        .iter()
        .find(|t| **t as u32 == event_type)
        .map_or("?", |t| t.as_str());
    format!("{e}/{t}")
}
