//! The service thread's loop: the listener, the clients' connections and the signal pipe in
//! one `poll`, every descriptor checked by identity before it is used.

use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use super::conn::{send_some, Conn};
use super::held::Held;
use super::{frame, signals, socket, Channel};
use crate::{clock, log};

/// Clients connected at once; one more is answered "busy" and closed.
const MAX_CONNECTIONS: usize = 8;

/// Waits for clients, their bytes and the signal pipe in one `poll`, and serves whatever is
/// ready. Connections are non-blocking and multiplexed here, each with a whole-request
/// deadline, so a slow client holds one of [`MAX_CONNECTIONS`] slots and nothing else; a
/// command itself runs to its end on this thread (under the channel's `busy` lock) before the
/// next is read.
pub(super) fn serve(channel: &'static Channel, listener: Option<Held<UnixListener>>) {
    let Some(mut listener) = listener else {
        return serve_signals_only();
    };
    // Served from here on: connections no longer interrupt the program with a signal.
    super::wake::signal_on_connect(&*listener.socket, false);
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
            match rebind(channel, listener) {
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
        if channel.closing() && signal_fd < 0 {
            // Exiting: the socket is gone; only a signal could still have needed this thread.
            return;
        }
        accept_ready(channel, &listener.socket, &mut conns);
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

/// The listening socket made again at its path, after the program closed ours (the old
/// number is the program's now). `None` when it cannot be: then the control channel is gone
/// (said in the log) and only the signal pipe is served.
fn rebind(channel: &Channel, lost: Held<UnixListener>) -> Option<Held<UnixListener>> {
    drop(lost);
    let path = channel.socket_path()?;
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
fn accept_ready(channel: &'static Channel, listener: &UnixListener, conns: &mut Vec<Conn>) {
    for _ in 0..=MAX_CONNECTIONS {
        match listener.accept() {
            Ok((stream, _)) => {
                if channel.closing() {
                    continue;
                }
                if conns.len() >= MAX_CONNECTIONS {
                    let reason = format!(
                        "busy: {MAX_CONNECTIONS} other clients are connected to this process; try again"
                    );
                    let _ = send_some(&stream, &frame::error_frame(0, &reason));
                    continue;
                }
                if let Some(conn) = Conn::accepted(channel, stream) {
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
