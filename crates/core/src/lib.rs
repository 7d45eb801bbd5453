//! msmemscope-core: the part of msmemscope without process-global state: configuration, the
//! event model and its sinks' formats, the host-leak report model and its renderers, the LSI,
//! symbolization and the run directory. The CLI, the preloaded runtime library and the Python
//! extension all share it; it calls libc only for file flags and local time.

pub mod analysis;
pub mod config;
pub mod control_frame;
// Where the control socket lives; the directory checks shared by the runtime and `--pid`.
pub mod control_socket;
pub mod events;
pub mod held_fd;
pub mod host_leak;
pub mod launch_env;
// Native Python frames: line numbers from code objects' line tables.
pub mod pyframes;
// The flight recorder: which steps of a long run keep their rows, and every step's summary.
pub mod recorder;
pub mod run_dir;
// Stream-race sanitizer: sanitizer-op marks and the vector-clock checker.
pub mod sanitizer;
// A line of the user's source, quoted by the leak findings.
pub mod source_line;
pub mod symbolize;
pub mod time_fmt;
// Memory block watch: the CRC-64 of the watch dumps.
pub mod watch;
