//! The run configuration: every option of the `msmemscope` command and every key of
//! `msmemscope.config(...)`, validated once here and written to `config.json`.
//!
//! The CLI parses argv into a [`RunConfig`]; the runtime library reads the same struct back
//! from `config.json`; the Python package (later) validates its keys with the same functions.

mod options;
mod types;
mod values;

pub use options::*;
pub use types::*;
pub use values::*;
