//! When the service thread starts. Not at the start of the run: a program with one thread must
//! keep one (glibc skips its malloc locks in `fork` only then, and a thread once made leaves
//! the process multi-threaded for good). It starts when it is needed:
//! - `msmemscope --pid` sends [`wake_signal`] to a process whose socket is bound and has no
//!   thread yet, and any client's connection makes the kernel send it (`O_ASYNC`);
//! - a terminating signal must be taken through the end of the run (`signals`).
//!
//! Both arrive in a signal handler, where making a thread is safe only if the interrupted code
//! holds none of the C library's locks that `pthread_create` takes (the allocator's above all).
//! The handler makes it at once when the interrupted instruction is the program's own code, or
//! the C library waiting in a system call that takes no such lock (sleeping, polling, reading):
//! what an idle program does. Otherwise it is made at the next safe point: the program's next
//! allocation or free (outside the allocator), or a retry of the signal a few milliseconds
//! later from a kernel timer (which adds no thread).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use libc::{c_int, c_void};

use crate::guard::Entered;

pub use msmemscope_core::control_socket::wake_signal;

/// Whether the thread may be started, and by whom: read from the wake signal's handler, so
/// atomics only.
struct Arming {
    /// Whether a socket is bound and the thread may be started.
    armed: AtomicBool,
    /// The process that armed (a forked child inherits the handler, not the channel).
    owner: AtomicI32,
    /// Sends the wake signal again a few milliseconds after a deferred start.
    retry: super::signals::SignalTimer,
}

static ARMING: Arming = Arming {
    armed: AtomicBool::new(false),
    owner: AtomicI32::new(0),
    retry: super::signals::SignalTimer::new(),
};

/// How soon a deferred start is tried again.
const RETRY_NS: libc::c_long = 5_000_000;

/// Code ranges (start, end) kept of each kind.
const RANGES: usize = 8;

/// The code ranges the handler judges the interrupted instruction by: the program's
/// executable, and the C library with the loader. Atomics, since the handler reads them;
/// written once, by `arm`.
struct CodeRanges {
    program: [AtomicUsize; RANGES * 2],
    libc: [AtomicUsize; RANGES * 2],
}

static CODE: CodeRanges = CodeRanges {
    program: [const { AtomicUsize::new(0) }; RANGES * 2],
    libc: [const { AtomicUsize::new(0) }; RANGES * 2],
};

/// Records where the code is, installs the handler of [`wake_signal`] and makes the retry
/// timer. Called once, by `control::start`, in a clean context.
pub fn arm() {
    record_code_ranges();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    ARMING.owner.store(pid, Ordering::Relaxed);
    ARMING.retry.make(wake_signal());
    ARMING.armed.store(true, Ordering::Release);
    let mut act = super::signals::action(
        on_wake as *const () as libc::sighandler_t,
        libc::SA_SIGINFO | libc::SA_RESTART,
    );
    act.sa_flags |= libc::SA_SIGINFO;
    if let Some(real) = super::signals::real_sigaction() {
        // SAFETY: installs a handler that does only async-signal-safe work unless it judged the
        // interrupted code safe for making a thread (see the module's comment).
        unsafe { real(wake_signal(), &act, std::ptr::null_mut()) };
    }
}

/// `fcntl`'s command naming the signal `O_ASYNC` sends (Linux, `<fcntl.h>` with `_GNU_SOURCE`).
const F_SETSIG: c_int = 10;

/// Whether a connection to `listener` makes the kernel send [`wake_signal`] to this process
/// (`O_ASYNC` with `F_SETSIG`): on while no thread serves it.
pub fn signal_on_connect(listener: &impl std::os::fd::AsRawFd, on: bool) {
    let fd = listener.as_raw_fd();
    // SAFETY: fcntl on our own listening socket (held, checked by the caller's identity); the
    // values are valid for each command.
    unsafe {
        if on {
            libc::fcntl(fd, libc::F_SETOWN, libc::getpid());
            libc::fcntl(fd, F_SETSIG, wake_signal());
        }
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            let flags = if on {
                flags | libc::O_ASYNC
            } else {
                flags & !libc::O_ASYNC
            };
            libc::fcntl(fd, libc::F_SETFL, flags);
        }
    }
}

/// At exit: no thread is started any more.
pub fn disarm() {
    ARMING.armed.store(false, Ordering::Release);
    crate::process::clear_safe_point_work();
}

/// Whether the service thread can be started (a socket is bound): the signal pipe will be read.
pub fn armed() -> bool {
    ARMING.armed.load(Ordering::Acquire)
}

/// A start the handler deferred, at the hooks' next safe point (`process::at_safe_point`).
fn start_deferred() {
    // Inside the runtime already (its own allocation): a later point.
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    // SAFETY: __errno_location has no preconditions; the program's errno is kept.
    let errno = unsafe { *libc::__errno_location() };
    if !ours()
        || !ARMING.armed.load(Ordering::Acquire)
        || std::panic::catch_unwind(super::start_service).unwrap_or(true)
    {
        crate::process::clear_safe_point_work();
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether this is the process that armed (not a forked child).
fn ours() -> bool {
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    unsafe { libc::getpid() == ARMING.owner.load(Ordering::Relaxed) }
}

/// From a signal handler: starts the service thread now when the interrupted code allows it,
/// else at the next safe point. `context` is the handler's third argument.
pub fn from_handler(context: *mut c_void) {
    if !ARMING.armed.load(Ordering::Acquire) || !ours() || super::service_running() {
        return;
    }
    if interrupted_is_clean(context) {
        if let Some(_entered) = Entered::try_enter() {
            if std::panic::catch_unwind(super::start_service).unwrap_or(true) {
                crate::process::clear_safe_point_work();
                return;
            }
        }
    }
    crate::process::defer_to_safe_point(start_deferred);
    arm_retry();
}

extern "C" fn on_wake(_sig: c_int, _info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: errno is this thread's; the interrupted code may be reading it.
    let errno = unsafe { *libc::__errno_location() };
    from_handler(context);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether the instruction the signal interrupted is one at which `pthread_create` takes no
/// lock the interrupted code holds: the program's own code, or the C library (or the loader)
/// waiting in a system call that holds none (see [`waiting_call`]).
fn interrupted_is_clean(context: *mut c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if context.is_null() {
            return false;
        }
        // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler.
        let regs = unsafe { &(*(context as *const libc::ucontext_t)).uc_mcontext.gregs };
        let pc = regs[libc::REG_RIP as usize] as usize;
        let rax = regs[libc::REG_RAX as usize];
        if within(&CODE.program, pc) {
            return true;
        }
        within(&CODE.libc, pc) && waiting_call(pc, rax)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = context;
        false
    }
}

/// At `pc` in the C library: a system call that was waiting when the signal came, either
/// about to be restarted (the kernel moved `pc` back onto the `syscall` instruction and put
/// the call's number in `rax`) or returning `EINTR` (`pc` just after it). The calls allowed
/// are waits for outside events, which the allocator and the thread machinery never make
/// while holding a lock; a lock's own wait (`futex` without a timeout) is not among them.
#[cfg(target_arch = "x86_64")]
fn waiting_call(pc: usize, rax: i64) -> bool {
    const SYSCALL: [u8; 2] = [0x0f, 0x05];
    const WAITS: [i64; 20] = [
        0,   // read
        7,   // poll
        23,  // select
        34,  // pause
        35,  // nanosleep
        43,  // accept
        45,  // recvfrom
        47,  // recvmsg
        61,  // wait4
        128, // rt_sigtimedwait
        130, // rt_sigsuspend
        219, // restart_syscall (nanosleep, clock_nanosleep, poll with a timeout)
        230, // clock_nanosleep
        232, // epoll_wait
        247, // waitid
        270, // pselect6
        271, // ppoll
        281, // epoll_pwait
        288, // accept4
        441, // epoll_pwait2
    ];
    // SAFETY: `pc` lies in the C library's mapped code (checked by the caller), and so do the
    // two bytes before it unless it is the mapping's first instruction, which is no syscall
    // return point; code pages stay mapped while the library is loaded.
    let at = unsafe { std::ptr::read_unaligned(pc as *const [u8; 2]) };
    if at == SYSCALL && WAITS.contains(&rax) {
        return true;
    }
    let starts_range = CODE
        .libc
        .chunks(2)
        .any(|r| r[0].load(Ordering::Relaxed) == pc);
    if starts_range {
        return false;
    }
    // SAFETY: as above.
    let before = unsafe { std::ptr::read_unaligned((pc - 2) as *const [u8; 2]) };
    before == SYSCALL && rax == -(libc::EINTR as i64)
}

fn within(ranges: &[AtomicUsize], pc: usize) -> bool {
    ranges.chunks(2).any(|r| {
        let (start, end) = (r[0].load(Ordering::Relaxed), r[1].load(Ordering::Relaxed));
        start <= pc && pc < end
    })
}

/// The executable mappings of the program and of the C library and loader, from
/// `/proc/self/maps`.
fn record_code_ranges() {
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let (mut program, mut libc_n) = (0, 0);
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let path = fields.nth(3).unwrap_or("");
        if !perms.contains('x') || path.is_empty() {
            continue;
        }
        let Some((start, end)) = range.split_once('-').and_then(|(a, b)| {
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or("");
        let slot = if exe.as_deref().is_some_and(|e| e.as_os_str() == path) {
            Some((&CODE.program, &mut program))
        } else if name.starts_with("libc.so")
            || name.starts_with("libc-")
            || name.starts_with("ld-")
        {
            Some((&CODE.libc, &mut libc_n))
        } else {
            None
        };
        if let Some((ranges, n)) = slot {
            if *n < RANGES {
                ranges[*n * 2].store(start, Ordering::Relaxed);
                ranges[*n * 2 + 1].store(end, Ordering::Relaxed);
                *n += 1;
            }
        }
    }
}

/// Sends the wake signal again shortly (async-signal-safe): the handler then looks again at
/// whatever it interrupts.
fn arm_retry() {
    ARMING.retry.arm(0, RETRY_NS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn waits_in_the_c_library_are_told_from_other_calls() {
        record_code_ranges();
        // A `syscall` instruction inside the C library: the one in `syscall(2)` itself.
        let start = libc::syscall as *const () as usize;
        // SAFETY: reads the C library's code, mapped for as long as the test runs.
        let code = unsafe { std::slice::from_raw_parts(start as *const u8, 64) };
        let at = code
            .windows(2)
            .position(|w| w == [0x0f, 0x05])
            .expect("a syscall instruction in syscall()")
            + start;
        assert!(within(&CODE.libc, at), "the C library's code was recorded");
        assert!(waiting_call(at, 232), "epoll_wait, to be restarted");
        assert!(waiting_call(at, 219), "restart_syscall");
        assert!(!waiting_call(at, 202), "futex: a lock's wait");
        assert!(!waiting_call(at, 9), "mmap: the allocator's call");
        assert!(
            waiting_call(at + 2, -(libc::EINTR as i64)),
            "a wait cut by EINTR"
        );
        assert!(!waiting_call(at + 2, 0), "a call that returned");
        assert!(!within(&CODE.program, at));
    }
}
