//! The control channel (docs/cli.md#attach): a Unix socket through which `msmemscope --pid PID`
//! drives the running process: `start`, `stop`, `step`, `display config|memory summary|host_leak
//! summary`, `help`, `exit`; served by a thread, `msmemscope_ctrl`, that also reads the signal
//! pipe (see [`signals`]) and keeps the hooks' clock during a host-leak window.
//!
//! The program sees nothing of it: the socket is bound when the run starts, but the thread
//! starts only when it is needed ([`wake`]): when `msmemscope --pid` asks for it (a signal), or
//! when a terminating signal must be taken through the end of the run. glibc lets a process
//! with one thread do what a process with more may not (`fork` from a signal handler, no malloc
//! locks taken), and a thread once made leaves the process multi-threaded for good; so a
//! program nobody attaches to keeps the threads it made itself, `Threads: 1` included.
//!
//! Safety properties: the socket (mode 0600) lives in a per-user directory only its owner can
//! write (see [`socket`]); every peer is checked with `SO_PEERCRED` (same uid or root); frames
//! are versioned and length-checked before anything is allocated for them (see [`frame`]);
//! connections are non-blocking and multiplexed in the thread's one `poll` loop (see
//! [`service`]), each with a whole-request deadline, so a slow or stuck client never holds up
//! another. Commands run one at a time ([`commands`]). The thread runs with every signal
//! blocked and inside the reentrancy guard for its whole life, so nothing it allocates is
//! counted as the program's. Every descriptor it uses is held by identity ([`held`]).
//!
//! Bound at runtime start for launched runs, and at the first `start()`/`config()` of the
//! Python API otherwise (not in every process of a shell that sourced `--load-api-env`).
//! Forked children have no channel (threads do not survive a fork) and never remove the
//! parent's socket.
//!
//! Layer 9, an adapter (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls session, host_leak and the bottom layers, and the other adapters (lifecycle); nothing
//! below calls it.

pub use msmemscope_core::control_frame as frame;
mod commands;
mod conn;
mod held;
mod service;
// Terminating signals end the run (window report, dump analyses) before they take effect;
// the service thread reads their pipe.
pub mod signals;
pub mod socket;
pub mod wake;

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::log;
pub use commands::HELP;
use held::Held;

/// The service thread's name, as the client looks for it in `/proc/PID/task/*/comm`.
pub const THREAD_NAME: &str = "msmemscope_ctrl";
/// How long the exit handler waits for a command in progress (a report being written).
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// This process's control channel: bound once, served by one thread, closed at exit. One
/// static holds it because its entry points are the C ABI, the constructor, a signal handler
/// (`wake`) and the exit handler, none of which is handed a session; the service thread and
/// the commands it runs are handed it.
struct Channel {
    started: AtomicBool,
    service_running: AtomicBool,
    closing: AtomicBool,
    /// The bound socket's path, removed at exit.
    socket_path: Mutex<Option<PathBuf>>,
    /// The listener bound at start, until the service thread takes it.
    listener: Mutex<Option<Held<UnixListener>>>,
    /// Held while a command runs, so the exit handler never closes the window under a command.
    busy: Mutex<()>,
}

static CHANNEL: Channel = Channel::new();

/// Set to `1` to run without the control channel: no socket, no attaching, and terminating
/// signals keep their plain default.
pub use msmemscope_core::control_socket::ENV_NO_CONTROL;

/// Binds the socket once per process and arms [`wake`]; no thread is started here. The caller
/// has registered the exit handler (`lifecycle::ensure_exit_handler`), which calls
/// [`shutdown`]. Failures are logged; the program runs on without the channel.
pub fn start() {
    CHANNEL.start();
}

/// Whether the service thread runs.
pub fn service_running() -> bool {
    CHANNEL.service_running.load(Ordering::Acquire)
}

/// At exit (lifecycle's one exit handler, which every caller of [`start`] has registered):
/// wait for a command in progress, stop serving, remove the socket. Never in a forked child:
/// the socket is the parent's.
pub fn shutdown() {
    CHANNEL.shutdown();
}

/// Starts the service thread, once: from [`wake`], at a point where making a thread is safe.
/// False when it could not start now (the listener's lock taken: tried again later).
fn start_service() -> bool {
    CHANNEL.start_service()
}

impl Channel {
    const fn new() -> Channel {
        Channel {
            started: AtomicBool::new(false),
            service_running: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            socket_path: Mutex::new(None),
            listener: Mutex::new(None),
            busy: Mutex::new(()),
        }
    }

    fn start(&'static self) {
        // Unit tests exercise the C ABI in the test harness: no channel there.
        if cfg!(test)
            || crate::process::is_forked_child()
            || self.started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Some(listener) = self.bind_listener() else {
            return;
        };
        wake::arm();
        // A client that connects wakes the thread too (the kernel sends the wake signal), so a
        // raw client needs no signal of its own.
        wake::signal_on_connect(&*listener.socket, true);
        if let Ok(mut slot) = self.listener.lock() {
            *slot = Some(listener);
        }
        if let Some(path) = self.socket_path() {
            log::info(&format!(
                "control channel bound at {}; its thread starts when `msmemscope --pid` asks",
                path.display()
            ));
        }
    }

    fn start_service(&'static self) -> bool {
        if crate::process::is_forked_child() {
            return true;
        }
        if self.service_running.load(Ordering::Acquire) {
            return true;
        }
        // `try_lock`: this may run in a signal handler whose thread holds the lock.
        let listener = match self.listener.try_lock() {
            Ok(mut slot) => slot.take(),
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().take(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        if self.service_running.swap(true, Ordering::AcqRel) {
            return true;
        }
        // The new thread inherits a fully blocked mask: no signal of the program goes to it.
        let serve = Box::new(move || service::serve(self, listener));
        match crate::raw_thread::spawn(THREAD_NAME, serve) {
            Ok(()) => {
                log::info("control channel: service thread started");
                true
            }
            Err(e) => {
                log::error(&format!("control channel not started: no thread: {e}"));
                warn_not_attachable(&format!("no thread: {e}"));
                self.remove_socket();
                true
            }
        }
    }

    /// Binds this process's socket, or says why not (logged) and returns `None`.
    fn bind_listener(&self) -> Option<Held<UnixListener>> {
        if std::env::var_os(ENV_NO_CONTROL).is_some_and(|v| v == "1") {
            log::info("control channel off (MSMEMSCOPE_NO_CONTROL=1)");
            return None;
        }
        // SAFETY: getpid/geteuid have no preconditions.
        let (pid, uid) = unsafe { (libc::getpid() as u32, libc::geteuid()) };
        let dir = socket::socket_dir(uid, std::env::var_os("XDG_RUNTIME_DIR"));
        let bound = socket::ensure_private_dir(&dir, uid).and_then(|()| {
            socket::remove_stale(&dir, uid);
            let path = dir.join(socket::socket_name(pid));
            socket::bind_private(&path, uid).map(|l| (l, path))
        });
        match bound {
            Ok((listener, path)) => {
                if let Ok(mut slot) = self.socket_path.lock() {
                    *slot = Some(path);
                }
                // Held (high number, identity) here, before the program's code runs: the
                // service thread may start after the program has closed and reused the number.
                let _ = listener.set_nonblocking(true);
                Held::new(listener)
            }
            Err(e) => {
                log::error(&format!("control channel not started: {e}"));
                warn_not_attachable(&e);
                None
            }
        }
    }

    /// The bound socket's path (`None` before binding or once removed).
    fn socket_path(&self) -> Option<PathBuf> {
        self.socket_path.lock().ok().and_then(|p| p.clone())
    }

    /// Whether the process is exiting: no command runs any more.
    fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    fn shutdown(&self) {
        if crate::process::is_forked_child() || !self.started.load(Ordering::Acquire) {
            return;
        }
        self.closing.store(true, Ordering::Release);
        wake::disarm();
        let deadline = Instant::now() + EXIT_WAIT;
        let _busy = loop {
            match self.busy.try_lock() {
                Ok(guard) => break Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => break Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        self.remove_socket();
    }

    fn remove_socket(&self) {
        let path = self.socket_path.lock().ok().and_then(|mut p| p.take());
        if let Some(path) = path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The one line the program's stderr gets when attaching is impossible for a reason other
/// than `MSMEMSCOPE_NO_CONTROL=1` (its socket directory refused, no thread): one `write(2)`,
/// so it is never interleaved with the program's own output.
fn warn_not_attachable(reason: &str) {
    let line = format!(
        "msmemscope: warning: control channel not started, `msmemscope --pid` cannot attach: {}\n",
        reason.replace('\n', " ")
    );
    // SAFETY: writes from a valid buffer of `line.len()` bytes to fd 2 (an error is ignored).
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}
