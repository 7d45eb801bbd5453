//! Start and end of the runtime inside the target. A launched run begins at the first hooked
//! allocation or at this library's ELF constructor, whichever comes first: the libraries the
//! program links are initialised before a preloaded one, so their constructors allocate before
//! ours runs, and those blocks are the program's too. The constructor then registers the exit
//! handler and starts the attach channel, which need a clean context (not the inside of some
//! library's `malloc` call). Every entry point catches panics: a fault of ours never aborts the
//! program or changes its exit status.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::guard::Entered;
use crate::session;
use crate::unwind::{capture, modules};

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
        crate::hooks::loader::ride_along();
        crate::hooks::exec::init();
        if crate::hooks::got::allow_rewrites() {
            // The run began inside an earlier library's constructor: the slots its module scan
            // found are written now, outside any hook.
            modules::refresh(true);
        }
        crate::launch::begin_run();
        if session::origin() == session::Origin::Launched {
            // What the end of the run needs, taken while the program cannot have used it up:
            // descriptors for the report, the main thread's stack bounds.
            crate::spare_fd::take();
            if session::config().host_leaks() {
                capture::prime_this_thread();
            }
            ensure_exit_handler();
            // `msmemscope --pid` can attach to every launched run: its socket is bound now, its
            // thread (which also reads the signal pipe) starts when first needed.
            crate::control::signals::prepare();
            crate::control::start();
            crate::control::signals::install();
        }
    });
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
    if crate::control::signals::is_terminating() && !crate::control::service_running() {
        // The run has just been finished here, and no service thread was started to take the
        // signal: its default action, now.
        crate::control::signals::default_of_pending();
    }
    if crate::control::signals::is_terminating() {
        // A terminating signal is being taken through the end of the run on the service
        // thread, which then raises it again: the process ends by that signal, as it would
        // have without the tool, not by this exit.
        // Never forever: should the service thread be stuck (behind a lock of a hung
        // program), the signal's default action still happens.
        for _ in 0..TERMINATING_WAIT_S * 10 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        crate::control::signals::default_of_pending();
    }
}
