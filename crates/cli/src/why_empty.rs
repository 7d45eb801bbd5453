//! Why a launched run left no report or dump: one true reason, from what can be checked once
//! the program has ended (its status, the run directory, the runtime's log, the program file).

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use msmemscope_core::launch_env;
use msmemscope_core::run_dir::RunDir;

/// The reason, as the end of a sentence ("… was written for the target: {reason}").
pub fn reason(run: &RunDir, program: &OsStr, status: &ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        return match signal_name(sig) {
            Some(name) => format!("it was killed by signal {sig} ({name})"),
            None => format!("it was killed by signal {sig}"),
        };
    }
    if deleted(run) {
        return "the run directory was deleted while the program ran".to_string();
    }
    if !runtime_loaded(run) {
        // The log is made in the run directory: on a full disk it may be missing too.
        return disk_full(run).unwrap_or_else(|| not_loaded(program));
    }
    if let Some(error) = last_runtime_error(run) {
        return format!("the runtime could not write it: {error}");
    }
    // A full disk also keeps the runtime's log from saying so: judged from the disk itself.
    if let Some(full) = disk_full(run) {
        return full;
    }
    "it ended without running exit handlers (_exit, or exec into a program without the runtime)"
        .to_string()
}

/// Free space below this on the run directory's file system counts as full: the runtime's
/// next write of a report or a log line would not fit.
const FULL_BELOW: u64 = 64 * 1024;

/// The reason when the file system holding the run directory is full (no space, or no inode
/// left), naming what was kept; `None` otherwise.
fn disk_full(run: &RunDir) -> Option<String> {
    use std::os::fd::AsRawFd;
    let fd = run.fd().ok()?;
    // SAFETY: all-zero bytes are a valid `statvfs`; fstatvfs writes it for a valid descriptor.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor and a valid out-pointer.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // The runtime runs as the program's user: root may use the blocks kept for it.
    let blocks = if root { st.f_bfree } else { st.f_bavail };
    let free = blocks as u64 * st.f_frsize as u64;
    let no_inodes = st.f_files > 0 && st.f_ffree == 0;
    if free >= FULL_BELOW && !no_inodes {
        return None;
    }
    let what = if no_inodes && free >= FULL_BELOW {
        "has no inode left".to_string()
    } else {
        format!("is full ({free} bytes free)")
    };
    Some(format!(
        "the disk holding the run directory {what}: No space left on device; the program's exit          status is kept, and what the runtime wrote before the disk filled stays in the run          directory"
    ))
}

/// Whether the held run directory has no name left (removed, with everything in it).
fn deleted(run: &RunDir) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(fd) = run.fd() else {
        return true;
    };
    // SAFETY: all-zero bytes are a valid `stat`; fstat writes it for a valid descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor and a valid out-pointer.
    unsafe { libc::fstat(fd.as_raw_fd(), &mut st) == 0 && st.st_nlink == 0 }
}

/// The runtime's log files (`runtime_{pid}.log`, made when it begins in a process).
fn runtime_logs(run: &RunDir) -> Vec<PathBuf> {
    let dir = run.resolved().join(launch_env::LOG_DIR);
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("runtime_") && n.ends_with(".log"))
        })
        .collect();
    logs.sort();
    logs
}

fn runtime_loaded(run: &RunDir) -> bool {
    !runtime_logs(run).is_empty()
}

/// The last `[ERROR]` line of the runtime's logs, its message only.
fn last_runtime_error(run: &RunDir) -> Option<String> {
    runtime_logs(run)
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.split_once(" [ERROR] ").map(|(_, m)| m.to_string()))
                .collect::<Vec<_>>()
        })
        .next_back()
}

/// Why the event dump is incomplete, when the runtime said so (a write that failed: a full
/// disk, a file size limit).
pub fn dump_failure(run: &RunDir) -> Option<String> {
    msmemscope_core::events::run_end::dump_failure(&run.resolved())
        .map(|f| format!("since {}: {}", f.when, f.what))
}

/// Why the runtime never began in the program: what the loader does with `LD_PRELOAD` for it.
fn not_loaded(program: &OsStr) -> String {
    let Some(path) = find_program(program) else {
        return "the runtime library was never loaded into it".to_string();
    };
    let shown = path.display();
    if let Ok(meta) = std::fs::metadata(&path) {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let setid = meta.mode() & (libc::S_ISUID | libc::S_ISGID) != 0;
        if setid && (meta.uid() != me || meta.mode() & libc::S_ISGID != 0) {
            return format!(
                "{shown} is setuid/setgid, so the loader ignores LD_PRELOAD for it (secure \
                 execution) and the runtime never ran in it"
            );
        }
    }
    match elf_has_interpreter(&path) {
        Some(false) => format!(
            "{shown} is statically linked: no dynamic loader runs in it, so the runtime library \
             cannot be preloaded (run a dynamically linked build)"
        ),
        _ => "the runtime library was never loaded into it".to_string(),
    }
}

/// `program` as `execvp` finds it.
fn find_program(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(p))
        .find(|candidate| candidate.is_file())
}

/// Whether the ELF file at `path` names a program interpreter (`PT_INTERP`); `None` when it is
/// not a 64-bit little-endian ELF file.
fn elf_has_interpreter(path: &Path) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(header[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes(header[54..56].try_into().ok()?) as usize;
    let phnum = u16::from_le_bytes(header[56..58].try_into().ok()?) as usize;
    if phentsize < 4 || phnum > 4096 {
        return None;
    }
    let mut table = vec![0u8; phentsize * phnum];
    file.seek(SeekFrom::Start(phoff)).ok()?;
    file.read_exact(&mut table).ok()?;
    const PT_INTERP: u32 = 3;
    Some(
        table
            .chunks_exact(phentsize)
            .any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP),
    )
}

pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary is dynamically linked (it has an interpreter); a file that is not ELF
    /// says nothing.
    #[test]
    fn interpreter_of_elf_files() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(elf_has_interpreter(&me), Some(true));
        let text = std::env::temp_dir().join(format!("why-empty-{}", std::process::id()));
        std::fs::write(&text, b"#!/bin/sh\n").unwrap();
        assert_eq!(elf_has_interpreter(&text), None);
        let _ = std::fs::remove_file(&text);
    }
}
