//! msmemscope-core: the pure part of msmemscope: configuration, the host-leak report model and
//! its renderers, symbolization. It does no FFI and holds no process-global state, so the CLI,
//! the preloaded runtime library and (later) the Python extension all share it.

pub mod config;
pub mod host_leak;
pub mod launch_env;
pub mod symbolize;
pub mod time_fmt;
