//! The one owner of the process-wide run state: the configuration in force, the run directory,
//! whether the launcher started this run or the program's own API calls did, the forked-child
//! flag and the exit registration; and the operations on it (configure, start, stop, step,
//! finish). The C ABI (`ffi`), the attach channel (`control`), the ELF constructor and exit
//! handler (`lifecycle`) and the marks are thin adapters over these functions, so a launched
//! host-leak run behaves the same whether a window is closed by `msmemscope_stop()`, by
//! `msmemscope --pid P --command stop` or at exit.
//!
//! Locks: `OPS` serialises the operations (a window is never opened by one caller while
//! another closes it); `STATE` guards the fields and is held only to read or replace them,
//! never while calling into the pipeline, whose writer asks this module for the run directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard};

use msmemscope_core::config::{CollectMode, RunConfig};
use msmemscope_core::run_dir::RunDir;

use crate::host_leak::settings::{CapOverrides, WindowSettings};
use crate::host_leak::window;
use crate::{log, pipeline};

/// Who started the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `msmemscope … program`: the run directory exists and the configuration is the
    /// launcher's `config.json`.
    Launched,
    /// The program's own `config()`/`start()` calls (Python API, or a preloaded runtime
    /// sourced with `--load-api-env`): the run directory is made on first need.
    Api,
}

struct State {
    config: RunConfig,
    /// Held open: every file of the run is made relative to it.
    dir: Option<Arc<RunDir>>,
    origin: Origin,
    caps: CapOverrides,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static OPS: Mutex<()> = Mutex::new(());
/// True once the exit work has run (at exit, or on a terminating signal): it runs once, and a
/// second caller waits here until the first is done.
static FINISHED: Mutex<bool> = Mutex::new(false);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    f(lock(&STATE).get_or_insert_with(State::api))
}

impl State {
    /// Until a launcher's configuration arrives: an API run with the defaults.
    fn api() -> State {
        State {
            config: RunConfig::default(),
            dir: None,
            origin: Origin::Api,
            caps: CapOverrides::default(),
        }
    }
}

/// A run started by the launcher: its directory and configuration. Host-leak runs open their
/// first window; event runs trace from now on (`immediate`) or from the program's `start()`.
/// A process the program started (`--follow exec`) has no directory yet: it is made under the
/// job's output path when the run first writes a file, so a process that records nothing (a
/// shell, a compiler) leaves none.
pub fn begin_launched(dir: Option<RunDir>, config: RunConfig, caps: CapOverrides) {
    let _ops = lock(&OPS);
    if let Some(dir) = &dir {
        log::init(dir, config.log_level);
    }
    with_state(|s| {
        s.config = config.clone();
        s.dir = dir.map(Arc::new);
        s.origin = Origin::Launched;
        s.caps = caps.clone();
    });
    pipeline::apply_config(&config, run_dir_handle);
    // Stacks (host-leak blocks, `--call-stack c`) need the modules and the runtime's own range.
    crate::unwind::mark_own_code();
    if config.host_leaks() {
        window::open(WindowSettings::new(&config, &caps));
    } else if config.collect_mode == CollectMode::Immediate {
        pipeline::start_tracing();
    }
}

/// Whether this process's run was started by the launcher, and with which configuration.
pub fn origin() -> Origin {
    with_state(|s| s.origin)
}

/// The configuration in force. Has no side effect (no directory is made to answer).
pub fn config() -> RunConfig {
    with_state(|s| s.config.clone())
}

/// The run directory's path, made on first need from the configured output path in API runs.
pub fn run_dir() -> Result<PathBuf, String> {
    run_dir_handle().map(|d| d.path().to_path_buf())
}

/// The run directory, held open (made on first need in API runs): files go through it.
pub fn run_dir_handle() -> Result<Arc<RunDir>, String> {
    let mut slot = lock(&STATE);
    let state = slot.get_or_insert_with(State::api);
    if let Some(dir) = &state.dir {
        return Ok(dir.clone());
    }
    let created = Arc::new(RunDir::create(&state.config, std::process::id())?);
    log::init(&created, state.config.log_level);
    state.dir = Some(created.clone());
    Ok(created)
}

/// The run directory if there is one already (never makes one).
pub fn existing_run_dir() -> Option<Arc<RunDir>> {
    with_state(|s| s.dir.clone())
}

/// Why `configure` changed nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigureError {
    /// A host-leak window is open: its settings hold until it closes.
    WindowOpen,
}

/// Replaces the configuration (the Python API's `config()`). The run directory, once made,
/// stays: a run writes into one directory.
pub fn configure(config: RunConfig) -> Result<(), ConfigureError> {
    let _ops = lock(&OPS);
    if is_forked_child() {
        return Ok(());
    }
    if window::active().is_some() {
        return Err(ConfigureError::WindowOpen);
    }
    with_state(|s| s.config = config.clone());
    pipeline::apply_config(&config, run_dir_handle);
    Ok(())
}

/// What `start` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// A host-leak window with this stage number.
    Window(u32),
    /// The event trace (also when it was on already).
    Trace,
}

/// Why `start` did nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum StartError {
    /// The window with this stage number is open already.
    WindowOpen(u32),
    /// Host-leaks needs this library's malloc to be the process's (preloaded).
    NoHostHooks,
    /// The run directory cannot be made.
    NoRunDir(String),
    /// A forked child records nothing.
    ForkedChild,
}

/// Starts recording: a new host-leak window when the configuration asks for host-leaks (with
/// the launcher's settings in a launched run), else the event trace.
pub fn start() -> Result<Started, StartError> {
    if is_forked_child() {
        return Err(StartError::ForkedChild);
    }
    let _ops = lock(&OPS);
    let (config, caps) = with_state(|s| (s.config.clone(), s.caps.clone()));
    if !config.host_leaks() {
        pipeline::start_tracing();
        return Ok(Started::Trace);
    }
    if let Some(ledger) = window::active() {
        return Err(StartError::WindowOpen(ledger.stage));
    }
    if !crate::forward::is_process_malloc() {
        return Err(StartError::NoHostHooks);
    }
    // The report is written at close: a directory that cannot be made is said now.
    run_dir_handle().map_err(StartError::NoRunDir)?;
    crate::unwind::mark_own_code();
    let caps = match origin() {
        Origin::Launched => caps,
        Origin::Api => CapOverrides::from_env(),
    };
    match window::open(WindowSettings::new(&config, &caps)) {
        Some(stage) => Ok(Started::Window(stage)),
        None => Err(StartError::WindowOpen(
            window::active().map_or(0, |l| l.stage),
        )),
    }
}

/// What `stop` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The window with this stage number closed; its overview, when it could be written.
    Window(u32, Option<PathBuf>),
    /// The event trace stopped and everything recorded so far is written.
    Trace,
    /// Nothing was recording.
    Nothing,
}

/// Stops recording: closes the open window into the run directory (its report is written
/// now), or stops the event trace.
pub fn stop() -> Result<Stopped, String> {
    let _ops = lock(&OPS);
    if let Some(ledger) = window::active() {
        let stage = ledger.stage;
        let dir = run_dir_handle()?;
        return Ok(Stopped::Window(stage, window::close(&dir)));
    }
    if pipeline::is_tracing() {
        pipeline::stop_tracing();
        return Ok(Stopped::Trace);
    }
    Ok(Stopped::Nothing)
}

/// Starts the next step.
pub fn step() {
    pipeline::step();
}

/// An optimizer's `step()` ended: a step boundary while the program marks none. True when a
/// STEP row was written.
pub fn optimizer_step() -> bool {
    pipeline::inferred_step("optimizer.step")
}

/// The end of the run (at exit, or before a terminating signal takes its course): commands
/// of the attach channel stop, the open window closes and writes its report, the event dump
/// is flushed with its analyses, and the sanitizer writes its report. Runs once.
pub fn finish() {
    if is_forked_child() {
        return;
    }
    let mut finished = lock(&FINISHED);
    if *finished {
        return;
    }
    *finished = true;
    // The report's files need a descriptor even if the program has used up its own.
    crate::spare_fd::release();
    let _ops = lock(&OPS);
    if let Some(ledger) = window::active() {
        match run_dir_handle() {
            Ok(dir) => {
                window::close(&dir);
            }
            Err(e) => log::error(&format!(
                "host-leak window {} left open at exit: {e}",
                ledger.stage
            )),
        }
    }
    pipeline::shutdown();
    // After the pipeline: the sanitizer's console text follows the analyses' report.
    let (origin, config) = with_state(|s| (s.origin, s.config.clone()));
    // The launcher prints analysis_report.txt once an event-dump program has ended.
    let console_file = (origin == Origin::Launched && !config.host_leaks())
        .then(existing_run_dir)
        .flatten();
    crate::sanitizer::write_report_at_exit(run_dir_handle, console_file);
}

pub use crate::process::is_forked_child;

pub(crate) extern "C" fn after_fork_in_child() {
    crate::process::mark_forked_child();
    crate::clock::forget_ticks_after_fork();
    // Forget the window without touching its locks: another thread of the parent may have held
    // one at the moment of the fork.
    window::detach_after_fork();
    pipeline::forget_after_fork();
    crate::sanitizer::forget_after_fork();
}
