//! Where the control socket lives and how it is made: `ctrl_{pid}.sock` in a per-user
//! directory only its owner can write (`$XDG_RUNTIME_DIR/msmemscope/` when that directory is
//! ours, else `/tmp/msmemscope-{uid}/`), mode 0700, the socket itself mode 0600.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

pub use msmemscope_core::control_socket::{check_private_dir, socket_dir, socket_name};

/// Creates `dir` (mode 0700) or accepts an existing one only if it is a real directory owned
/// by `uid` that nobody else can write ([`check_private_dir`], which `--pid` shares).
pub fn ensure_private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // The umask may have taken bits away; set exactly 0700.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot set the mode of {}: {e}", dir.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    check_private_dir(dir, uid)
}

/// Removes the sockets of processes that are gone without running their exit handlers
/// (killed, `_exit`, exec into a program without the runtime): `ctrl_{pid}.sock` files that are
/// sockets owned by `uid` and whose pid no longer exists. Looks at a bounded number of entries.
pub fn remove_stale(dir: &Path, uid: u32) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten().take(4096) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("ctrl_"))
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        let ours = std::fs::symlink_metadata(entry.path())
            .is_ok_and(|m| m.file_type().is_socket() && m.uid() == uid);
        if gone && ours {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Binds the listening socket at `path` with mode 0600, first removing a stale socket of the
/// same name (a socket owned by `uid`: an earlier process with this pid, or this process'
/// image before an exec). Anything else at the path is left alone and refused.
pub fn bind_private(path: &Path, uid: u32) -> Result<UnixListener, String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() || meta.uid() != uid {
            return Err(format!(
                "{} exists and is not a socket of ours",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the stale {}: {e}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    // Independent of the umask. The directory is 0700, so nobody else could reach the socket
    // between bind and chmod anyway.
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(path);
        return Err(format!("cannot set the mode of {}: {e}", path.display()));
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("msmemscope-ctrl-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn uid() -> u32 {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn private_dir_and_socket_modes() {
        let base = scratch("modes");
        let dir = base.join("d");
        ensure_private_dir(&dir, uid()).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Existing and fine: accepted again.
        ensure_private_dir(&dir, uid()).unwrap();
        let path = dir.join(socket_name(std::process::id()));
        let first = bind_private(&path, uid()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        drop(first);
        // The stale socket is replaced.
        let _second = bind_private(&path, uid()).unwrap();
        // A regular file at the path is not ours to remove.
        let file = dir.join(socket_name(43));
        std::fs::write(&file, b"x").unwrap();
        assert!(bind_private(&file, uid()).is_err());
        assert!(file.exists());
        // A socket of a pid that does not exist is swept; ours (a live pid) stays.
        let stale = dir.join(socket_name(i32::MAX as u32));
        drop(bind_private(&stale, uid()).unwrap());
        remove_stale(&dir, uid());
        assert!(!stale.exists());
        assert!(path.exists());
        assert!(file.exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn unsafe_dirs_are_refused() {
        let base = scratch("refuse");
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ensure_private_dir(&open, uid())
            .unwrap_err()
            .contains("writable by group or others"));
        let link = base.join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        assert!(ensure_private_dir(&link, uid())
            .unwrap_err()
            .contains("symlink"));
        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(ensure_private_dir(&file, uid())
            .unwrap_err()
            .contains("not a directory"));
        assert!(ensure_private_dir(&open, uid() + 1)
            .unwrap_err()
            .contains("belongs to uid"));
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn directory_choice() {
        assert_eq!(socket_dir(7, None), PathBuf::from("/tmp/msmemscope-7"));
        let base = scratch("xdg");
        assert_eq!(
            socket_dir(uid(), Some(base.clone().into_os_string())),
            base.join("msmemscope")
        );
        // Not ours: the /tmp fallback.
        assert_eq!(
            socket_dir(uid() + 1, Some(base.clone().into_os_string())),
            PathBuf::from(format!("/tmp/msmemscope-{}", uid() + 1))
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
