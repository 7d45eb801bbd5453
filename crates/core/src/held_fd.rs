//! Descriptors the tool holds inside someone else's process. The program may close any number
//! (`close_range(3, ~0U)`, `closefrom`, a loop of `close`, `dup2` over it) and get the same
//! number back for its own file, pipe or socket. So a held descriptor is
//! - moved to a high number (`F_DUPFD_CLOEXEC` from [`high_floor`]), where a program that reopens
//!   after closing everything gets low numbers first, and
//! - remembered by its file's identity (`st_dev`, `st_ino`), checked before every use: a number
//!   that no longer holds the same file is the program's, never read, written or closed by us.
//!   (An inode number is given to a new file only once the old file is gone from the file
//!   system: removed, and closed by everyone.)

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// The file a descriptor refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    /// The identity of what `fd` refers to now (`None`: not an open descriptor).
    pub fn of(fd: RawFd) -> Option<Identity> {
        // SAFETY: all-zero bytes are a valid `stat`; fstat only writes it (async-signal-safe).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: any number may be asked about; a closed one fails with EBADF.
        if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
            return None;
        }
        Some(Identity {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// Whether `fd` still refers to this file. Async-signal-safe.
    pub fn holds(&self, fd: RawFd) -> bool {
        Identity::of(fd) == Some(*self)
    }

    /// The two numbers, for storing in atomics (a signal handler compares them).
    pub fn parts(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    pub fn from_parts(dev: u64, ino: u64) -> Identity {
        Identity { dev, ino }
    }
}

/// The lowest number held descriptors are moved to: well above what a program that has just
/// closed everything reopens, and below the soft descriptor limit.
pub fn high_floor() -> RawFd {
    // SAFETY: all-zero bytes are a valid rlimit; getrlimit writes it.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur.min(1 << 20) as i64
    } else {
        1024
    };
    // 7/8 of the way up a 1024 limit (896): the program keeps the numbers below, and select(),
    // limited to 1024, never needs ours.
    (soft.min(1024) * 7 / 8).max(3) as RawFd
}

/// Takes a descriptor just made: its identity, and the descriptor moved to a high number
/// (close-on-exec; the low number closed). `None` when the program closed the number in the
/// meantime (`close_range` running on another thread): then nothing of it is ours, and the
/// number, perhaps the program's again, is left alone. Where no high number is free the
/// descriptor stays where it is (checked by identity before use like any other).
pub fn hold(fd: OwnedFd) -> Option<(OwnedFd, Identity)> {
    let raw = fd.into_raw_fd();
    let id = Identity::of(raw)?;
    let floor = high_floor();
    // SAFETY: the number was ours a moment ago (identity just read); from here it is owned
    // again only where it is checked to still be that file.
    let keep = |raw| unsafe { OwnedFd::from_raw_fd(raw) };
    if raw >= floor {
        return Some((keep(raw), id));
    }
    // SAFETY: duplicates whatever the number holds; checked below.
    let high = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return id.holds(raw).then(|| (keep(raw), id));
    }
    if id.holds(raw) {
        // SAFETY: still our descriptor (just checked), closed once.
        unsafe { libc::close(raw) };
    }
    // Ours: the duplicate just made (closed on drop should it hold the program's file).
    let high = keep(high);
    id.holds(high.as_raw_fd()).then_some((high, id))
}

/// A file of the run that a writer appends to, held by identity: before each write the
/// descriptor is checked, and a descriptor the program took over is replaced by the same file
/// opened again (`path`, checked to be the same file: never a file put in its place). What
/// cannot be written is an error naming the reason; the program's file is never touched.
#[derive(Debug)]
pub struct HeldFile {
    fd: RawFd,
    id: Identity,
    path: PathBuf,
}

impl HeldFile {
    /// Takes `file` (created at `path`, which names it for messages and reopening).
    pub fn new(file: File, path: &Path) -> std::io::Result<HeldFile> {
        let (fd, id) = hold(OwnedFd::from(file)).ok_or_else(|| lost(path))?;
        Ok(HeldFile {
            fd: fd.into_raw_fd(),
            id,
            path: path.to_path_buf(),
        })
    }

    /// The descriptor, checked; reopened when the program took the number over.
    fn checked(&mut self) -> std::io::Result<RawFd> {
        if self.id.holds(self.fd) {
            return Ok(self.fd);
        }
        // Not ours any more: forgotten, not closed.
        self.fd = -1;
        let c = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes())
            .map_err(std::io::Error::other)?;
        // SAFETY: a NUL-terminated path; O_NONBLOCK so that a FIFO put there cannot block us.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY
                    | libc::O_APPEND
                    | libc::O_NOFOLLOW
                    | libc::O_CLOEXEC
                    | libc::O_NONBLOCK,
            )
        };
        if raw < 0 {
            return Err(lost(&self.path));
        }
        // SAFETY: just opened, owned by nobody else.
        let (fd, id) =
            hold(unsafe { OwnedFd::from_raw_fd(raw) }).ok_or_else(|| lost(&self.path))?;
        if id != self.id {
            return Err(lost(&self.path));
        }
        // SAFETY: clears O_NONBLOCK on our own regular file.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_APPEND) };
        self.fd = fd.into_raw_fd();
        Ok(self.fd)
    }
}

fn lost(path: &Path) -> std::io::Error {
    std::io::Error::other(format!(
        "the program closed the descriptor of {} and it cannot be opened again as the same file",
        path.display()
    ))
}

impl Write for HeldFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let fd = self.checked()?;
        // SAFETY: writes from a valid buffer to our own, checked descriptor.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for HeldFile {
    fn drop(&mut self) {
        if self.fd >= 0 && self.id.holds(self.fd) {
            // SAFETY: our own descriptor (checked just now), closed once.
            unsafe { libc::close(self.fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("msmemscope-held-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A descriptor closed and reused by "the program": the held file notices, opens its own
    /// file again and goes on appending there; the program's file gets nothing.
    #[test]
    fn a_reused_number_is_never_written() {
        let dir = scratch("reuse");
        let ours = dir.join("ours.csv");
        let mut held = HeldFile::new(File::create(&ours).unwrap(), &ours).unwrap();
        assert!(held.fd >= high_floor());
        held.write_all(b"one\n").unwrap();
        let number = held.fd;
        // SAFETY: the test plays the program: closes the number and opens its own file on it.
        unsafe { libc::close(number) };
        let theirs = dir.join("theirs.txt");
        let other = File::create(&theirs).unwrap();
        // SAFETY: as above, moves the program's file onto the number we held.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), number) }, number);
        held.write_all(b"two\n").unwrap();
        drop(held);
        assert_eq!(std::fs::read_to_string(&ours).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "");
        // Our drop did not close the program's descriptor.
        assert!(Identity::of(number).is_some());
        // SAFETY: the test's own descriptor.
        unsafe { libc::close(number) };

        // A file put in our file's place is refused, not written. (Ours stays linked under
        // another name, so the planted file cannot be given its inode number.)
        let mut held = HeldFile::new(File::create(&ours).unwrap(), &ours).unwrap();
        // SAFETY: as above.
        unsafe { libc::close(held.fd) };
        std::fs::rename(&ours, dir.join("ours.moved")).unwrap();
        std::fs::write(&ours, b"planted").unwrap();
        let e = held.write_all(b"x").unwrap_err();
        assert!(e
            .to_string()
            .contains("cannot be opened again as the same file"));
        assert_eq!(std::fs::read_to_string(&ours).unwrap(), "planted");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
