//! What every reader of a dump shares: the errors, the row source the analyses pull from,
//! opening an input that must be a regular file, and the ID order rows must keep. A leaf: it
//! imports nothing of the formats.

use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::row::EventRow;

/// The longest row a dump may hold, in bytes: a CSV record with its line ends, or the sum of a
/// SQLite row's values. A real row is at most a few hundred KB: its two stacks hold at most
/// `MAX_STACK_DEPTH` (1000) frames each, a frame line being a path and a symbol. 16 MiB is
/// 8 KiB for each of those 2000 lines, room for long C++ symbols and inlined frames, while a
/// file that is no dump (a multi-GB line) is refused after 16 MiB, and a reader's buffers stay
/// under twice that.
pub const MAX_ROW_BYTES: usize = 16 << 20;

/// Why a dump cannot be read. Every message is one line naming the file, and the row for a bad
/// row.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: no such file")]
    Missing { path: PathBuf },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{path}: not a memscope dump: {reason}")]
    NotADump { path: PathBuf, reason: String },
    /// `line` is the file line for a CSV dump, the row's ID for a SQLite one (its position
    /// when the ID itself is unreadable).
    #[error("{path}:{line}: malformed row: {reason}")]
    BadRow {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    /// `row` counts data rows from 1; `line` is where a CSV row starts.
    #[error(
        "{path}{}: row {row} is longer than {MAX_ROW_BYTES} bytes: not a memscope dump",
        .line.map(|l| format!(":{l}")).unwrap_or_default()
    )]
    RowTooLong {
        path: PathBuf,
        line: Option<u64>,
        row: u64,
    },
}

/// How far a reader has got through its file, readable from another thread (a progress bar).
#[derive(Clone)]
pub struct Progress {
    done: Arc<AtomicU64>,
    total: u64,
}

impl Progress {
    /// `done`: the bytes the reader has handed out rows from, which it keeps current.
    pub(crate) fn new(done: Arc<AtomicU64>, total: u64) -> Progress {
        Progress { done, total }
    }

    pub fn done_bytes(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    pub fn total_bytes(&self) -> u64 {
        self.total
    }
}

/// A dump's rows handed out one at a time, each borrowed until the next: the way the offline
/// analyses read, which keeps nothing of a row they do not need.
pub trait RowSource: Send {
    /// The next row; `None` at the end. After an error the source ends.
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError>;
    /// The row the last [`RowSource::next_row`] returned, while there is one: a merge of
    /// several sources looks at each one's current row.
    fn current(&self) -> Option<&EventRow>;
    /// How far through its file the source is, where it can tell.
    fn progress(&self) -> Option<Progress> {
        None
    }
}

/// How many line ends `file` holds from where it is read on.
pub fn count_line_ends(mut file: impl std::io::Read) -> std::io::Result<u64> {
    let mut lines = 0u64;
    let mut block = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut block) {
            Ok(0) => return Ok(lines),
            Ok(n) => lines += memchr::memchr_iter(b'\n', &block[..n]).count() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A library's message (SQLite's) on one line, as every reader error is: it may quote the
/// damaged bytes it read, line ends and other control characters included.
pub(crate) fn one_line(message: &str) -> String {
    message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

pub(crate) fn io_error(path: &Path, e: &std::io::Error) -> ReadError {
    ReadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

pub(crate) fn not_regular(path: &Path, kind: std::fs::FileType) -> ReadError {
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    ReadError::NotADump {
        path: path.to_path_buf(),
        reason: format!("{what}, not a regular file"),
    }
}

/// Opens `path` for reading if it is a regular file (symlinks followed). Refused before it is
/// opened, as opening a FIFO blocks and opening a device can act on it; checked again on the
/// descriptor in case the path was replaced meanwhile, which `O_NONBLOCK` keeps from blocking.
pub(crate) fn open_regular(path: &Path) -> Result<std::fs::File, ReadError> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::Missing {
            path: path.to_path_buf(),
        },
        _ => io_error(path, &e),
    })?;
    if !meta.is_file() {
        return Err(not_regular(path, meta.file_type()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ReadError::Missing {
                path: path.to_path_buf(),
            },
            _ => io_error(path, &e),
        })?;
    let meta = file.metadata().map_err(|e| io_error(path, &e))?;
    if !meta.is_file() {
        return Err(not_regular(path, meta.file_type()));
    }
    // Linux ignores O_NONBLOCK on regular files, but a network or FUSE file system may not.
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns; F_GETFL/F_SETFL take no pointers.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// Rows must come in strictly ascending ID order, the order the writer numbers them in.
#[derive(Default)]
pub(crate) struct IdOrder(Option<u64>);

impl IdOrder {
    pub(crate) fn check(&mut self, id: u64) -> Result<(), String> {
        match self.0 {
            Some(last) if id == last => Err(format!("ID {id} repeats the previous row's ID")),
            Some(last) if id < last => Err(format!(
                "ID {id} comes after ID {last}: rows must be in ascending ID order"
            )),
            _ => {
                self.0 = Some(id);
                Ok(())
            }
        }
    }
}

/// Whether `e` is about a CSV dump's last row, cut off where the writing stopped (a full disk,
/// the process killed): the file does not end with a line end, and the bad row starts on its
/// last line. Looked at only when a row is refused.
pub fn is_cut_last_row(path: &Path, e: &ReadError) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let ReadError::BadRow { line, .. } = e else {
        return false;
    };
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut last = [0u8; 1];
    if file.seek(SeekFrom::End(-1)).is_err() || file.read_exact(&mut last).is_err() {
        return false;
    }
    if last[0] == b'\n' || file.seek(SeekFrom::Start(0)).is_err() {
        return false;
    }
    count_line_ends(file).is_ok_and(|lines| *line == lines + 1)
}
