//! The environment the launcher hands to the target and the runtime library reads back at
//! start.

/// The run directory `{output}/msmemscope_{PID}_{ts}/`, holding `config.json`.
pub const RUN_DIR: &str = "MSMEMSCOPE_RUN_DIR";
/// The number of the descriptor, inherited from the launcher, that holds the run directory
/// open: the runtime writes through it, so a run directory renamed and replaced by a symlink
/// while the program runs still receives the run's files. Checked against `RUN_DIR` (same
/// device and inode) before it is used.
pub const RUN_DIR_FD: &str = "MSMEMSCOPE_RUN_DIR_FD";
/// The launcher's pid: only its direct child is tracked, not processes the program execs later.
pub const LAUNCHER_PID: &str = "MSMEMSCOPE_LAUNCHER_PID";
/// The config file's name inside the run directory.
pub const CONFIG_FILE: &str = "config.json";
/// The log directory's name inside the run directory.
pub const LOG_DIR: &str = "msmemscope_logs";
/// File name of the runtime library.
pub const RUNTIME_LIBRARY: &str = "libmsmemscope_runtime.so";
/// Where NVTX-annotated code looks for its injection library (our runtime).
pub const NVTX_INJECTION: &str = "NVTX_INJECTION64_PATH";
/// Set for a host-leak run that accounts Python objects: the start-up module (`sitecustomize`)
/// then wraps CPython's allocators instead of turning the PyTorch tracker on.
pub const PYTHON_OBJECTS: &str = "MSMEMSCOPE_PYTHON_OBJECTS";
/// Overrides where the launcher finds the Python package (`<dir>/msmemscope`).
pub const PYTHON_DIR: &str = "MSMEMSCOPE_PYTHON_DIR";
/// The online analyses' console report, in the run directory; the launcher prints it.
pub const ANALYSIS_REPORT: &str = "analysis_report.txt";
