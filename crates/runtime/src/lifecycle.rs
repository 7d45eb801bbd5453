//! Start and end of the runtime inside the target: the ELF constructor reads the launcher's
//! configuration and opens the window; an `atexit` handler registered from the constructor
//! closes it. Registered this early, it runs after every handler the program registers later,
//! and after the loader has run the libraries' destructors, so their frees still count.

use std::path::PathBuf;
use std::sync::OnceLock;

use msmemscope_core::config::RunConfig;
use msmemscope_core::launch_env;

use crate::guard::Entered;
use crate::host_leak::settings::{CapOverrides, WindowSettings};
use crate::host_leak::window;
use crate::log;
use crate::pipeline;
use crate::unwind::{capture, modules};

/// The run this process belongs to, when it was started by the launcher.
pub struct Run {
    pub dir: PathBuf,
    pub config: RunConfig,
    pub caps: CapOverrides,
}

static RUN: OnceLock<Run> = OnceLock::new();

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

extern "C" fn on_load() {
    // Allocations libc makes for us here (environment edits) are not the program's.
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    quiet_panics();
    let Some(run) = take_launch_environment() else {
        return;
    };
    log::init(&run.dir, run.config.log_level);
    mark_own_code();
    register_exit_handler();
    let run = RUN.get_or_init(|| run);
    if run.config.host_leaks() {
        window::open(WindowSettings::new(&run.config, &run.caps));
    } else {
        pipeline::init_launched(run.dir.clone(), run.config.clone());
    }
    // `msmemscope --pid` can attach to every launched run.
    crate::control::start();
}

/// The launched run, if this process is one.
pub fn launched_run() -> Option<&'static Run> {
    RUN.get()
}

/// The configuration in force: the launcher's for launched runs, else the Python API's.
pub fn active_config() -> RunConfig {
    match RUN.get() {
        Some(run) if run.config.host_leaks() => run.config.clone(),
        _ => pipeline::config(),
    }
}

/// Where a closing window writes its report: the launched run's directory, or the API run's
/// (created on first need).
pub fn report_dir() -> Result<PathBuf, String> {
    match RUN.get() {
        Some(run) => Ok(run.dir.clone()),
        None => pipeline::run_dir(),
    }
}

/// A panic inside the runtime is caught at the boundary it crossed; its message goes to our log,
/// never to the program's stderr.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        log::error(&format!("internal error: {info}"))
    }));
}

/// Registers the exit and fork handlers once (at start for launched runs, at the first
/// `start()` of the Python API otherwise). Registered this early, the exit handler runs after
/// the handlers the program registers later and after the libraries' destructors.
pub fn register_exit_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering plain extern "C" functions with libc.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
            libc::atexit(at_exit);
        }
    });
}

/// Reads the launcher's variables. `None` unless this process is the launcher's direct child:
/// a program the target starts inherits `LD_PRELOAD` but is not tracked. The variables stay in
/// the environment, so that a target which execs the real program (a shell script, a version
/// shim, `env`) is followed into it: the new image is still the launcher's child.
fn take_launch_environment() -> Option<Run> {
    let dir = std::env::var_os(launch_env::RUN_DIR)?;
    let launcher: i32 = std::env::var(launch_env::LAUNCHER_PID).ok()?.parse().ok()?;
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != launcher {
        return None;
    }
    let caps = CapOverrides::from_env();
    let dir = PathBuf::from(dir);
    let text = std::fs::read_to_string(dir.join(launch_env::CONFIG_FILE)).ok()?;
    let config = RunConfig::from_json(&text).ok()?;
    Some(Run { dir, config, caps })
}

/// Records this library's code range, so stack capture can skip the hook's own frames.
pub fn mark_own_code() {
    // Scans the loaded modules if that was not done yet: the unwinder needs them anyway.
    modules::refresh(false);
    let here = on_load as *const () as u64;
    if let Some(m) = modules::seen_modules()
        .into_iter()
        .find(|m| m.start <= here && here < m.end)
    {
        capture::set_own_code_range(m.start..m.end);
    }
}

extern "C" fn at_exit() {
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    // No control command runs from here on (one in progress is waited for).
    crate::control::shutdown();
    if window::active().is_some() {
        // An unclosed window closes at exit.
        match report_dir() {
            Ok(dir) => {
                window::close(&dir);
            }
            Err(e) => log::error(&format!("host-leak window left open at exit: {e}")),
        }
    }
    pipeline::shutdown();
    // After the pipeline: the sanitizer's console text follows the analyses' report.
    crate::sanitizer::write_report_at_exit();
}

extern "C" fn after_fork_in_child() {
    window::detach_after_fork();
    pipeline::detach_after_fork();
}
