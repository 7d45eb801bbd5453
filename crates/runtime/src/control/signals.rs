//! Terminating signals in a launched run. SIGTERM, SIGINT and SIGHUP whose action is the
//! default would end the process without its exit handlers, losing the open host-leak window
//! and the event dump's analyses. While the program leaves such a signal at its default, the
//! kernel holds a handler of ours instead: it only writes the signal's number into a pipe. The
//! runtime's service thread (started for it: see `wake`) reads it, runs the end of the run
//! (`session::finish`), then puts the real default back and sends the signal again, so the
//! process ends the way it would have without the tool (same signal, same status).
//!
//! The program never sees our handler: `sigaction` and `signal` are interposed so that asking
//! for the disposition answers "default", and setting the default keeps ours in place (Python
//! does that right before re-raising SIGINT after a KeyboardInterrupt). Any other disposition
//! the program sets goes to the kernel as it asked, and its handler runs, not ours.
//!
//! The pipe's descriptors are held at high numbers and checked by identity (held_fd): the
//! handler writes only into our own pipe (an `fstat` first, async-signal-safe) and records the
//! signal in an atomic either way, and the service thread, which wakes at least every half
//! second, makes the pipe again when the program has closed it, and takes a recorded signal
//! even if its byte never arrived.
//!
//! Without the control channel (`MSMEMSCOPE_NO_CONTROL=1`, or its socket refused) no service
//! thread can be started, so nothing would read the pipe: then the signals keep their plain
//! default.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use msmemscope_core::held_fd::{hold, Identity};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

use libc::{c_int, sighandler_t};

/// The signals handled here (their default action terminates the process).
const HANDLED: [c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// What this process's handling of the [`HANDLED`] signals stands at. Atomics only: the
/// handler and the interposed `sigaction` (which a vfork child may call) read it.
struct Takeover {
    /// Per handled signal: whether the kernel holds our handler in place of the default.
    ours: [AtomicBool; 3],
    /// The signal the handler took, until the service thread takes it (0: none).
    pending: AtomicI32,
    /// Set once a signal is being taken through the end of the run: exit handlers that run
    /// meanwhile wait for the signal instead of ending the process with another status.
    terminating: AtomicBool,
    /// The process whose dispositions are recorded here and whose service thread reads the
    /// pipe. A forked child keeps our handlers (dispositions are inherited) but has no such
    /// thread, and its pipe end is the parent's: there the default runs at once.
    owner_pid: AtomicI32,
}

static TAKEOVER: Takeover = Takeover {
    ours: [const { AtomicBool::new(false) }; 3],
    pending: AtomicI32::new(0),
    terminating: AtomicBool::new(false),
    owner_pid: AtomicI32::new(0),
};

/// The pipe the handler writes into and the service thread reads. Atomics only: the handler
/// reads it, so no lock may guard it.
struct SelfPipe {
    /// Read end, write end (-1 until installed).
    read: AtomicI32,
    write: AtomicI32,
    /// The write end between `prepare` and `install`.
    write_pending: AtomicI32,
    /// The pipe's identity (both ends share one inode).
    dev: AtomicU64,
    ino: AtomicU64,
}

static PIPE: SelfPipe = SelfPipe {
    read: AtomicI32::new(-1),
    write: AtomicI32::new(-1),
    write_pending: AtomicI32::new(-1),
    dev: AtomicU64::new(u64::MAX),
    ino: AtomicU64::new(u64::MAX),
};

/// libc's `sigaction`, found once (ours is interposed over it).
static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);

pub(super) type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

fn index_of(sig: c_int) -> Option<usize> {
    HANDLED.iter().position(|&s| s == sig)
}

pub(super) fn real_sigaction() -> Option<SigactionFn> {
    let mut addr = REAL_SIGACTION.load(Ordering::Relaxed);
    if addr == 0 {
        // SAFETY: RTLD_NEXT lookup of a libc symbol by a NUL-terminated name.
        addr = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) } as usize;
        REAL_SIGACTION.store(addr, Ordering::Relaxed);
    }
    // SAFETY: a non-null result of dlsym("sigaction") is libc's sigaction.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, SigactionFn>(addr) })
}

/// A zeroed `sigaction` with `handler` and an empty mask.
pub(super) fn action(handler: sighandler_t, flags: c_int) -> libc::sigaction {
    // SAFETY: sigaction is plain data; all-zero is a valid value, completed below.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    // SAFETY: a valid sigset_t to empty.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    act
}

/// Makes the pipe the handler writes into; its read end is for the service thread that
/// `control` starts. Called once, from the constructor of a launched run, before `install`.
pub fn prepare() {
    make_deadline_timers();
    if let Some((read, write)) = PIPE.make() {
        PIPE.read.store(read, Ordering::Release);
        PIPE.write_pending.store(write, Ordering::Release);
    }
}

impl SelfPipe {
    /// A new non-blocking pipe at high numbers, its identity recorded: (read end, write end).
    fn make(&self) -> Option<(i32, i32)> {
        let mut fds = [-1; 2];
        // SAFETY: a valid out-array of two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return None;
        }
        // SAFETY: both ends were just made and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let ((read, id), (write, _)) = (hold(read)?, hold(write)?);
        let (dev, ino) = id.parts();
        self.dev.store(dev, Ordering::Release);
        self.ino.store(ino, Ordering::Release);
        Some((read.into_raw_fd(), write.into_raw_fd()))
    }

    /// Whether `fd` is our pipe (async-signal-safe).
    fn holds(&self, fd: i32) -> bool {
        let id = Identity::from_parts(
            self.dev.load(Ordering::Acquire),
            self.ino.load(Ordering::Acquire),
        );
        fd >= 0 && id.holds(fd)
    }

    /// The read end, for the service thread's poll (-1: none). When the program has closed
    /// either end (and perhaps reused the number), a new pipe takes its place; the old numbers
    /// are the program's and are left alone.
    fn service_fd(&self) -> i32 {
        let read = self.read.load(Ordering::Acquire);
        if read < 0 {
            return -1;
        }
        let write = self.write.load(Ordering::Acquire);
        if self.holds(read) && (write < 0 || self.holds(write)) {
            return read;
        }
        // An end the program left open stays open (a descriptor leaked; never one of the
        // program's closed).
        let Some((read, write)) = self.make() else {
            self.read.store(-1, Ordering::Release);
            return -1;
        };
        self.read.store(read, Ordering::Release);
        if self.write.load(Ordering::Acquire) >= 0 {
            self.write.store(write, Ordering::Release);
        } else {
            self.write_pending.store(write, Ordering::Release);
        }
        crate::log::info(
            "the program closed the signal pipe's descriptors; a new pipe took their place",
        );
        read
    }
}

/// The pipe's read end, for the service thread's poll (-1: none); made again when the program
/// closed it.
pub fn service_fd() -> i32 {
    PIPE.service_fd()
}

/// Puts our handler in place of each handled signal's default, once the service thread can
/// be started to read the pipe (else the signals keep their default: nobody would end the run
/// for them).
pub fn install() {
    let write_end = PIPE.write_pending.load(Ordering::Acquire);
    let Some(real) = real_sigaction().filter(|_| write_end >= 0) else {
        return;
    };
    if !super::wake::armed() {
        return;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    TAKEOVER.owner_pid.store(pid, Ordering::Relaxed);
    PIPE.write.store(write_end, Ordering::Release);
    for (i, &sig) in HANDLED.iter().enumerate() {
        // SAFETY: sigaction is plain data; filled by the query below.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query of the current disposition into a valid out-struct.
        let queried = unsafe { real(sig, std::ptr::null(), &mut old) } == 0;
        if queried && old.sa_sigaction == libc::SIG_DFL {
            take_over(real, i, sig);
        }
        // Otherwise the program (or a library's constructor) chose already: left as it is.
    }
}

fn take_over(real: SigactionFn, i: usize, sig: c_int) -> bool {
    let ours = action(
        on_signal as *const () as sighandler_t,
        libc::SA_RESTART | libc::SA_SIGINFO,
    );
    // SAFETY: installing a handler that only does async-signal-safe work.
    let ok = unsafe { real(sig, &ours, std::ptr::null_mut()) } == 0;
    TAKEOVER.ours[i].store(ok, Ordering::Release);
    ok
}

extern "C" fn on_signal(sig: c_int, _info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // Only async-signal-safe calls here.
    let fd = PIPE.write.load(Ordering::Acquire);
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    if fd < 0 || unsafe { libc::getpid() } != TAKEOVER.owner_pid.load(Ordering::Relaxed) {
        default_now(sig);
        return;
    }
    if TAKEOVER.pending.load(Ordering::Acquire) != 0 {
        // A second terminating signal while the first is taken through the end of the run
        // (which may be stuck behind a lock of a hung program): its default, now.
        default_now(sig);
        return;
    }
    TAKEOVER.terminating.store(true, Ordering::Release);
    if TAKEOVER
        .pending
        .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        if let Some(i) = index_of(sig) {
            arm_deadline(i);
        }
    }
    let byte = sig as u8;
    // SAFETY: fstat, then one byte from a valid buffer into our pipe (a number the program
    // took over gets nothing: the service thread sees the pending signal within half a
    // second); errno is saved and restored, since the interrupted code may be reading it.
    unsafe {
        let errno = *libc::__errno_location();
        if PIPE.holds(fd) {
            libc::write(fd, (&byte as *const u8).cast(), 1);
        }
        // The thread that reads the pipe, started now if this point allows it.
        super::wake::from_handler(context);
        *libc::__errno_location() = errno;
    }
}

/// The default action of `sig`, now (async-signal-safe).
fn default_now(sig: c_int) {
    if let Some(i) = index_of(sig) {
        TAKEOVER.ours[i].store(false, Ordering::Release);
    }
    let dfl = action(libc::SIG_DFL, 0);
    if let Some(real) = real_sigaction() {
        // SAFETY: restoring the default disposition, then raising the signal it handles.
        unsafe {
            real(sig, &dfl, std::ptr::null_mut());
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
    }
}

/// Called by the service thread after each wait (`readable`: the pipe woke it): when the
/// handler took a signal, ends the run, then lets the signal take its default course.
pub fn on_service_ready(readable: bool) {
    let fd = PIPE.read.load(Ordering::Acquire);
    if readable && PIPE.holds(fd) {
        let mut bytes = [0u8; 16];
        // SAFETY: reads into a valid buffer from our own (checked) non-blocking pipe.
        unsafe { libc::read(fd, bytes.as_mut_ptr().cast(), bytes.len()) };
    }
    let sig = TAKEOVER.pending.load(Ordering::Acquire);
    if sig == 0 || index_of(sig).is_none() {
        return;
    }
    TAKEOVER.terminating.store(true, Ordering::Release);
    // Ending the run holds this thread, the keeper of the hooks' clock, for a while.
    crate::clock::pause_ticks();
    let _ = std::panic::catch_unwind(crate::lifecycle::finish_run);
    crate::log::info(&format!(
        "signal {sig}: run finished, default action follows"
    ));
    default_now(sig);
}

/// How long the end of the run may take once a terminating signal came, before the signal's
/// default action happens anyway (`MSMEMSCOPE_SIGNAL_DEADLINE_S`, 1 to 3600; 60 by default): a
/// hung program (a fork deadlocked on glibc's malloc locks, say) may hold a lock the report
/// needs, and must still end when it is told to.
fn deadline_seconds() -> i64 {
    std::env::var(ENV_SIGNAL_DEADLINE)
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .unwrap_or(60)
}

/// The variable that sets [`deadline_seconds`].
pub const ENV_SIGNAL_DEADLINE: &str = "MSMEMSCOPE_SIGNAL_DEADLINE_S";

/// Per handled signal: a one-shot timer (made in `prepare`, armed by the handler with the
/// async-signal-safe `timer_settime`) that sends the signal again after the deadline: our
/// handler, seeing the signal pending already, takes its default action at once, on whichever
/// thread it lands. Nothing on the way allocates or waits for the service thread, which a hung
/// program may keep from running. In the order of `HANDLED`.
static DEADLINES: Deadlines = Deadlines {
    timers: [const { SignalTimer::new() }; 3],
    seconds: AtomicI64::new(60),
};

struct Deadlines {
    timers: [SignalTimer; 3],
    /// [`deadline_seconds`], read once in `prepare`: the handler cannot read the environment.
    seconds: AtomicI64,
}

fn make_deadline_timers() {
    DEADLINES
        .seconds
        .store(deadline_seconds(), Ordering::Relaxed);
    for (timer, &sig) in DEADLINES.timers.iter().zip(HANDLED.iter()) {
        timer.make(sig);
    }
}

/// A one-shot kernel timer that sends a signal to the process (`SIGEV_SIGNAL`: no thread),
/// armed from a signal handler as well.
pub(super) struct SignalTimer(AtomicUsize);

impl SignalTimer {
    /// Timer ids may be 0: none made is `usize::MAX`.
    const NONE: usize = usize::MAX;

    pub(super) const fn new() -> Self {
        SignalTimer(AtomicUsize::new(Self::NONE))
    }

    /// Makes the timer, sending `sig` (called once, in a clean context).
    pub(super) fn make(&self, sig: c_int) {
        // SAFETY: sigevent is plain data; zero is a valid start, filled below.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_SIGNAL;
        event.sigev_signo = sig;
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid pointers to our sigevent and timer id.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) } == 0 {
            self.0.store(timer as usize, Ordering::Release);
        }
    }

    /// Fires once after `seconds` and `nanos` (async-signal-safe); nothing if never made.
    pub(super) fn arm(&self, seconds: libc::time_t, nanos: libc::c_long) {
        let timer = self.0.load(Ordering::Acquire);
        if timer == Self::NONE {
            return;
        }
        let when = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: seconds,
                tv_nsec: nanos,
            },
        };
        // SAFETY: our timer, a valid itimerspec; timer_settime is async-signal-safe.
        unsafe { libc::timer_settime(timer as libc::timer_t, 0, &when, std::ptr::null_mut()) };
    }
}

/// Arms the deadline of signal number `i` (async-signal-safe).
fn arm_deadline(i: usize) {
    DEADLINES.timers[i].arm(DEADLINES.seconds.load(Ordering::Relaxed), 0);
}

/// The pending terminating signal's default action, now: for an exit handler that waited long
/// enough for the service thread to take it.
pub fn default_of_pending() {
    let sig = TAKEOVER.pending.load(Ordering::Acquire);
    if sig != 0 {
        default_now(sig);
    }
}

/// Whether a terminating signal is being taken through the end of the run.
pub fn is_terminating() -> bool {
    TAKEOVER.terminating.load(Ordering::Acquire)
}

/// `sigaction` as the program sees it: our handler reads as the default it stands for.
///
/// # Safety
/// As C's `sigaction`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    oldact: *mut libc::sigaction,
) -> c_int {
    let Some(real) = real_sigaction() else {
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    let Some(i) = index_of(sig).filter(|_| PIPE.write.load(Ordering::Acquire) >= 0) else {
        // SAFETY: the caller's arguments, as it passed them.
        return unsafe { real(sig, act, oldact) };
    };
    // SAFETY: getpid has no preconditions (a system call: right in a vfork child too).
    if unsafe { libc::getpid() } != TAKEOVER.owner_pid.load(Ordering::Relaxed) {
        // A vfork child (posix_spawn, Python's subprocess) runs in this memory until it execs:
        // its dispositions are its own, so it must not change what this process records.
        // SAFETY: the caller's arguments, as it passed them.
        let rc = unsafe { real(sig, act, oldact) };
        if rc == 0 && !oldact.is_null() {
            // SAFETY: the caller's out-struct, just filled.
            let old = unsafe { &mut *oldact };
            if old.sa_sigaction == on_signal as *const () as sighandler_t {
                *old = action(libc::SIG_DFL, 0);
            }
        }
        return rc;
    }
    let ours_now = TAKEOVER.ours[i].load(Ordering::Acquire);
    let mut previous: libc::sigaction = action(libc::SIG_DFL, 0);
    if !ours_now {
        // SAFETY: a query into a valid out-struct.
        if unsafe { real(sig, std::ptr::null(), &mut previous) } != 0 {
            return -1;
        }
    }
    if !act.is_null() {
        // SAFETY: the caller passes a valid action when it passes one.
        let wanted = unsafe { &*act };
        let wants_default =
            wanted.sa_sigaction == libc::SIG_DFL && wanted.sa_flags & libc::SA_SIGINFO == 0;
        if wants_default {
            if !ours_now && !take_over(real, i, sig) {
                // SAFETY: as the caller asked.
                return unsafe { real(sig, act, std::ptr::null_mut()) };
            }
        } else {
            // SAFETY: as the caller asked.
            if unsafe { real(sig, act, std::ptr::null_mut()) } != 0 {
                return -1;
            }
            TAKEOVER.ours[i].store(false, Ordering::Release);
        }
    }
    if !oldact.is_null() {
        // SAFETY: the caller's out-struct is valid when non-null.
        unsafe { *oldact = previous };
    }
    0
}

/// `signal` goes through [`sigaction`] (glibc's own `signal` calls its internal sigaction,
/// which interposing `sigaction` does not reach). BSD semantics, as glibc's: SA_RESTART.
///
/// # Safety
/// As C's `signal`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
    let mut act = action(handler, libc::SA_RESTART);
    // SAFETY: a valid sigset_t; an invalid signal number is refused by sigaction below.
    unsafe { libc::sigaddset(&mut act.sa_mask, sig) };
    let mut old = action(libc::SIG_DFL, 0);
    // SAFETY: valid action and out-struct.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
