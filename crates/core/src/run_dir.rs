//! The run directory `{output}/msmemscope_{PID}_{YYYYmmddHHMMSS}/` with `config.json` and
//! `msmemscope_logs/`. Output directories may be shared (`/tmp`), so nothing here follows a
//! symlink it did not make: the output path itself must not be a symlink, the run directory is
//! new (mkdirat fails on anything existing) and is held open from then on; every file of the
//! run is created relative to that descriptor, each directory on the way made with mode 0750 and
//! opened without following a symlink, the file itself created exclusively (mode 0640). A run
//! directory renamed away and replaced by a symlink keeps receiving the run's files.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::config::RunConfig;
use crate::held_fd::{hold, Identity};
use crate::launch_env;

/// Mode of every directory made in (and for) the run directory.
pub const DIR_MODE: libc::mode_t = 0o750;
/// Mode of every file created in the run directory.
pub const FILE_MODE: libc::mode_t = 0o640;

/// The run directory, held open: `path` is what it was created (or opened) as, for messages
/// and for the environment; every file goes through `fd`, a high number checked by identity
/// before each use (held_fd): when the program has closed it and taken the number, `path` is
/// opened again, and used only if it is still the same directory.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    fd: AtomicI32,
    id: Identity,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let fd = *self.fd.get_mut();
        if self.id.holds(fd) {
            // SAFETY: our own descriptor (checked just now), closed once.
            unsafe { libc::close(fd) };
        }
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: the path holds a NUL byte", path.display()))
}

fn os_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Opens `path` as a directory without following a symlink in its last component.
fn open_dir_nofollow(path: &Path) -> std::io::Result<OwnedFd> {
    let c = c_path(path).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path; the returned descriptor is owned by the OwnedFd.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mkdirat(dir, name, 0750)`; Ok(false) when the name exists already.
fn mkdir_at(dir: BorrowedFd<'_>, name: &CString) -> std::io::Result<bool> {
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), DIR_MODE) } == 0 {
        return Ok(true);
    }
    let e = os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// `openat(dir, name, O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC)`.
fn open_dir_at(dir: BorrowedFd<'_>, name: &CString) -> std::io::Result<OwnedFd> {
    // SAFETY: a valid directory descriptor and a NUL-terminated name; the result is owned here.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names of a relative path without `.`, `..` or a root: anything else is refused.
fn names(relative: &Path) -> std::io::Result<Vec<CString>> {
    let mut out = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(name) => out.push(
                CString::new(name.as_bytes())
                    .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?,
            ),
            Component::CurDir => {}
            _ => return Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
    Ok(out)
}

/// `name` as the one component it must be (a file directly in a held directory).
fn single_name(name: &Path) -> std::io::Result<CString> {
    match names(name)?.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    // SAFETY: all-zero bytes are a valid `stat`; fstat writes it for valid descriptors.
    let (mut sa, mut sb): (libc::stat, libc::stat) = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptors and out-pointers.
    let ok = unsafe {
        libc::fstat(a.as_raw_fd(), &mut sa) == 0 && libc::fstat(b.as_raw_fd(), &mut sb) == 0
    };
    ok && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino
}

impl RunDir {
    /// Creates the run directory for `config` in its output path, named after `pid` and the
    /// local time, with `config.json` and the log directory. The output path is made when
    /// missing; a symlink as the output path is refused.
    pub fn create(config: &RunConfig, pid: u32) -> Result<RunDir, String> {
        // Without trailing slashes, which would make the kernel follow a symlink.
        let output: &PathBuf = &config.output_path.components().collect();
        let invalid =
            |why: String| format!("invalid --output-path \"{}\": {why}", output.display());
        match std::fs::symlink_metadata(output) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(invalid("it is a symlink".to_string()))
            }
            Ok(m) if !m.is_dir() => {
                return Err(invalid("it exists and is not a directory".to_string()))
            }
            Ok(_) => {}
            Err(_) => {
                std::fs::create_dir_all(output)
                    .map_err(|e| invalid(format!("cannot create it: {e}")))?;
            }
        }
        let out = match open_dir_nofollow(output) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(invalid("it is a symlink".to_string()))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(invalid("it exists and is not a directory".to_string()))
            }
            Err(e) => return Err(invalid(format!("cannot open it: {e}"))),
        };
        let stamp = local_timestamp();
        let mut name = format!("msmemscope_{pid}_{stamp}");
        let mut attempt = 1;
        loop {
            let c = CString::new(name.as_str()).expect("no NUL in a generated name");
            match mkdir_at(out.as_fd(), &c) {
                Ok(true) => break,
                Ok(false) if attempt < 100 => {
                    attempt += 1;
                    name = format!("msmemscope_{pid}_{stamp}_{attempt}");
                }
                Ok(false) => {
                    return Err(format!(
                        "cannot create run directory {}: it exists",
                        output.join(&name).display()
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "cannot create run directory {}: {e}",
                        output.join(&name).display()
                    ))
                }
            }
        }
        let path = output.join(&name);
        let c = CString::new(name.as_str()).expect("no NUL in a generated name");
        let fd = open_dir_at(out.as_fd(), &c)
            .map_err(|e| format!("cannot open run directory {}: {e}", path.display()))?;
        let dir = RunDir::hold(path, fd);
        dir.ensure_dir(Path::new(launch_env::LOG_DIR))?;
        let mut recorded = config.clone();
        if recorded.distributed.is_none() {
            recorded.distributed = crate::config::Distributed::from_env();
        }
        dir.write_new(
            Path::new(launch_env::CONFIG_FILE),
            recorded.to_json().as_bytes(),
        )?;
        Ok(dir)
    }

    /// Opens an existing run directory by its path (without following a symlink in its last
    /// component).
    pub fn open(path: &Path) -> Result<RunDir, String> {
        let fd = open_dir_nofollow(path)
            .map_err(|e| format!("cannot open run directory {}: {e}", path.display()))?;
        Ok(RunDir::hold(path.to_path_buf(), fd))
    }

    /// Holds `fd` (moved to a high number, its identity remembered). A descriptor the program
    /// closed meanwhile is held as lost: the first use opens the path again.
    fn hold(path: PathBuf, fd: OwnedFd) -> RunDir {
        let (raw, id) = match (Identity::of(fd.as_raw_fd()), hold(fd)) {
            (_, Some((fd, id))) => (fd.into_raw_fd(), id),
            (Some(id), None) => (-1, id),
            (None, None) => (-1, Identity::from_parts(u64::MAX, u64::MAX)),
        };
        RunDir {
            path,
            fd: AtomicI32::new(raw),
            id,
        }
    }

    /// The held descriptor, checked: when the program has closed it (and perhaps reused the
    /// number), the path is opened again and taken only if it is still the same directory.
    fn held(&self) -> std::io::Result<BorrowedFd<'_>> {
        let fd = self.fd.load(Ordering::Acquire);
        if self.id.holds(fd) {
            // SAFETY: our own open descriptor (just checked), never closed while `self` lives.
            return Ok(unsafe { BorrowedFd::borrow_raw(fd) });
        }
        let lost = || {
            std::io::Error::other(format!(
                "the program closed the run directory's descriptor and {} is no longer that \
                 directory",
                self.path.display()
            ))
        };
        let (again, id) =
            hold(open_dir_nofollow(&self.path).map_err(|_| lost())?).ok_or_else(lost)?;
        if id != self.id {
            return Err(lost());
        }
        let raw = again.into_raw_fd();
        // The number we held is the program's now: forgotten, not closed. Another thread that
        // reopened at the same time keeps its own copy open (a descriptor leaked, nothing lost).
        self.fd.store(raw, Ordering::Release);
        // SAFETY: as above, our own descriptor, just opened.
        Ok(unsafe { BorrowedFd::borrow_raw(raw) })
    }

    /// The run directory the launcher passed down as descriptor `fd` (taken over: it is closed
    /// with the returned value, and marked close-on-exec), when it is the directory `path`
    /// names (same st_dev/st_ino); otherwise `path` opened anew (O_DIRECTORY|O_NOFOLLOW). `fd`
    /// is left alone unless it is that directory.
    pub fn inherited(fd: Option<RawFd>, path: &Path) -> Result<RunDir, String> {
        let by_path = RunDir::open(path)?;
        let Some(raw) = fd.filter(|&fd| fd > 2) else {
            return Ok(by_path);
        };
        // SAFETY: F_GETFD only asks whether the number is an open descriptor.
        if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
            return Ok(by_path);
        }
        // SAFETY: checked open just above; borrowed only for the comparison.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        if !by_path.held().is_ok_and(|fd| same_file(fd, borrowed)) {
            return Ok(by_path);
        }
        // SAFETY: FD_CLOEXEC on the descriptor taken over: programs the target execs do not
        // inherit it.
        unsafe { libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: the launcher passed this descriptor to this process alone, for the run
        // directory; it is owned from here (and moved to a high number).
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(RunDir::hold(path.to_path_buf(), fd))
    }

    /// Wraps a descriptor of the run directory (the Python extension's copy of the runtime's).
    pub fn from_fd(path: PathBuf, fd: OwnedFd) -> RunDir {
        RunDir::hold(path, fd)
    }

    /// The path the directory was created or opened as (it may no longer name it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The held descriptor, checked (see `held`).
    pub fn fd(&self) -> std::io::Result<BorrowedFd<'_>> {
        self.held()
    }

    /// A second descriptor of the same directory.
    pub fn try_clone(&self) -> Result<RunDir, String> {
        let fd = self
            .held()
            .and_then(|fd| fd.try_clone_to_owned())
            .map_err(|e| format!("cannot duplicate the run directory's descriptor: {e}"))?;
        Ok(RunDir::hold(self.path.clone(), fd))
    }

    /// The directory `names` lead to from the run directory, each made (0750) when missing
    /// (`create`) and opened without following a symlink.
    fn walk(&self, names: &[CString], create: bool) -> std::io::Result<Option<OwnedFd>> {
        let mut current: Option<OwnedFd> = None;
        for name in names {
            let parent = match current.as_ref() {
                Some(f) => f.as_fd(),
                None => self.held()?,
            };
            if create {
                mkdir_at(parent, name)?;
            }
            current = Some(open_dir_at(parent, name)?);
        }
        Ok(current)
    }

    /// Opens the file at `relative`, its directories made on the way.
    fn open_file(&self, relative: &Path, flags: libc::c_int) -> std::io::Result<File> {
        let mut names = names(relative)?;
        let Some(file) = names.pop() else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let dir = self.walk(&names, true)?;
        let parent = match dir.as_ref() {
            Some(f) => f.as_fd(),
            None => self.held()?,
        };
        // SAFETY: a valid directory descriptor, a NUL-terminated name; the result is owned by
        // the File.
        let fd = unsafe {
            libc::openat(
                parent.as_raw_fd(),
                file.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                FILE_MODE as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(os_error());
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Creates the private file `relative` (0640; its directories 0750 on the way): never an
    /// existing file, never through a symlink. The error keeps its kind (`AlreadyExists`).
    pub fn create_file_io(&self, relative: &Path) -> std::io::Result<File> {
        self.open_file(relative, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)
    }

    /// [`RunDir::create_file_io`] with the error said as a line naming the file.
    pub fn create_file(&self, relative: &Path) -> Result<File, String> {
        self.create_file_io(relative)
            .map_err(|e| format!("cannot create {}: {e}", self.path.join(relative).display()))
    }

    /// Opens `relative` for appending, created (0640) when missing; never through a symlink.
    pub fn append_file(&self, relative: &Path) -> Result<File, String> {
        self.open_file(relative, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND)
            .map_err(|e| {
                format!(
                    "cannot append to {}: {e}",
                    self.path.join(relative).display()
                )
            })
    }

    /// Creates `relative` with `bytes` as its content (see [`RunDir::create_file`]).
    pub fn write_new(&self, relative: &Path, bytes: &[u8]) -> Result<(), String> {
        let mut file = self.create_file(relative)?;
        file.write_all(bytes)
            .map_err(|e| format!("cannot write {}: {e}", self.path.join(relative).display()))
    }

    /// Makes the directory `relative` (and those above it), mode 0750, unless it exists as a
    /// real directory; never through a symlink.
    pub fn ensure_dir(&self, relative: &Path) -> Result<(), String> {
        names(relative)
            .and_then(|names| self.walk(&names, true))
            .map(|_| ())
            .map_err(|e| format!("cannot create {}: {e}", self.path.join(relative).display()))
    }

    /// Opens the existing file `relative` for reading, never through a symlink.
    pub fn open_read(&self, relative: &Path) -> std::io::Result<File> {
        let mut names = names(relative)?;
        let Some(file) = names.pop() else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let dir = self.walk(&names, false)?;
        let parent = match dir.as_ref() {
            Some(f) => f.as_fd(),
            None => self.held()?,
        };
        // SAFETY: a valid directory descriptor, a NUL-terminated name; owned by the File.
        let fd = unsafe {
            libc::openat(
                parent.as_raw_fd(),
                file.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(os_error());
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// The existing directory `relative` below this one, held open the same way (no symlink
    /// followed on the way), named `self.path()/relative` in messages.
    pub fn open_dir(&self, relative: &Path) -> std::io::Result<RunDir> {
        let fd = self
            .walk(&names(relative)?, false)?
            .map_or_else(|| self.held().and_then(|fd| fd.try_clone_to_owned()), Ok)?;
        Ok(RunDir::hold(self.path.join(relative), fd))
    }

    /// Opens the existing regular file `name` of this directory for reading and writing, never
    /// through a symlink.
    pub fn open_read_write(&self, name: &Path) -> std::io::Result<File> {
        let c = single_name(name)?;
        // SAFETY: a valid directory descriptor, a NUL-terminated name; owned by the File.
        let fd = unsafe {
            libc::openat(
                self.held()?.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(os_error());
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(file)
    }

    /// Whether this directory has an entry `name` (a symlink counts, dangling or not).
    pub fn has_entry(&self, name: &Path) -> std::io::Result<bool> {
        let c = single_name(name)?;
        // SAFETY: all-zero bytes are a valid `stat`, written by fstatat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid directory descriptor, a NUL-terminated name, a valid out-pointer.
        let r = unsafe {
            libc::fstatat(
                self.held()?.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        match r {
            0 => Ok(true),
            _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) => Ok(false),
            _ => Err(os_error()),
        }
    }

    /// Gives the complete file `from` its final name `to` in this directory, never replacing
    /// an entry of that name (`AlreadyExists` then): `renameat2(RENAME_NOREPLACE)`, or where
    /// the file system lacks it, a hard link and the removal of `from`.
    pub fn publish(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let (a, b) = (single_name(from)?, single_name(to)?);
        let dir = self.held()?.as_raw_fd();
        // SAFETY: valid directory descriptors and NUL-terminated names.
        if unsafe { libc::renameat2(dir, a.as_ptr(), dir, b.as_ptr(), libc::RENAME_NOREPLACE) } == 0
        {
            return Ok(());
        }
        let e = os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
            return Err(e);
        }
        // SAFETY: as above; linkat without AT_SYMLINK_FOLLOW links `from` itself.
        if unsafe { libc::linkat(dir, a.as_ptr(), dir, b.as_ptr(), 0) } != 0 {
            return Err(os_error());
        }
        self.remove_file(from)
    }

    /// Removes the file `name` of this directory (a symlink itself, never its target).
    pub fn remove_file(&self, name: &Path) -> std::io::Result<()> {
        let c = single_name(name)?;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.held()?.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(os_error());
        }
        Ok(())
    }

    /// The content of the file `relative`, read without following a symlink.
    pub fn read_to_string(&self, relative: &Path) -> std::io::Result<String> {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut self.open_read(relative)?, &mut text)?;
        Ok(text)
    }

    /// A path that reaches the held directory whatever has been renamed since
    /// (`/proc/self/fd/N`), for reading what the run wrote; the creation path without /proc.
    pub fn resolved(&self) -> PathBuf {
        match self.held() {
            Ok(fd) => {
                let proc = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                if proc.exists() {
                    proc
                } else {
                    self.path.clone()
                }
            }
            Err(_) => self.path.clone(),
        }
    }
}

/// Creates `dir` (mode 0750) unless it exists as a real directory; never through a symlink.
pub fn ensure_dir(dir: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(dir) {
                Ok(m) if m.is_dir() => Ok(()),
                _ => Err(format!("{} exists and is not a directory", dir.display())),
            }
        }
        Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
    }
}

/// `YYYYmmddHHMMSS` in local time, as the original msMemScope names its directories and dump files.
pub fn local_timestamp() -> String {
    // SAFETY: time(NULL) and localtime_r with valid out-pointers.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return crate::time_fmt::compact_timestamp(now as u64);
        }
        format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("msmemscope-rundir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn config_in(output: &Path) -> RunConfig {
        RunConfig {
            output_path: output.to_path_buf(),
            ..RunConfig::default()
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn create_makes_the_directory_config_and_logs_privately() {
        let out = scratch("create");
        let dir = RunDir::create(&config_in(&out.join("new/out")), 42).unwrap();
        assert!(dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("msmemscope_42_"));
        assert_eq!(mode(dir.path()), 0o750);
        assert_eq!(mode(&dir.path().join(launch_env::LOG_DIR)), 0o750);
        assert_eq!(mode(&dir.path().join(launch_env::CONFIG_FILE)), 0o640);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_symlink_as_output_path_is_refused() {
        let out = scratch("symlink");
        let target = out.join("target");
        std::fs::create_dir(&target).unwrap();
        let link = out.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for given in [link.clone(), PathBuf::from(format!("{}/", link.display()))] {
            let e = RunDir::create(&config_in(&given), 1).unwrap_err();
            assert!(e.contains("--output-path") && e.contains("symlink"), "{e}");
        }
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn files_are_made_through_the_descriptor_with_private_modes() {
        let out = scratch("files");
        let dir = RunDir::create(&config_in(&out), 7).unwrap();
        dir.write_new(Path::new("a/b/c.txt"), b"x").unwrap();
        assert_eq!(mode(&dir.path().join("a")), 0o750);
        assert_eq!(mode(&dir.path().join("a/b")), 0o750);
        assert_eq!(mode(&dir.path().join("a/b/c.txt")), 0o640);
        // Exclusive: an existing file is never reopened.
        let e = dir.create_file_io(Path::new("a/b/c.txt")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        // Appending creates and then appends.
        for _ in 0..2 {
            dir.append_file(Path::new("logs/l.log"))
                .unwrap()
                .write_all(b"1")
                .unwrap();
        }
        assert_eq!(std::fs::read(dir.path().join("logs/l.log")).unwrap(), b"11");
        assert!(dir.create_file(Path::new("../escape")).is_err());
        assert!(dir.create_file(Path::new("/abs")).is_err());
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn symlinks_inside_are_never_followed() {
        let out = scratch("inside");
        let elsewhere = scratch("inside-target");
        let dir = RunDir::create(&config_in(&out), 8).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("host_leak")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("f"), dir.path().join("f")).unwrap();
        assert!(dir.write_new(Path::new("host_leak/x.txt"), b"x").is_err());
        assert!(dir.write_new(Path::new("f"), b"x").is_err());
        assert!(dir.append_file(Path::new("f")).is_err());
        assert!(dir.ensure_dir(Path::new("host_leak")).is_err());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&out);
        let _ = std::fs::remove_dir_all(&elsewhere);
    }

    #[test]
    fn a_renamed_run_directory_keeps_receiving_the_files() {
        let out = scratch("renamed");
        let elsewhere = scratch("renamed-target");
        let dir = RunDir::create(&config_in(&out), 9).unwrap();
        let moved = out.join("moved");
        std::fs::rename(dir.path(), &moved).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path()).unwrap();
        dir.write_new(Path::new("host_leak/r.txt"), b"r").unwrap();
        assert_eq!(std::fs::read(moved.join("host_leak/r.txt")).unwrap(), b"r");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Reopening by the path refuses the symlink; the held descriptor is still taken.
        assert!(RunDir::open(dir.path()).is_err());
        let _ = std::fs::remove_dir_all(&out);
        let _ = std::fs::remove_dir_all(&elsewhere);
    }

    #[test]
    fn an_inherited_descriptor_is_taken_only_for_the_same_directory() {
        let out = scratch("inherited");
        let dir = RunDir::create(&config_in(&out), 10).unwrap();
        let other = RunDir::create(&config_in(&out), 11).unwrap();
        let copy = dir.fd().unwrap().try_clone_to_owned().unwrap();
        let raw = copy.as_raw_fd();
        std::mem::forget(copy);
        // Another directory's descriptor is left alone: the path is opened.
        let other_raw = other.fd().unwrap().as_raw_fd();
        let taken = RunDir::inherited(Some(other_raw), dir.path()).unwrap();
        assert_ne!(taken.fd().unwrap().as_raw_fd(), other_raw);
        assert!(Identity::of(other_raw).is_some());
        // The launcher's descriptor is taken over: moved to a high number, close-on-exec, the
        // low number closed.
        let taken = RunDir::inherited(Some(raw), dir.path()).unwrap();
        let held = taken.fd().unwrap().as_raw_fd();
        assert!(held >= crate::held_fd::high_floor(), "{held}");
        assert!(same_file(taken.fd().unwrap(), dir.fd().unwrap()));
        // SAFETY: F_GETFD on an open descriptor.
        let flags = unsafe { libc::fcntl(held, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert!(RunDir::inherited(None, dir.path()).is_ok());
        let _ = std::fs::remove_dir_all(&out);
    }

    /// The program closes the held descriptor and opens its own file on the number: the run's
    /// files still go into the run directory, opened again by its path, and the program's file
    /// is untouched; a path that now names another directory is refused.
    #[test]
    fn a_closed_descriptor_is_reopened_only_as_the_same_directory() {
        let out = scratch("reopen");
        let dir = RunDir::create(&config_in(&out), 12).unwrap();
        let number = dir.fd().unwrap().as_raw_fd();
        let theirs = out.join("theirs.txt");
        let file = std::fs::File::create(&theirs).unwrap();
        // SAFETY: the test plays the program, putting its own file on the number we hold.
        assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), number) }, number);
        dir.write_new(Path::new("after.txt"), b"ours").unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("after.txt")).unwrap(),
            b"ours"
        );
        assert_eq!(std::fs::read(&theirs).unwrap(), b"");
        assert_ne!(dir.fd().unwrap().as_raw_fd(), number);

        let number = dir.fd().unwrap().as_raw_fd();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), number) }, number);
        std::fs::rename(dir.path(), out.join("away")).unwrap();
        std::fs::create_dir(dir.path()).unwrap();
        let e = dir.write_new(Path::new("late.txt"), b"x").unwrap_err();
        assert!(e.contains("is no longer that directory"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // SAFETY: the test's own descriptor.
        unsafe { libc::close(number) };
        let _ = std::fs::remove_dir_all(&out);
    }
}
