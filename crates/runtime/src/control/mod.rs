//! The control channel (SPEC §9): a listener thread, `msmemscope_ctrl`, serves a Unix socket
//! through which `msmemscope --pid PID` drives the running process: `start`, `stop`, `step`,
//! `display config|memory summary|host_leak summary`, `help`, `exit`.
//!
//! Safety properties: the socket (mode 0600) lives in a per-user directory only its owner can
//! write (see [`socket`]); every peer is checked with `SO_PEERCRED` (same uid or root); frames
//! are versioned and length-checked before anything is allocated for them (see [`frame`]);
//! reads and writes time out, so a stuck client never holds the listener. The listener runs
//! with every signal blocked (the program's signals keep going to its own threads) and inside
//! the reentrancy guard for its whole life, so nothing it allocates is counted as the
//! program's. One client is served at a time.
//!
//! Started at runtime start for launched runs, and at the first `start()`/`config()` of the
//! Python API otherwise (not in every process of a shell that sourced `--load-api-env`).
//! Forked children have no listener (threads do not survive a fork) and never remove the
//! parent's socket.

pub use msmemscope_core::control_frame as frame;
pub mod socket;

use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::guard::Entered;
use crate::host_leak::window;
use crate::session::{self, StartError, Started, Stopped};
use crate::{log, pipeline};
use frame::{HeaderCheck, HEADER_LEN};

/// The listener thread's name, as the client looks for it in `/proc/PID/task/*/comm`.
pub const THREAD_NAME: &str = "msmemscope_ctrl";
/// How long a read or write on an accepted connection may wait.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the exit handler waits for a command in progress (a report being written).
const EXIT_WAIT: Duration = Duration::from_secs(30);

static STARTED: AtomicBool = AtomicBool::new(false);
static SERVICE_RUNNING: AtomicBool = AtomicBool::new(false);
static CLOSING: AtomicBool = AtomicBool::new(false);
/// The bound socket's path, removed at exit.
static SOCKET_PATH: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Held while a command runs, so the exit handler never closes the window under a command.
static BUSY: Mutex<()> = Mutex::new(());

pub const HELP: &str = "\
start                      open a host-leak window (host-leak runs) or start the event trace
stop                       close the host-leak window and write its report, or stop the trace
step                       start the next step (as the Python API's step())
display config             the active configuration (JSON)
display memory summary     VmRSS/VmHWM/VmSize, live blocks of the open window, tracing state
display host_leak summary  interim snapshot of the open host-leak window (it stays open)
help                       this list
exit                       end the session";

/// Set to `1` to run without the control channel: no listener thread, no attaching. For
/// programs whose behaviour depends on their own thread count.
pub const ENV_NO_CONTROL: &str = "MSMEMSCOPE_NO_CONTROL";

/// Starts the listener once per process. Failures are logged; the program runs on without it.
/// The same thread serves the signal pipe (`signals`). Without a listener (switched off for
/// programs that count their threads, or its socket refused) no thread is added at all, and
/// terminating signals keep their plain default.
pub fn start() {
    // Unit tests exercise the C ABI in the test harness: no listener there.
    if cfg!(test) || crate::session::is_forked_child() || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(listener) = bind_listener() else {
        return;
    };
    // The new thread inherits the blocked mask: no signal of the program is delivered to it.
    match with_signals_blocked(|| spawn_service(listener)) {
        Ok(()) => {
            SERVICE_RUNNING.store(true, Ordering::Release);
            if let Some(path) = SOCKET_PATH.lock().ok().and_then(|p| p.clone()) {
                log::info(&format!("control channel listening on {}", path.display()));
            }
        }
        Err(e) => {
            log::error(&format!("control channel not started: no thread: {e}"));
            remove_socket();
        }
    }
}

/// Whether the service thread runs (so the signal pipe is read).
pub fn signal_service_running() -> bool {
    SERVICE_RUNNING.load(Ordering::Acquire)
}

/// Binds this process's socket, or says why not (logged) and returns `None`.
fn bind_listener() -> Option<UnixListener> {
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
            if let Ok(mut slot) = SOCKET_PATH.lock() {
                *slot = Some(path);
            }
            // SAFETY: registering a plain extern "C" function with libc.
            unsafe { libc::atexit(at_exit) };
            Some(listener)
        }
        Err(e) => {
            log::error(&format!("control channel not started: {e}"));
            None
        }
    }
}

/// Starts the service thread with `pthread_create` rather than `std::thread`: std runs code
/// that allocates (its spawn-hook thread-local registers a destructor) before the thread's own
/// function, where the reentrancy guard could not be held yet, so that allocation would be
/// counted as the program's. Here the guard is the first thing the thread takes.
fn spawn_service(listener: UnixListener) -> std::io::Result<()> {
    extern "C" fn service_main(arg: *mut libc::c_void) -> *mut libc::c_void {
        let entered = Entered::try_enter();
        // SAFETY: `arg` is the Box leaked by spawn_service for this thread alone.
        let listener = unsafe { Box::from_raw(arg as *mut UnixListener) };
        let _ = catch_unwind(AssertUnwindSafe(|| serve(*listener)));
        drop(entered);
        std::ptr::null_mut()
    }
    let arg = Box::into_raw(Box::new(listener)) as *mut libc::c_void;
    let mut thread: libc::pthread_t = 0;
    // SAFETY: a valid out-pointer, default attributes, an entry function with the C ABI and
    // an argument it takes ownership of.
    let rc = unsafe { libc::pthread_create(&mut thread, std::ptr::null(), service_main, arg) };
    if rc != 0 {
        // SAFETY: the thread was not created, so the Box is still ours.
        drop(unsafe { Box::from_raw(arg as *mut UnixListener) });
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    let name = std::ffi::CString::new(THREAD_NAME).expect("no NUL in the name");
    // SAFETY: `thread` was just created; the name is NUL-terminated and at most 15 bytes.
    unsafe {
        libc::pthread_setname_np(thread, name.as_ptr());
        libc::pthread_detach(thread);
    }
    Ok(())
}

/// At exit: wait for a command in progress, stop serving, remove the socket. Never in a
/// forked child: the socket is the parent's.
pub fn shutdown() {
    if crate::session::is_forked_child() || !STARTED.load(Ordering::Acquire) {
        return;
    }
    CLOSING.store(true, Ordering::Release);
    let deadline = Instant::now() + EXIT_WAIT;
    let _busy = loop {
        match BUSY.try_lock() {
            Ok(guard) => break Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => break Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(std::sync::TryLockError::WouldBlock) => break None,
        }
    };
    remove_socket();
}

extern "C" fn at_exit() {
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    shutdown();
}

fn remove_socket() {
    let path = SOCKET_PATH.lock().ok().and_then(|mut p| p.take());
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
}

fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigfillset/pthread_sigmask on valid, initialised sets; the old mask is restored.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let result = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        result
    }
}

/// Waits for a client on the socket and for the signal pipe, and serves whichever is ready.
fn serve(listener: UnixListener) {
    let signal_fd = crate::signals::service_fd();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: signal_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries (a negative fd is ignored by poll).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        if fds[1].revents != 0 {
            crate::signals::on_service_ready();
        }
        if fds[0].revents == 0 {
            continue;
        }
        if CLOSING.load(Ordering::Acquire) {
            // Exiting: the socket is gone; only a signal can still need this thread.
            if signal_fd < 0 {
                return;
            }
            let _ = listener.accept();
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                // A panic is logged by the hook and ends this connection only.
                let _ = catch_unwind(AssertUnwindSafe(|| serve_connection(stream)));
            }
            // Out of descriptors or similar: back off instead of spinning.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// `Err(reason)` unless the peer is the same user or root.
fn check_peer(stream: &UnixStream) -> Result<(), String> {
    let Ok((_, uid)) = frame::peer_credentials(stream.as_raw_fd()) else {
        return Err("permission denied: cannot read the peer's credentials".to_string());
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if uid == me || uid == 0 {
        Ok(())
    } else {
        Err(format!(
            "permission denied: uid {uid} may not attach to a process of uid {me}"
        ))
    }
}

/// Writes all of `bytes` without raising SIGPIPE when the client has gone (the signal would
/// stay pending on this thread, which blocks every signal, but `send` avoids it altogether).
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: sends from a valid buffer of `bytes.len()` bytes on an open socket.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn serve_connection(mut stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    if let Err(reason) = check_peer(&stream) {
        log::info(&format!("control channel: {reason}"));
        let _ = send_all(&stream, &frame::error_frame(0, &reason));
        return;
    }
    loop {
        let mut header = [0u8; HEADER_LEN];
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let h = frame::Header::parse(&header);
        match frame::check_request_header(&h) {
            HeaderCheck::Fatal(reason) => {
                let _ = send_all(&stream, &frame::error_frame(h.seq, &reason));
                return;
            }
            HeaderCheck::WrongType(reason) => {
                // The length is within the limit: skip the payload and go on.
                let mut skip = (&mut stream).take(h.payload_len as u64);
                if std::io::copy(&mut skip, &mut std::io::sink()).ok() != Some(h.payload_len as u64)
                {
                    return;
                }
                if send_all(&stream, &frame::error_frame(h.seq, &reason)).is_err() {
                    return;
                }
                continue;
            }
            HeaderCheck::Request => {}
        }
        // At most MAX_PAYLOAD bytes: the header check came first.
        let mut payload = vec![0u8; h.payload_len as usize];
        if stream.read_exact(&mut payload).is_err() {
            return;
        }
        let mut done = false;
        let frames = match frame::parse_request(&payload) {
            Err(reason) => vec![frame::error_frame(h.seq, &reason)],
            Ok(command) => {
                done = command == "exit";
                match catch_unwind(|| run_command(&command)) {
                    Ok(Ok((status, output))) => frame::response_frames(h.seq, status, &output),
                    Ok(Err(reason)) => vec![frame::error_frame(h.seq, &reason)],
                    Err(_) => vec![frame::error_frame(
                        h.seq,
                        "internal error while running the command (see the runtime log)",
                    )],
                }
            }
        };
        for f in frames {
            if send_all(&stream, &f).is_err() {
                return;
            }
        }
        if done {
            return;
        }
    }
}

/// Runs one command word: `Ok((status, output))`, or `Err` for a word that does not exist.
fn run_command(command: &str) -> Result<(i32, String), String> {
    if CLOSING.load(Ordering::Acquire) {
        return Err("the process is exiting".to_string());
    }
    let _busy = BUSY.lock().unwrap_or_else(|e| e.into_inner());
    if CLOSING.load(Ordering::Acquire) {
        return Err("the process is exiting".to_string());
    }
    Ok(match command {
        "help" => (0, HELP.to_string()),
        "exit" => (0, "bye".to_string()),
        "start" => start_recording(),
        "stop" => stop_recording(),
        "step" => {
            session::step();
            (0, "next step started".to_string())
        }
        "display config" => (0, session::config().to_json()),
        "display memory summary" => (0, memory_summary()),
        "display host_leak summary" => match window::snapshot() {
            Some(text) => (0, text),
            None => (1, "no active window".to_string()),
        },
        other => {
            return Err(format!(
                "unknown command \"{other}\"; `help` lists the words"
            ))
        }
    })
}

/// `start`: what the Python API's `start()` does; in a launched host-leak run, a new window
/// with the run's settings.
fn start_recording() -> (i32, String) {
    match session::start() {
        Ok(Started::Window(stage)) => (0, format!("host-leak window {stage} opened")),
        Ok(Started::Trace) => (0, "event trace started".to_string()),
        Err(StartError::WindowOpen(stage)) => {
            (1, format!("host-leak window {stage} is already open"))
        }
        Err(StartError::NoHostHooks) => (
            1,
            "host-leak analysis needs the runtime library preloaded (source msmemscope --load-api-env=host)"
                .to_string(),
        ),
        Err(StartError::NoRunDir(e)) => (1, format!("start failed: {e}")),
        Err(StartError::ForkedChild) => (1, "a forked child records nothing".to_string()),
    }
}

/// `stop`: closes the open window (its report is written) or stops the event trace.
fn stop_recording() -> (i32, String) {
    match session::stop() {
        Ok(Stopped::Window(stage, Some(path))) => (
            0,
            format!("host-leak window {stage} closed: {}", path.display()),
        ),
        Ok(Stopped::Window(stage, None)) => (
            1,
            format!("host-leak window {stage}: no report written (see the runtime log)"),
        ),
        Ok(Stopped::Trace) => (0, "event trace stopped".to_string()),
        Ok(Stopped::Nothing) => (
            1,
            "nothing to stop: no active window and no event trace".to_string(),
        ),
        Err(e) => (1, format!("cannot close the host-leak window: {e}")),
    }
}

fn memory_summary() -> String {
    let mut out = String::new();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for key in ["VmRSS:", "VmHWM:", "VmSize:"] {
        if let Some(line) = status.lines().find(|l| l.starts_with(key)) {
            let value = line[key.len()..].trim();
            out.push_str(&format!("{key:<8}{value}\n"));
        }
    }
    if let Some(ledger) = window::active() {
        let (live, unread) = ledger.live_now(Instant::now() + window::SNAPSHOT_DEADLINE);
        out.push_str(&format!(
            "host-leak window {}: {} live blocks, {} bytes tracked{}\n",
            ledger.stage,
            live.count,
            live.bytes,
            if unread > 0 {
                format!(" ({unread} ledger shard(s) busy, not counted)")
            } else {
                String::new()
            }
        ));
    } else {
        out.push_str("host-leak window: none open\n");
    }
    out.push_str(if pipeline::is_tracing() {
        "tracing: on"
    } else {
        "tracing: off"
    });
    out
}
