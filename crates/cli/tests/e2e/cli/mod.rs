//! The command line itself, before any program runs.

mod bad_arguments;
mod shell_wrapper;
mod usage_errors;
