//! The launched run's beginning: the launcher's configuration read from the environment and
//! the session begun, once, at the program's first hooked allocation or at this library's
//! constructor, whichever comes first (lifecycle says why both).

use std::panic::catch_unwind;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

use msmemscope_core::config::{Follow, JobLink, RunConfig};
use msmemscope_core::launch_env;
use msmemscope_core::run_dir::RunDir;

use crate::guard::Entered;
use crate::host_leak::settings::CapOverrides;
use crate::log;
use crate::session;

const NOT_BEGUN: u8 = 0;
const BEGINNING: u8 = 1;
const BEGUN: u8 = 2;

/// Whether the launch environment was read (and the run begun): one load on the hooks' path
/// until then.
static BEGIN: AtomicU8 = AtomicU8::new(NOT_BEGUN);

/// Called by the allocation hooks while no window is open: begins a launched run at the
/// program's first allocation, before this library's constructor, after `first` (what the
/// hooks need in place before the run's first module scan). Cheap once begun.
#[inline(always)]
pub fn begin_on_first_allocation(first: fn()) {
    if BEGIN.load(Ordering::Relaxed) == NOT_BEGUN {
        begin_from_hook(first);
    }
}

#[cold]
#[inline(never)]
fn begin_from_hook(first: fn()) {
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    // Inside the program's allocation: its errno stays as the allocation left it.
    // SAFETY: `__errno_location` returns this thread's errno, always valid to read and write.
    let errno = unsafe { *libc::__errno_location() };
    let _ = catch_unwind(|| {
        first();
        begin_run();
    });
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Reads the launcher's configuration and begins the run, once. Registers nothing with libc
/// (it may be running inside an allocation libc makes under one of its own locks).
pub fn begin_run() {
    if BEGIN
        .compare_exchange(NOT_BEGUN, BEGINNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    quiet_panics();
    if let Some((dir, config, caps)) = take_launch_environment() {
        session::begin_launched(dir, config, caps);
    }
    BEGIN.store(BEGUN, Ordering::Release);
}

/// A panic inside the runtime is caught at the boundary it crossed; its message goes to our log,
/// never to the program's stderr.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            log::error(&format!("internal error: {info}"))
        }));
    });
}

/// Reads the launcher's variables: the run directory (`Some`) when this process is the
/// launcher's direct child (or an image it exec'd in its place); `None` for it when this is a
/// process the program started and the job follows them (`--follow exec`): its run directory
/// is made later, on first need. Nothing otherwise (`--follow none`). The variables stay in the
/// environment, so that the processes the program starts find them.
fn take_launch_environment() -> Option<(Option<RunDir>, RunConfig, CapOverrides)> {
    let dir = std::env::var_os(launch_env::RUN_DIR)?;
    let launcher: i32 = std::env::var(launch_env::LAUNCHER_PID).ok()?.parse().ok()?;
    let caps = CapOverrides::from_env();
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    if parent != launcher {
        // The job's directory by its path (its descriptor is the launcher's child's alone).
        let job = RunDir::open(Path::new(&dir)).ok()?;
        let mut config = read_config(&job)?;
        if config.follow != Follow::Exec {
            return None;
        }
        config.job = Some(JobLink {
            job_run: job.path().to_path_buf(),
            launcher_pid: launcher as u32,
            parent_pid: parent as u32,
            command: own_command_line(),
        });
        // Recorded again from this process's environment when its directory is made.
        config.distributed = None;
        return Some((None, config, caps));
    }
    // The launcher's descriptor of the run directory, when it is still that directory: the
    // path is not resolved again for any file (it may have been swapped for a symlink since).
    let fd = std::env::var(launch_env::RUN_DIR_FD)
        .ok()
        .and_then(|n| n.parse().ok());
    let dir = RunDir::inherited(fd, Path::new(&dir)).ok()?;
    let config = read_config(&dir)?;
    Some((Some(dir), config, caps))
}

fn read_config(dir: &RunDir) -> Option<RunConfig> {
    let text = dir
        .read_to_string(Path::new(launch_env::CONFIG_FILE))
        .ok()?;
    RunConfig::from_json(&text).ok()
}

/// This process's arguments, from `/proc/self/cmdline` (what `exec` was given).
fn own_command_line() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|bytes| {
            bytes
                .split(|&b| b == 0)
                .filter(|arg| !arg.is_empty())
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect()
        })
        .unwrap_or_default()
}
