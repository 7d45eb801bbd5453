//! Where a process's control socket lives and which directories are safe for it
//! (docs/cli.md#attach), shared by the runtime (which creates and binds) and `msmemscope --pid`
//! (which says why a process has no listener). Only the checks that create nothing live here.
//!
//! The socket is `ctrl_{pid}.sock` in a per-user directory only its owner can write:
//! `$XDG_RUNTIME_DIR/msmemscope/` when that directory is ours, else `/tmp/msmemscope-{uid}/`.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Set to `1` in a program's environment to run it without the control channel (no listener
/// thread, no attaching).
pub const ENV_NO_CONTROL: &str = "MSMEMSCOPE_NO_CONTROL";

/// The signal `msmemscope --pid` sends to a process whose control socket is bound but whose
/// service thread has not started yet: the runtime then starts it (docs/cli.md#attach). A
/// real-time signal the C library leaves to programs, near the top of the range where
/// programs seldom reach.
pub fn wake_signal() -> i32 {
    libc::SIGRTMAX() - 4
}

/// The directory the socket goes in, before it is checked or created.
pub fn socket_dir(uid: u32, xdg_runtime_dir: Option<OsString>) -> PathBuf {
    if let Some(xdg) = xdg_runtime_dir.filter(|x| !x.is_empty()) {
        let xdg = PathBuf::from(xdg);
        let ours = std::fs::metadata(&xdg).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if xdg.is_absolute() && ours {
            return xdg.join("msmemscope");
        }
    }
    PathBuf::from(format!("/tmp/msmemscope-{uid}"))
}

/// The socket's file name for process `pid`.
pub fn socket_name(pid: u32) -> String {
    format!("ctrl_{pid}.sock")
}

/// `Ok` if the existing `dir` is a real directory (not a symlink) owned by `uid` that neither
/// group nor others can write; else the one-line reason, naming `dir`.
pub fn check_private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!("{} is a symlink", dir.display()));
    }
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != uid {
        return Err(format!(
            "{} belongs to uid {}, not to uid {uid}",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {:o})",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn uid() -> u32 {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("msmemscope-ctrl-core-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn refusals_name_the_directory_and_the_reason() {
        let base = scratch("refuse");
        let private = base.join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        check_private_dir(&private, uid()).unwrap();
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            check_private_dir(&open, uid()).unwrap_err(),
            format!(
                "{} is writable by group or others (mode 777)",
                open.display()
            )
        );
        let link = base.join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert_eq!(
            check_private_dir(&link, uid()).unwrap_err(),
            format!("{} is a symlink", link.display())
        );
        assert!(check_private_dir(&private, uid() + 1)
            .unwrap_err()
            .contains("belongs to uid"));
        assert!(check_private_dir(&base.join("none"), uid())
            .unwrap_err()
            .starts_with("cannot inspect"));
        assert_eq!(socket_name(12), "ctrl_12.sock");
        assert_eq!(
            socket_dir(uid(), Some(base.clone().into_os_string())),
            base.join("msmemscope")
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
