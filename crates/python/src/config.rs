//! `validate_config(current_json, **kw)`: applies `msmemscope.config(**kw)` keys to a RunConfig
//! with core's own parsers, so Python accepts exactly what the command line accepts.

use msmemscope_core::config::{
    resolve, set_option, ConfigError, GivenOptions, NameStyle, OptionName, RunConfig,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

/// The keys `msmemscope.config` accepts, comma separated, for error messages.
pub fn accepted_keys() -> String {
    OptionName::python_config()
        .map(OptionName::python_key)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The string value of one key: a `str`; for `analysis` also a list or tuple of `str` (the original
/// msMemScope's users write `analysis=["host-leaks"]`), joined with commas.
fn value_text(option: OptionName, key: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = value.downcast::<PyString>() {
        return Ok(s.to_cow()?.into_owned());
    }
    let is_seq = value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>();
    if option == OptionName::Analysis && is_seq {
        let mut items = Vec::new();
        for item in value.try_iter()? {
            let item = item?;
            match item.downcast::<PyString>() {
                Ok(s) => items.push(s.to_cow()?.into_owned()),
                Err(_) => {
                    return Err(PyTypeError::new_err(format!(
                        "{key}: every item must be a str, got {}",
                        type_name(&item)
                    )))
                }
            }
        }
        return Ok(items.join(","));
    }
    let expected = if option == OptionName::Analysis {
        "a str or a list of str"
    } else {
        "a str"
    };
    Err(PyTypeError::new_err(format!(
        "{key} must be {expected}, got {} (config values are strings, e.g. {key}=\"{}\")",
        type_name(value),
        option.example()
    )))
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

fn config_error(e: ConfigError) -> PyErr {
    PyValueError::new_err(e.render(NameStyle::Python))
}

/// Applies `kw` to the config in `current_json` and returns the resolved config's JSON.
#[pyfunction]
#[pyo3(signature = (current_json, **kw))]
pub fn validate_config(current_json: &str, kw: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let mut config = RunConfig::from_json(current_json)
        .map_err(|e| PyValueError::new_err(format!("the current configuration is invalid: {e}")))?;
    let mut given = GivenOptions::new();
    if let Some(kw) = kw {
        for (key, value) in kw.iter() {
            let key: String = key.extract()?;
            let option = OptionName::from_python_key(&key).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown config key {key:?}: accepted keys are {}",
                    accepted_keys()
                ))
            })?;
            let text = value_text(option, &key, &value)?;
            set_option(&mut config, option, &text).map_err(config_error)?;
            given.insert(option);
        }
    }
    resolve(&mut config, &given).map_err(config_error)?;
    Ok(config.to_json())
}
