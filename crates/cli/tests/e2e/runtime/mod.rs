//! The runtime library inside programs: launched by `msmemscope-cli` (which preloads it) or
//! preloaded as after `source msmemscope --load-api-env`.

mod attach;
mod cuda_hooks;
mod cut_short;
mod event_dump;
mod host_leaks;
mod hostile_programs;
mod launcher_signals;
mod marks;
mod program_sees_nothing;
mod run_dir_security;
mod sanitizer;
