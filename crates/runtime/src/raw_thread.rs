//! The runtime's own threads, started with `pthread_create` rather than `std::thread`. std
//! runs code of its own before the thread's function: it allocates (its spawn-hook
//! thread-local registers a destructor) where the reentrancy guard could not be held yet, and
//! it takes a pthread key for the thread's handle, which a program that used up all of its
//! keys no longer has (std then aborts the process: "out of TLS keys"). Here the guard is the
//! first thing the thread takes, and no key is needed. Every signal is blocked in the new
//! thread (the program's signals keep going to its own threads), and it is detached.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::guard::Entered;

type Work = Box<dyn FnOnce() + Send + 'static>;

/// Starts `work` on a new thread named `name` (at most 15 bytes).
pub fn spawn(name: &str, work: Work) -> std::io::Result<()> {
    extern "C" fn main(arg: *mut libc::c_void) -> *mut libc::c_void {
        let entered = Entered::try_enter();
        // SAFETY: `arg` is the Box leaked by `spawn` for this thread alone.
        let work = unsafe { Box::from_raw(arg as *mut Work) };
        let _ = catch_unwind(AssertUnwindSafe(move || (*work)()));
        drop(entered);
        std::ptr::null_mut()
    }
    let name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    let arg = Box::into_raw(Box::new(work)) as *mut libc::c_void;
    let mut thread: libc::pthread_t = 0;
    // SAFETY: sigfillset/pthread_sigmask on valid, initialised sets; the old mask is restored.
    // pthread_create gets a valid out-pointer, default attributes, an entry function with the C
    // ABI and an argument it takes ownership of.
    let rc = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let rc = libc::pthread_create(&mut thread, std::ptr::null(), main, arg);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        rc
    };
    if rc != 0 {
        // SAFETY: the thread was not created, so the Box is still ours.
        drop(unsafe { Box::from_raw(arg as *mut Work) });
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `thread` was just created; the name is NUL-terminated.
    unsafe {
        libc::pthread_setname_np(thread, name.as_ptr());
        libc::pthread_detach(thread);
    }
    Ok(())
}
