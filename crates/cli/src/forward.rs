//! Signals sent to the launcher while the target runs are passed on to the target, so that a
//! batch scheduler or container runtime that signals the launcher stops the program instead of
//! orphaning it.
//!
//! The handler forwards with `kill` itself (async-signal-safe), so no thread or self-pipe is
//! needed: the main thread only waits. It waits with `WNOWAIT` so that the target stays a zombie
//! until forwarding has stopped: a zombie's pid cannot be reused, so a late forward never hits
//! an unrelated process. The handlers are installed before the spawn and a signal that comes
//! before the target exists is kept and passed on once it does; the signals are not blocked
//! meanwhile, because a child inherits the signal mask across `exec`.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// SIGTERM/SIGHUP are always passed on; SIGINT/SIGQUIT only when a process sent them (a
/// terminal's Ctrl-C / Ctrl-\ already reaches the target, which shares our process group).
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT];
const NAMES: [&str; 4] = ["SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT"];

/// This process: a handler running anywhere else runs in a child between fork and exec.
static LAUNCHER: AtomicI32 = AtomicI32::new(0);
/// The target, once spawned; 0 before and after.
static TARGET: AtomicI32 = AtomicI32::new(0);
/// Signals (bit = index in [`FORWARDED`]) that came before the target existed.
static EARLY: AtomicU32 = AtomicU32::new(0);
/// How many of each of [`FORWARDED`] were passed on, for the launcher's log.
static PASSED: [AtomicU32; 4] = [const { AtomicU32::new(0) }; 4];

/// The forwarded signals' handlers while installed; restored on drop.
pub struct Forwarding {
    /// The previous disposition of each signal we took over (ignored ones are left alone).
    saved: Vec<(libc::c_int, libc::sigaction)>,
    started: bool,
}

impl Forwarding {
    /// Installs the handlers; call before spawning.
    pub fn prepare() -> Forwarding {
        LAUNCHER.store(std::process::id() as i32, Ordering::SeqCst);
        TARGET.store(0, Ordering::SeqCst);
        EARLY.store(0, Ordering::SeqCst);
        for n in &PASSED {
            n.store(0, Ordering::Relaxed);
        }
        let mut saved = Vec::with_capacity(FORWARDED.len());
        for sig in FORWARDED {
            // SAFETY: a zeroed sigaction is a valid out-parameter.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: querying the current disposition only.
            unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
            if old.sa_sigaction == libc::SIG_IGN {
                // An ignored signal (nohup, a background job of a non-interactive shell) is
                // inherited as ignored across exec: the target ignores it too, so there is
                // nothing to pass on, and a handler here would undo that inheritance.
                continue;
            }
            // SAFETY: as above.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            // SAFETY: sa_mask is a valid sigset_t inside `action`; the handler only makes
            // async-signal-safe calls. The old disposition is kept for `drop`.
            unsafe {
                libc::sigfillset(&mut action.sa_mask);
                if libc::sigaction(sig, &action, std::ptr::null_mut()) == 0 {
                    saved.push((sig, old));
                }
            }
        }
        Forwarding {
            saved,
            started: false,
        }
    }

    /// Passes signals on to `target` from now on, those that came before it first.
    pub fn start(&mut self, target: u32) {
        let target = target as libc::pid_t;
        with_forwarded_blocked(|| {
            TARGET.store(target, Ordering::SeqCst);
            let early = EARLY.swap(0, Ordering::SeqCst);
            for (i, &sig) in FORWARDED.iter().enumerate() {
                if early & (1 << i) != 0 {
                    pass_on(target, sig);
                }
            }
        });
        self.started = true;
    }

    /// Waits until `target` has ended, leaving it unreaped (`std::process::Child::wait` reaps
    /// it after forwarding has stopped).
    pub fn wait_ended(&self, target: u32) -> std::io::Result<()> {
        loop {
            // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waits for our own child without reaping it (WNOWAIT).
            let rc = unsafe {
                libc::waitid(
                    libc::P_PID,
                    target as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        // A signal that comes from here on acts on the launcher itself, as it would without a
        // target; so does one that came for a target that was never spawned.
        let unsent = with_forwarded_blocked(|| {
            TARGET.store(0, Ordering::SeqCst);
            for (sig, old) in &self.saved {
                // SAFETY: restores the disposition saved in `prepare`.
                unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
            }
            EARLY.swap(0, Ordering::SeqCst)
        });
        if !self.started {
            for (i, &sig) in FORWARDED.iter().enumerate() {
                if unsent & (1 << i) != 0 {
                    // SAFETY: raising a signal in this process with its own disposition back.
                    unsafe { libc::raise(sig) };
                }
            }
        }
    }
}

/// Runs `f` with the forwarded signals blocked on this thread (the launcher's only one), so
/// that the handler never sees a half-made change.
fn with_forwarded_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigemptyset initialises the set before sigaddset and pthread_sigmask read it;
    // the old mask is restored right after `f`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let out = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        out
    }
}

fn pass_on(target: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill is async-signal-safe; `target` is our child, not reaped yet.
    if unsafe { libc::kill(target, sig) } == 0 {
        if let Some(i) = FORWARDED.iter().position(|&s| s == sig) {
            PASSED[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The signals passed on so far, as `SIGTERM x1, SIGINT x2` (empty when none).
pub fn passed_on() -> String {
    let mut parts = Vec::new();
    for (name, n) in NAMES.iter().zip(&PASSED) {
        let n = n.load(Ordering::Relaxed);
        if n > 0 {
            parts.push(format!("{name} x{n}"));
        }
    }
    parts.join(", ")
}

/// Whether a signal the launcher received is passed on to `target`.
fn should_forward(sig: libc::c_int, info: &libc::siginfo_t, target: libc::pid_t) -> bool {
    match sig {
        libc::SIGTERM | libc::SIGHUP => true,
        // si_code <= 0 means kill/sigqueue/tgkill from a process; the terminal driver sends
        // SI_KERNEL (> 0) to the whole foreground group, the target included. si_pid 0 is
        // accepted: it is how a sender outside our pid namespace (a container runtime) shows.
        _ => {
            if info.si_code > 0 {
                return false;
            }
            // SAFETY: si_pid is set for every si_code <= 0.
            let sender = unsafe { info.si_pid() };
            sender != target
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: __errno_location is this thread's errno; kept so the interrupted code sees its
    // own value.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: getpid is async-signal-safe.
    let me = unsafe { libc::getpid() };
    if me != LAUNCHER.load(Ordering::Relaxed) {
        // A child of ours between fork and exec: act as it would without our handler. The
        // signal is blocked inside its handler, so it is delivered once this returns.
        // SAFETY: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    } else {
        let target = TARGET.load(Ordering::SeqCst);
        if target > 0 {
            // SAFETY: the kernel passes a valid siginfo_t with SA_SIGINFO.
            if !info.is_null() && should_forward(sig, unsafe { &*info }, target) {
                pass_on(target, sig);
            }
        } else if let Some(i) = FORWARDED.iter().position(|&s| s == sig) {
            // Before the spawn even a terminal's signal is kept: the target did not get it.
            EARLY.fetch_or(1 << i, Ordering::SeqCst);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}
