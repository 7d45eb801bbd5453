//! The memory block watch's native half: checksums and byte dumps of a block of this process's
//! memory, read where it lies (no copy into Python objects), and the run directory the dumps
//! go to. `watch/state.py` decides which blocks and when.
//!
//! Two ways to read a block:
//! - in place (`watch_crc64`, `watch_dump_bytes(checked=False)`): for blocks inside a tensor
//!   storage the caller keeps alive for the call, so the memory is known to be mapped;
//! - checked (`watch_crc64_checked`, `checked=True`): for raw address ranges nothing vouches
//!   for. They are read through `/proc/self/mem`, where an unmapped page is an I/O error instead
//!   of a segmentation fault in the user's program.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use msmemscope_core::run_dir::RunDir;
use msmemscope_core::watch::crc64::{crc64, Crc64};
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;

use crate::require_runtime;

/// Chunk of a checked read: large enough to amortize the syscall, small enough for the stack.
const CHECKED_CHUNK: usize = 64 * 1024;

/// The block `[addr, addr + length)` as a slice.
///
/// # Safety
/// The range must be mapped and readable for the lifetime of the slice.
unsafe fn in_place<'a>(addr: usize, length: usize) -> &'a [u8] {
    if length == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as *const u8, length) }
}

/// Feeds `[addr, addr + length)` to `sink` in chunks read through `/proc/self/mem`. `Ok(false)`:
/// part of the range is not readable memory of this process. (The file is opened per call: an
/// open `/proc/self/mem` keeps reading the process that opened it, even in a forked child.)
fn read_checked(
    addr: usize,
    length: usize,
    mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<bool> {
    let Some(end) = addr.checked_add(length) else {
        return Ok(false);
    };
    if length == 0 {
        return Ok(true);
    }
    let mem = File::open("/proc/self/mem")?;
    let mut buf = vec![0u8; CHECKED_CHUNK.min(length)];
    let mut at = addr;
    while at < end {
        let want = (end - at).min(buf.len());
        match mem.read_at(&mut buf[..want], at as u64) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                sink(&buf[..n])?;
                at += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO (unmapped page) or EFAULT: not readable.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EFAULT)) => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// CRC-64 of `[addr, addr + length)`, read in place. The caller guarantees the range lies in
/// memory that stays allocated during the call (a live tensor storage it holds).
#[pyfunction]
fn watch_crc64(addr: usize, length: usize) -> u64 {
    // SAFETY: the caller's contract above (watch/state.py only passes ranges inside a
    // storage it holds a reference to, and checks the storage still holds them).
    crc64(unsafe { in_place(addr, length) })
}

/// CRC-64 of `[addr, addr + length)` read through `/proc/self/mem`; None when part of the range
/// is not readable memory of this process.
#[pyfunction]
fn watch_crc64_checked(addr: usize, length: usize) -> PyResult<Option<u64>> {
    let mut crc = Crc64::new();
    let readable = read_checked(addr, length, |piece| {
        crc.update(piece);
        Ok(())
    })
    .map_err(|e| PyOSError::new_err(format!("cannot read /proc/self/mem: {e}")))?;
    Ok(readable.then(|| crc.finish()))
}

/// Writes `[addr, addr + length)` to a new file at `path` (never an existing file or a symlink);
/// in place, or `checked` through `/proc/self/mem`. False when a checked range turned out not
/// to be readable (the partial file is removed).
#[pyfunction]
#[pyo3(signature = (path, addr, length, checked = false))]
fn watch_dump_bytes(path: &str, addr: usize, length: usize, checked: bool) -> PyResult<bool> {
    let error = |e: std::io::Error| PyOSError::new_err(format!("cannot write {path}: {e}"));
    // Inside the run directory: created through its held descriptor (a run directory renamed
    // and replaced by a symlink is not followed).
    let held = held_run_dir()?.and_then(|dir| {
        let relative = Path::new(path).strip_prefix(dir.path()).ok()?.to_path_buf();
        Some((dir, relative))
    });
    let mut file = match held {
        Some((dir, relative)) => dir.create_file_io(&relative).map_err(error)?,
        None => OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(error)?,
    };
    if !checked {
        // SAFETY: as in watch_crc64.
        file.write_all(unsafe { in_place(addr, length) })
            .map_err(error)?;
        return Ok(true);
    }
    let readable = read_checked(addr, length, |piece| file.write_all(piece)).map_err(error)?;
    if !readable {
        drop(file);
        let _ = std::fs::remove_file(path);
    }
    Ok(readable)
}

/// The runtime's run directory, held open (a copy of its descriptor), when the runtime exports
/// it; made if this run has none yet.
fn held_run_dir() -> PyResult<Option<RunDir>> {
    let rt = require_runtime()?;
    let Some(get) = rt.run_dir_fd else {
        return Ok(None);
    };
    let path = PathBuf::from(run_dir()?);
    // SAFETY: the runtime's C ABI; no arguments.
    let fd = unsafe { get() };
    if fd < 0 {
        return Err(PyRuntimeError::new_err(
            "msmemscope cannot create its run directory (see msmemscope_logs or stderr)",
        ));
    }
    // SAFETY: a new descriptor the runtime made for this caller alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(Some(RunDir::from_fd(path, fd)))
}

/// Creates the private file `relative` in the run directory (0640, its directories 0750 on the
/// way; never an existing file, never through a symlink) and returns its descriptor, which the
/// caller owns.
#[pyfunction]
fn run_dir_create(relative: &str) -> PyResult<i32> {
    let error = |e: String| PyOSError::new_err(e);
    match held_run_dir()? {
        Some(dir) => Ok(dir
            .create_file(Path::new(relative))
            .map_err(error)?
            .into_raw_fd()),
        None => {
            let path = Path::new(&run_dir()?).join(relative);
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o640)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| error(format!("cannot create {}: {e}", path.display())))?;
            Ok(file.into_raw_fd())
        }
    }
}

/// Makes the directory `relative` in the run directory (0750, with those above it) unless it
/// exists as a real directory; never through a symlink.
#[pyfunction]
fn run_dir_mkdir(relative: &str) -> PyResult<()> {
    let dir = match held_run_dir()? {
        Some(dir) => dir,
        None => RunDir::open(Path::new(&run_dir()?)).map_err(PyOSError::new_err)?,
    };
    dir.ensure_dir(Path::new(relative))
        .map_err(PyOSError::new_err)
}

/// The run directory (created if this run has none yet), where `watch_dump/` goes.
#[pyfunction]
fn run_dir() -> PyResult<String> {
    let rt = require_runtime()?;
    let Some(get) = rt.run_dir else {
        return Err(PyRuntimeError::new_err(
            "the loaded msmemscope runtime library does not export msmemscope_run_dir",
        ));
    };
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `buf` has `buf.len()` writable bytes.
        let n = unsafe { get(buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return Err(PyRuntimeError::new_err(
                "msmemscope cannot create its run directory (see msmemscope_logs or stderr)",
            ));
        }
        let n = n as usize;
        if n <= buf.len() {
            buf.truncate(n);
            return String::from_utf8(buf)
                .map_err(|_| PyRuntimeError::new_err("the run directory's path is not UTF-8"));
        }
        buf = vec![0u8; n];
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(watch_crc64, m)?)?;
    m.add_function(wrap_pyfunction!(watch_crc64_checked, m)?)?;
    m.add_function(wrap_pyfunction!(watch_dump_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(run_dir, m)?)?;
    m.add_function(wrap_pyfunction!(run_dir_create, m)?)?;
    m.add_function(wrap_pyfunction!(run_dir_mkdir, m)?)?;
    Ok(())
}
