//! `execve` and the `exec*` functions a program calls by name (`execv`, `execvp`, `execvpe`;
//! glibc's own calls between them stay inside glibc): before the process image is replaced,
//! the rows still queued for the writer thread reach the dump, which the new image cannot do
//! (Python's `os.execv`, a launcher script that execs the real program). The exec itself is
//! the next definition's, unchanged; a failed exec returns as it would have, and the run goes
//! on. Only the process that owns the run flushes: not a forked child, and never a `vfork`
//! child, which shares the parent's memory until it execs.

use std::panic::catch_unwind;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::Duration;

use libc::{c_char, c_int};

use crate::guard::Entered;

/// The longest an exec waits for the writer.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The process that loaded the runtime (set by its constructor).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Records this process as the run's owner (the runtime's constructor).
pub fn init() {
    // SAFETY: getpid has no preconditions.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// Flushes the pipeline when this is the run's own process.
fn before_exec() {
    // SAFETY: getpid is a plain system call (right in a vfork child too: it answers the child).
    let me = unsafe { libc::getpid() };
    if me != OWNER.load(Ordering::Relaxed) || crate::process::is_forked_child() {
        return;
    }
    let Some(_entered) = Entered::try_enter() else {
        return;
    };
    // SAFETY: this thread's errno, saved and put back: the exec's own errno is what counts.
    let errno = unsafe { *libc::__errno_location() };
    let _ = catch_unwind(|| crate::pipeline::flush(FLUSH_TIMEOUT));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The next definition of `name` (cached in `slot`).
fn next(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let mut f = slot.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: a lookup by a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        slot.store(f, Ordering::Relaxed);
    }
    f
}

fn no_such_function() -> c_int {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// Defines the exported `$name`: flush (see `before_exec`), then the next definition of the
/// same name with the caller's arguments unchanged.
macro_rules! exec_hook {
    ($name:ident, $symbol:literal, ($($arg:ident: $ty:ty),*)) => {
        #[doc = concat!("# Safety\nAs C's `", stringify!($name), "`.")]
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            before_exec();
            match next(&NEXT, $symbol) {
                0 => no_such_function(),
                // SAFETY: the next definition of this very function, with the caller's
                // arguments.
                f => unsafe {
                    std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> c_int>(f)(
                        $($arg),*
                    )
                },
            }
        }
    };
}

exec_hook!(execve, c"execve", (path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execvpe, c"execvpe", (file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execv, c"execv", (path: *const c_char, argv: *const *const c_char));
exec_hook!(execvp, c"execvp", (file: *const c_char, argv: *const *const c_char));
