//! The control channel (docs/cli.md#attach): a listener thread, `msmemscope_ctrl`, serves a Unix
//! socket through which `msmemscope --pid PID` drives the running process: `start`, `stop`, `step`,
//! `display config|memory summary|host_leak summary`, `help`, `exit`.
//!
//! Safety properties: the socket (mode 0600) lives in a per-user directory only its owner can
//! write (see [`socket`]); every peer is checked with `SO_PEERCRED` (same uid or root); frames
//! are versioned and length-checked before anything is allocated for them (see [`frame`]);
//! connections are non-blocking and multiplexed in the thread's one `poll` loop (with the
//! signal pipe), each with a whole-request deadline, at most [`MAX_CONNECTIONS`] at once
//! (one more is answered "busy"), so a slow or stuck client never holds up another. Commands
//! run one at a time. The listener runs with every signal blocked (the program's signals keep
//! going to its own threads) and inside the reentrancy guard for its whole life, so nothing it
//! allocates is counted as the program's.
//!
//! Started at runtime start for launched runs, and at the first `start()`/`config()` of the
//! Python API otherwise (not in every process of a shell that sourced `--load-api-env`).
//! Forked children have no listener (threads do not survive a fork) and never remove the
//! parent's socket.
//!
//! Layer 9, an adapter (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls session, host_leak and the bottom layers, and the other adapters (lifecycle); nothing
//! below calls it.

pub use msmemscope_core::control_frame as frame;
// Terminating signals end the run (window report, dump analyses) before they take effect;
// the service thread reads their pipe.
pub mod signals;
pub mod socket;

use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use msmemscope_core::held_fd::{self, Identity};

use crate::host_leak::window;
use crate::session::{self, StartError, Started, Stopped};
use crate::{clock, log, pipeline};
use frame::{HeaderCheck, HEADER_LEN};

/// The listener thread's name, as the client looks for it in `/proc/PID/task/*/comm`.
pub const THREAD_NAME: &str = "msmemscope_ctrl";
/// How long a client has for one whole request (header and payload), counted from its
/// connection or from the end of the previous reply; then it is dropped.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client has to take one whole reply.
const REPLY_DEADLINE: Duration = Duration::from_secs(30);
/// Clients connected at once; one more is answered "busy" and closed.
const MAX_CONNECTIONS: usize = 8;
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
pub use msmemscope_core::control_socket::ENV_NO_CONTROL;

/// Starts the listener once per process; the caller has registered the exit handler
/// (`lifecycle::ensure_exit_handler`), which calls [`shutdown`]. Failures are logged; the program runs on without it.
/// The same thread serves the signal pipe (`signals`). Without a listener (switched off for
/// programs that count their threads, or its socket refused) no thread is added at all, and
/// terminating signals keep their plain default.
pub fn start() {
    // Unit tests exercise the C ABI in the test harness: no listener there.
    if cfg!(test) || crate::process::is_forked_child() || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(listener) = bind_listener() else {
        return;
    };
    // The new thread inherits the blocked mask: no signal of the program is delivered to it.
    match spawn_service(listener) {
        Ok(()) => {
            SERVICE_RUNNING.store(true, Ordering::Release);
            if let Some(path) = SOCKET_PATH.lock().ok().and_then(|p| p.clone()) {
                log::info(&format!("control channel listening on {}", path.display()));
            }
        }
        Err(e) => {
            log::error(&format!("control channel not started: no thread: {e}"));
            warn_not_attachable(&format!("no thread: {e}"));
            remove_socket();
        }
    }
}

/// Whether the service thread runs (so the signal pipe is read).
pub fn signal_service_running() -> bool {
    SERVICE_RUNNING.load(Ordering::Acquire)
}

/// Binds this process's socket, or says why not (logged) and returns `None`.
fn bind_listener() -> Option<Held<UnixListener>> {
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
            // Held (high number, identity) here, before the program's code runs: the service
            // thread may start after the program has closed and reused the number.
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

/// Starts the service thread (raw_thread: no allocation before the guard, no pthread key).
fn spawn_service(listener: Held<UnixListener>) -> std::io::Result<()> {
    crate::raw_thread::spawn(THREAD_NAME, Box::new(move || serve(listener)))
}

/// At exit (lifecycle's one exit handler, which every caller of [`start`] has registered):
/// wait for a command in progress, stop serving, remove the socket. Never in a forked child:
/// the socket is the parent's.
pub fn shutdown() {
    if crate::process::is_forked_child() || !STARTED.load(Ordering::Acquire) {
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

fn remove_socket() {
    let path = SOCKET_PATH.lock().ok().and_then(|mut p| p.take());
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
}

/// Waits for clients, their bytes and the signal pipe in one `poll`, and serves whatever is
/// ready. Connections are non-blocking and multiplexed here, each with a whole-request
/// deadline, so a slow client holds one of [`MAX_CONNECTIONS`] slots and nothing else; a
/// command itself runs to its end on this thread (under [`BUSY`]) before the next is read.
fn serve(mut listener: Held<UnixListener>) {
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CONNECTIONS + 2);
    let mut identities = IdentityChecks::default();
    loop {
        if !identities.due() {
            // A quiet wait while keeping the clock: the same descriptors, checked lately.
            fds.iter_mut().for_each(|p| p.revents = 0);
            let n = poll_all(&mut fds, idle_wait_ms());
            identities.after_wait(n == 0);
            keep_clock(n == 0);
            // Whatever woke it is acted on after the descriptors are checked, at the top.
            continue;
        }
        // The program may have closed any of our descriptors and reused the numbers: what is
        // no longer ours is forgotten (never read, written or closed), the listener and the
        // signal pipe made again.
        conns.retain(|c| c.id.holds(c.stream.as_raw_fd()));
        if !listener.is_ours() {
            match rebind(listener) {
                Some(again) => listener = again,
                None => return serve_signals_only(),
            }
        }
        let signal_fd = signals::service_fd();
        identities.checked();
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: signal_fd,
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(conns.iter().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: c.events(),
            revents: 0,
        }));
        let now = Instant::now();
        let timeout = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            // Rounded up: waking just before a deadline would only poll again.
            .map_or(idle_wait_ms(), |d| {
                d.as_millis().saturating_add(1).min(idle_wait_ms() as u128) as libc::c_int
            });
        let n = poll_all(&mut fds, timeout);
        let quiet = n == 0 && conns.is_empty();
        identities.after_wait(quiet);
        keep_clock(quiet);
        if n < 0 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        // A signal taken while the pipe was not ours is still pending: seen here too.
        signals::on_service_ready(fds[1].revents != 0);
        // The connections' bytes first: a request that came in while a command ran is served
        // even if its deadline passed meanwhile.
        let mut index = 2;
        conns.retain_mut(|c| {
            let revents = fds[index].revents;
            index += 1;
            revents == 0 || c.on_ready()
        });
        let now = Instant::now();
        conns.retain_mut(|c| {
            if c.deadline > now {
                return true;
            }
            // One last look at what arrived since the poll, then the deadline holds.
            if c.out.is_empty() {
                if !c.on_ready() {
                    return false;
                }
                if c.deadline > Instant::now() {
                    return true;
                }
            }
            c.expire();
            false
        });
        if fds[0].revents == 0 {
            continue;
        }
        if CLOSING.load(Ordering::Acquire) && signal_fd < 0 {
            // Exiting: the socket is gone; only a signal could still have needed this thread.
            return;
        }
        accept_ready(&listener.socket, &mut conns);
    }
}

/// How often the service thread looks at its descriptors when nothing else wakes it.
const IDENTITY_CHECK_MS: libc::c_int = 500;

/// How long the service thread waits when nothing is due: while a host-leak window is open it
/// also keeps the hooks' clock (`clock::tick`), which a thread of its own would have added to
/// the program's threads.
fn idle_wait_ms() -> libc::c_int {
    if clock::ticks_wanted() {
        clock::TICK.as_millis() as libc::c_int
    } else {
        IDENTITY_CHECK_MS
    }
}

/// Waits on `fds` (at most `timeout_ms`); what `poll` returned.
fn poll_all(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> libc::c_int {
    // SAFETY: `fds` holds `fds.len()` valid pollfd entries (a negative fd is ignored).
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// When the service thread looks again at whether its descriptors are still its own. While it
/// keeps the hooks' clock it wakes every few milliseconds; those quiet wakes wait again on the
/// same descriptors until [`IDENTITY_CHECK_MS`] has passed since the last look, rather than
/// asking the kernel about each descriptor hundreds of times a second. Any wake with something
/// ready, or with a connection open, is followed by a look before anything is read, written
/// or accepted.
#[derive(Default)]
struct IdentityChecks {
    last: Option<Instant>,
    quiet: bool,
}

impl IdentityChecks {
    fn due(&self) -> bool {
        !self.quiet
            || self
                .last
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(IDENTITY_CHECK_MS as u64))
    }

    fn checked(&mut self) {
        self.last = Some(Instant::now());
    }

    /// After a wait: `quiet` when it ended with nothing ready and nobody connected.
    fn after_wait(&mut self, quiet: bool) {
        self.quiet = quiet;
    }
}

/// After a wait: the hooks' clock is kept only through waits that end with nothing to serve,
/// since serving may hold the thread long (a command runs to its end here).
fn keep_clock(quiet: bool) {
    if quiet {
        clock::tick();
    } else {
        clock::pause_ticks();
    }
}

/// A socket of ours, remembered by identity: a number the program closed and reused is
/// forgotten, never closed.
struct Held<T: AsRawFd + Into<std::os::fd::OwnedFd> + From<std::os::fd::OwnedFd>> {
    socket: std::mem::ManuallyDrop<T>,
    id: Identity,
}

impl<T: AsRawFd + Into<std::os::fd::OwnedFd> + From<std::os::fd::OwnedFd>> Held<T> {
    /// Moves the socket to a high number and remembers it (`None`: the program closed it
    /// meanwhile).
    fn new(socket: T) -> Option<Held<T>> {
        let (fd, id) = held_fd::hold(socket.into())?;
        Some(Held {
            socket: std::mem::ManuallyDrop::new(T::from(fd)),
            id,
        })
    }

    fn is_ours(&self) -> bool {
        self.id.holds(self.socket.as_raw_fd())
    }
}

impl<T: AsRawFd + Into<std::os::fd::OwnedFd> + From<std::os::fd::OwnedFd>> Drop for Held<T> {
    fn drop(&mut self) {
        if self.is_ours() {
            // SAFETY: dropped once, here; the number is ours (checked just now).
            unsafe { std::mem::ManuallyDrop::drop(&mut self.socket) };
        }
    }
}

/// The listening socket made again at its path, after the program closed ours (the old
/// number is the program's now). `None` when it cannot be: then the control channel is gone
/// (said in the log) and only the signal pipe is served.
fn rebind(lost: Held<UnixListener>) -> Option<Held<UnixListener>> {
    drop(lost);
    let path = SOCKET_PATH.lock().ok()?.clone()?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match socket::bind_private(&path, uid) {
        Ok(listener) => {
            let _ = listener.set_nonblocking(true);
            log::info(&format!(
                "the program closed the control socket's descriptor; listening again on {}",
                path.display()
            ));
            Held::new(listener)
        }
        Err(e) => {
            log::error(&format!(
                "the program closed the control socket's descriptor and it cannot be made again: {e}"
            ));
            None
        }
    }
}

/// Without a listener: the signal pipe alone, until the process ends.
fn serve_signals_only() {
    let mut identities = IdentityChecks::default();
    let mut pfd = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }];
    loop {
        if identities.due() {
            pfd[0].fd = signals::service_fd();
            identities.checked();
        }
        pfd[0].revents = 0;
        let n = poll_all(&mut pfd, idle_wait_ms());
        identities.after_wait(n == 0);
        keep_clock(n == 0);
        // The pipe is read only after `on_service_ready` checked it is still ours.
        signals::on_service_ready(pfd[0].revents != 0);
    }
}

/// Accepts the connections waiting (a bounded burst): each gets a slot, or "busy" when all
/// [`MAX_CONNECTIONS`] are taken; while exiting, each is closed at once.
fn accept_ready(listener: &UnixListener, conns: &mut Vec<Conn>) {
    for _ in 0..=MAX_CONNECTIONS {
        match listener.accept() {
            Ok((stream, _)) => {
                if CLOSING.load(Ordering::Acquire) {
                    continue;
                }
                if conns.len() >= MAX_CONNECTIONS {
                    let reason = format!(
                        "busy: {MAX_CONNECTIONS} other clients are connected to this process; try again"
                    );
                    let _ = send_some(&stream, &frame::error_frame(0, &reason));
                    continue;
                }
                if let Some(conn) = Conn::accepted(stream) {
                    conns.push(conn);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Out of descriptors or similar: back off instead of spinning.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
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

/// Sends what the socket takes now of `bytes`, without waiting and without raising SIGPIPE
/// when the client has gone (the signal would stay pending on this thread, which blocks every
/// signal, but `MSG_NOSIGNAL` avoids it altogether). `Ok(n)`: `n` bytes sent, 0 when full.
fn send_some(stream: &UnixStream, bytes: &[u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: sends from a valid buffer of `bytes.len()` bytes on an open socket.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// The payload of the frame being read, once its header passed the check.
enum Payload {
    /// A request: its bytes (`MAX_PAYLOAD` at most), `got` of them read so far.
    Keep { buf: Vec<u8>, got: usize },
    /// A frame of the wrong type: its bytes are skipped, then the reason is answered.
    Skip { left: usize, reason: String },
}

/// One accepted client: the frame it is sending, or the reply it is being sent.
struct Conn {
    stream: std::mem::ManuallyDrop<UnixStream>,
    /// The connection's identity: the program may close the number and reuse it.
    id: Identity,
    /// Reading: the whole request must be in by then (from the connection, or from the end
    /// of the previous reply). Writing: the whole reply must be taken by then.
    deadline: Instant,
    header: [u8; HEADER_LEN],
    header_got: usize,
    /// The header read and checked: its seq and payload.
    payload: Option<(u16, Payload)>,
    /// The reply not sent yet (from `out_pos`); while there is one, nothing is read.
    out: Vec<u8>,
    out_pos: usize,
    /// Close once `out` is sent (a refusal, a fatal frame error, `exit`).
    close_after: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.id.holds(self.stream.as_raw_fd()) {
            // SAFETY: dropped once, here; the number is ours (checked just now).
            unsafe { std::mem::ManuallyDrop::drop(&mut self.stream) };
        }
    }
}

impl Conn {
    /// Checks the peer; `None` when the connection is done with already (refused).
    fn accepted(stream: UnixStream) -> Option<Conn> {
        stream.set_nonblocking(true).ok()?;
        let (stream, id) = held_fd::hold(stream.into())?;
        let stream = UnixStream::from(stream);
        let mut conn = Conn {
            stream: std::mem::ManuallyDrop::new(stream),
            id,
            deadline: Instant::now() + REQUEST_DEADLINE,
            header: [0; HEADER_LEN],
            header_got: 0,
            payload: None,
            out: Vec::new(),
            out_pos: 0,
            close_after: false,
        };
        if let Err(reason) = check_peer(&conn.stream) {
            log::info(&format!("control channel: {reason}"));
            conn.reply(vec![frame::error_frame(0, &reason)], true);
            return conn.flush().then_some(conn);
        }
        Some(conn)
    }

    fn events(&self) -> libc::c_short {
        if self.out.is_empty() {
            libc::POLLIN
        } else {
            libc::POLLOUT
        }
    }

    /// Does what the socket allows now; `false` once the connection is to be closed. A panic
    /// (logged by the hook) closes this connection only.
    fn on_ready(&mut self) -> bool {
        catch_unwind(AssertUnwindSafe(|| {
            if self.out.is_empty() {
                self.read_ready()
            } else {
                self.flush()
            }
        }))
        .unwrap_or(false)
    }

    /// The deadline passed: a client still sending its request is told why before it is
    /// dropped (if its socket takes it now).
    fn expire(&mut self) {
        if self.out.is_empty() {
            let reason = format!(
                "timed out: no whole request within {} s",
                REQUEST_DEADLINE.as_secs()
            );
            log::info(&format!("control channel: a client was dropped: {reason}"));
            let _ = send_some(&self.stream, &frame::error_frame(0, &reason));
        } else {
            log::info("control channel: a client was dropped: it did not take its reply in time");
        }
    }

    /// Queues a reply; nothing more is read until it is sent.
    fn reply(&mut self, frames: Vec<Vec<u8>>, close_after: bool) {
        self.out = frames.concat();
        self.out_pos = 0;
        self.close_after = close_after;
        self.deadline = Instant::now() + REPLY_DEADLINE;
    }

    /// Sends what the socket takes of the reply; once all is sent, the next request's
    /// deadline starts (or the connection ends).
    fn flush(&mut self) -> bool {
        while self.out_pos < self.out.len() {
            match send_some(&self.stream, &self.out[self.out_pos..]) {
                Ok(0) => return true,
                Ok(n) => self.out_pos += n,
                Err(_) => return false,
            }
        }
        self.out = Vec::new();
        self.out_pos = 0;
        self.deadline = Instant::now() + REQUEST_DEADLINE;
        !self.close_after
    }

    /// Reads what has arrived, answering each frame completed; stops when the socket has no
    /// more or a reply is waiting to be sent.
    fn read_ready(&mut self) -> bool {
        let mut skip_buf = [0u8; 4096];
        loop {
            let read = match &mut self.payload {
                None => (&*self.stream).read(&mut self.header[self.header_got..]),
                Some((_, Payload::Keep { buf, got })) => (&*self.stream).read(&mut buf[*got..]),
                Some((_, Payload::Skip { left, .. })) => {
                    let want = (*left).min(skip_buf.len());
                    (&*self.stream).read(&mut skip_buf[..want])
                }
            };
            let n = match read {
                // The connection's end (or its reset) before a whole frame.
                Ok(0) => return false,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            };
            match &mut self.payload {
                None => {
                    self.header_got += n;
                    if self.header_got == HEADER_LEN {
                        self.header_complete();
                    }
                }
                Some((_, Payload::Skip { left, .. })) => *left -= n,
                Some((_, Payload::Keep { got, .. })) => *got += n,
            }
            if self.frame_complete() {
                self.answer();
            }
            if !self.out.is_empty() {
                // Nothing more is read until the reply is sent.
                return self.flush();
            }
        }
    }

    /// Checks the header just read: a fatal error is answered and ends the connection before
    /// anything is allocated for the payload.
    fn header_complete(&mut self) {
        let h = frame::Header::parse(&self.header);
        self.header_got = 0;
        match frame::check_request_header(&h) {
            HeaderCheck::Fatal(reason) => {
                self.reply(vec![frame::error_frame(h.seq, &reason)], true);
            }
            HeaderCheck::WrongType(reason) => {
                // The length is within the limit: skip the payload and go on.
                let left = h.payload_len as usize;
                self.payload = Some((h.seq, Payload::Skip { left, reason }));
            }
            // At most MAX_PAYLOAD bytes: the header check came first.
            HeaderCheck::Request => {
                let buf = vec![0; h.payload_len as usize];
                self.payload = Some((h.seq, Payload::Keep { buf, got: 0 }));
            }
        }
    }

    fn frame_complete(&self) -> bool {
        match &self.payload {
            None => false,
            Some((_, Payload::Skip { left, .. })) => *left == 0,
            Some((_, Payload::Keep { buf, got })) => *got == buf.len(),
        }
    }

    /// Answers the frame just read (running its command): queues the reply.
    fn answer(&mut self) {
        let Some((seq, payload)) = self.payload.take() else {
            return;
        };
        match payload {
            Payload::Skip { reason, .. } => {
                self.reply(vec![frame::error_frame(seq, &reason)], false)
            }
            Payload::Keep { buf, .. } => {
                let (frames, done) = answer_request(seq, &buf);
                self.reply(frames, done);
            }
        }
    }
}

/// The reply frames to one request, and whether the connection ends after them (`exit`).
fn answer_request(seq: u16, payload: &[u8]) -> (Vec<Vec<u8>>, bool) {
    match frame::parse_request(payload) {
        Err(reason) => (vec![frame::error_frame(seq, &reason)], false),
        Ok(command) => {
            let done = command == "exit";
            let frames = match catch_unwind(|| run_command(&command)) {
                Ok(Ok((status, output))) => frame::response_frames(seq, status, &output),
                Ok(Err(reason)) => vec![frame::error_frame(seq, &reason)],
                Err(_) => vec![frame::error_frame(
                    seq,
                    "internal error while running the command (see the runtime log)",
                )],
            };
            (frames, done)
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
    // The run's end (its report, the dump's last rows) happens at exit.
    crate::lifecycle::ensure_exit_handler();
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
