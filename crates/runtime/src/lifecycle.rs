//! Start and end of the runtime inside the target. A launched run begins at the first hooked
//! allocation or at this library's ELF constructor, whichever comes first: the libraries the
//! program links are initialised before a preloaded one, so their constructors allocate before
//! ours runs, and those blocks are the program's too. The constructor then registers the exit
//! handler and starts the attach channel, which need a clean context (not the inside of some
//! library's `malloc` call). Every entry point catches panics: a fault of ours never aborts the
//! program or changes its exit status.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

use msmemscope_core::config::{Follow, JobLink, RunConfig};
use msmemscope_core::launch_env;
use msmemscope_core::run_dir::RunDir;

use crate::guard::Entered;
use crate::host_leak::settings::CapOverrides;
use crate::log;
use crate::session;
use crate::unwind::{capture, modules};

const NOT_BEGUN: u8 = 0;
const BEGINNING: u8 = 1;
const BEGUN: u8 = 2;

/// Whether the launch environment was read (and the run begun): one load on the hooks' path
/// until then.
static BEGIN: AtomicU8 = AtomicU8::new(NOT_BEGUN);

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

extern "C" fn on_load() {
    // Allocations libc makes for us here (environment edits) are not the program's.
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    let _ = catch_unwind(|| {
        crate::forward::init();
        crate::hooks::exec::init();
        if crate::hooks::got::allow_rewrites() {
            // The run began inside an earlier library's constructor: the slots its module scan
            // found are written now, outside any hook.
            modules::refresh(true);
        }
        begin_run();
        if session::origin() == session::Origin::Launched {
            // What the end of the run needs, taken while the program cannot have used it up:
            // descriptors for the report, the main thread's stack bounds.
            crate::spare_fd::take();
            if session::config().host_leaks() {
                capture::prime_this_thread();
            }
            ensure_exit_handler();
            // `msmemscope --pid` can attach to every launched run; the same thread reads the
            // signal pipe.
            crate::signals::prepare();
            crate::control::start();
            crate::signals::install();
        }
    });
}

/// Called by the allocation hooks while no window is open: begins a launched run at the
/// program's first allocation, before this library's constructor. Cheap once begun.
#[inline(always)]
pub fn begin_on_first_allocation() {
    if BEGIN.load(Ordering::Relaxed) == NOT_BEGUN {
        begin_from_hook();
    }
}

#[cold]
#[inline(never)]
fn begin_from_hook() {
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    // Inside the program's allocation: its errno stays as the allocation left it.
    // SAFETY: `__errno_location` returns this thread's errno, always valid to read and write.
    let errno = unsafe { *libc::__errno_location() };
    let _ = catch_unwind(begin_run);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Reads the launcher's configuration and begins the run, once. Registers nothing with libc
/// (it may be running inside an allocation libc makes under one of its own locks).
fn begin_run() {
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

/// Registers the exit and fork handlers once: at start for launched runs, at the first
/// `start()` or sanitizer activation otherwise.
///
/// The exit handler is registered with `__cxa_atexit` and no DSO handle, not with `atexit`:
/// `atexit` ties a handler to the library that calls it, and glibc runs such handlers when it
/// runs that library's destructors, which for a preloaded library come before the destructors
/// of the libraries the program links, whose frees would then be missed. Without a handle, it
/// runs in exit's own order: registered before the loader's destructor pass (which
/// `__libc_start_main` registers after every library's constructor), it runs after it, when
/// every library destructor has freed what it frees.
pub fn ensure_exit_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" {
            fn __cxa_atexit(
                func: extern "C" fn(*mut libc::c_void),
                arg: *mut libc::c_void,
                dso_handle: *mut libc::c_void,
            ) -> libc::c_int;
        }
        // SAFETY: registering plain extern "C" functions with libc; a null DSO handle is what
        // C's `atexit` of a statically linked program passes.
        unsafe {
            libc::pthread_atfork(None, None, Some(session::after_fork_in_child));
            __cxa_atexit(at_exit, std::ptr::null_mut(), std::ptr::null_mut());
        }
    });
}

/// The end of the run, from the exit handler or a terminating signal: no control command runs
/// from here on (one in progress is waited for), then the session finishes.
pub fn finish_run() {
    crate::control::shutdown();
    session::finish();
}

/// How long the exit handler waits for the service thread to end a run for a signal.
const TERMINATING_WAIT_S: u64 = 30;

/// The exit handler (registered by [`ensure_exit_handler`]).
pub extern "C" fn at_exit(_: *mut libc::c_void) {
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(finish_run));
    if crate::signals::is_terminating() {
        // A terminating signal is being taken through the end of the run on the service
        // thread, which then raises it again: the process ends by that signal, as it would
        // have without the tool, not by this exit.
        // Never forever: should the service thread be stuck (behind a lock of a hung
        // program), the signal's default action still happens.
        for _ in 0..TERMINATING_WAIT_S * 10 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        crate::signals::default_of_pending();
    }
}
