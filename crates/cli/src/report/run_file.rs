//! A file of a run directory read whole (for the page, or a job's summary): a regular file
//! within a size bound, as UTF-8 text. A FIFO or a device in its place must neither block the
//! reader nor fill memory, a file grown past any run's must not be read into memory, and what is
//! wrong is one line naming the file.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest CSV (compare, watch) read whole: far past what a run writes.
pub const MAX_CSV: u64 = 1 << 30;
/// The largest JSON or text file (host-leak sites and overviews, a watch summary).
pub const MAX_TEXT: u64 = 64 << 20;

/// The text of `path`, at most `max` bytes of it.
pub fn read(path: &Path, max: u64) -> Result<String, String> {
    let shown = path.display();
    let not_regular = |kind: std::fs::FileType| {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        format!("{shown}: {what}, not a regular file as a run's files are")
    };
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let too_large = |len: u64| {
        format!("{shown}: {len} bytes, more than the {max} read of one run file: not a run's")
    };
    if meta.len() > max {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{shown}: not UTF-8 text (at byte {})",
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_a_runs_are_one_line() {
        let dir = std::env::temp_dir().join(format!("msmemscope-run-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("a.json");
        std::fs::write(&text, "{}").unwrap();
        assert_eq!(read(&text, 2).unwrap(), "{}");
        assert_eq!(
            read(&text, 1).unwrap_err(),
            format!(
                "{}: 2 bytes, more than the 1 read of one run file: not a run's",
                text.display()
            )
        );
        std::fs::write(&text, b"{\"a\xff\"}").unwrap();
        assert_eq!(
            read(&text, 64).unwrap_err(),
            format!("{}: not UTF-8 text (at byte 3)", text.display())
        );
        let fifo = dir.join("f.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(
            read(&fifo, 64).unwrap_err(),
            format!(
                "{}: a FIFO, not a regular file as a run's files are",
                fifo.display()
            )
        );
        assert!(read(&dir, 64)
            .unwrap_err()
            .ends_with(": a directory, not a regular file as a run's files are"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
