//! Why a write of the event dump failed, said with its true cause. The sinks' errors are the
//! OS's or SQLite's words ("File too large", "disk I/O error"), which do not say that the program
//! runs under a file size limit (`ulimit -f`) or that the disk is full; readers of the run (the
//! launcher, the offline commands) repeat what is logged here.

use msmemscope_core::run_dir::RunDir;

/// Free bytes below this on the run directory's file system count as a full disk: the next
/// block of rows would not fit.
const FULL_BELOW: u64 = 64 * 1024;

/// `error` (a sink's message) with its cause in front: the file size limit, a full disk, or
/// nothing more when neither applies.
pub fn cause(error: &str, run_dir: &RunDir) -> String {
    // SQLite reports EFBIG and ENOSPC of its own writes as a generic I/O error.
    let generic = error.contains("disk I/O error");
    if let Some(limit) = file_size_limit() {
        if error.contains("os error 27") || error.contains("File too large") || generic {
            return format!(
                "the file size limit the program runs under was reached (ulimit -f, \
                 RLIMIT_FSIZE: {limit} bytes per file): {error}"
            );
        }
    }
    let full = error.contains("os error 28")
        || error.contains("No space left on device")
        || error.contains("database or disk is full")
        || (generic && free_bytes(run_dir).is_some_and(|free| free < FULL_BELOW));
    if full {
        return format!(
            "the disk holding {} is full: {error}",
            run_dir.path().display()
        );
    }
    error.to_string()
}

/// The soft `RLIMIT_FSIZE`, when there is one.
fn file_size_limit() -> Option<u64> {
    // SAFETY: all-zero bytes are a valid `rlimit`; getrlimit writes it.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid resource and out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Bytes free on the run directory's file system (for root, who may use the reserved blocks).
fn free_bytes(run_dir: &RunDir) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let fd = run_dir.fd().ok()?;
    // SAFETY: all-zero bytes are a valid `statvfs`; fstatvfs writes it for a valid descriptor.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor and a valid out-pointer.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    let blocks = if unsafe { libc::geteuid() } == 0 {
        st.f_bfree
    } else {
        st.f_bavail
    };
    Some(blocks as u64 * st.f_frsize as u64)
}
