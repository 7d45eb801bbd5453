//! The run directory `{output}/msmemscope_{PID}_{YYYYmmddHHMMSS}/` with `config.json` and
//! `msmemscope_logs/`. Output directories may be shared (`/tmp`), so nothing here follows a
//! symlink it did not make: the run directory is new (mkdir fails on anything existing) and
//! files are created exclusively.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::config::RunConfig;
use crate::launch_env;

/// Creates the run directory for `config` in its output path, named after `pid` and the local
/// time, with `config.json` and the log directory.
pub fn create(config: &RunConfig, pid: u32) -> Result<PathBuf, String> {
    let output = &config.output_path;
    if output.exists() && !output.is_dir() {
        return Err(format!(
            "invalid --output-path \"{}\": it exists and is not a directory",
            output.display()
        ));
    }
    std::fs::create_dir_all(output).map_err(|e| {
        format!(
            "invalid --output-path \"{}\": cannot create it: {e}",
            output.display()
        )
    })?;
    let stamp = local_timestamp();
    let mut dir = output.join(format!("msmemscope_{pid}_{stamp}"));
    let mut attempt = 1;
    loop {
        match std::fs::DirBuilder::new().mode(0o750).create(&dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1;
                dir = output.join(format!("msmemscope_{pid}_{stamp}_{attempt}"));
            }
            Err(e) => {
                return Err(format!(
                    "cannot create run directory {}: {e}",
                    dir.display()
                ))
            }
        }
    }
    std::fs::DirBuilder::new()
        .mode(0o750)
        .create(dir.join(launch_env::LOG_DIR))
        .map_err(|e| {
            format!(
                "cannot create {}: {e}",
                dir.join(launch_env::LOG_DIR).display()
            )
        })?;
    write_new(
        &dir.join(launch_env::CONFIG_FILE),
        config.to_json().as_bytes(),
    )?;
    Ok(dir)
}

pub fn write_new(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(bytes)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Creates `dir` (mode 0750) unless it exists as a real directory; never through a symlink.
pub fn ensure_dir(dir: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o750).create(dir) {
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

/// `YYYYmmddHHMMSS` in local time, as the seed names its directories and dump files.
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
