//! Reading a dump back, row by row: the offline analyses stream their input, so memory grows
//! with what an analysis keeps (live blocks), never with the file.
//!
//! Every offline consumer (the analyses, `--compare`, `report`, `export`) reads through here,
//! so what makes a dump usable is checked here once, not by each consumer: the input is a
//! regular file (a FIFO or a device would block or never end), no row is longer than
//! [`MAX_ROW_BYTES`], every field parses, the Attr values the analyses count with
//! ([`NUMERIC_ATTRS`]) are 64-bit integers, and IDs ascend strictly (a repeated or reordered
//! row would be counted twice or out of time order). The iterators stop after their first
//! error.

use std::io::BufRead;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::csv::HEADER;
use super::row::{AttrNumbers, DeviceId, Event, EventRow, EventType};

/// The longest row a dump may hold, in bytes: a CSV record with its line ends, or the sum of a
/// SQLite row's values. A real row is at most a few hundred KB: its two stacks hold at most
/// `MAX_STACK_DEPTH` (1000) frames each, a frame line being a path and a symbol. 16 MiB is
/// 8 KiB for each of those 2000 lines, room for long C++ symbols and inlined frames, while a
/// file that is no dump (a multi-GB line) is refused after 16 MiB, and a reader's buffers stay
/// under twice that.
pub const MAX_ROW_BYTES: usize = 16 << 20;

/// The Attr keys the analyses read as numbers (`EventRow::attr_u64`): byte counts and ids. A
/// value that is not an integer from 0 to `u64::MAX` would read as absent, which the analyses
/// take as 0, so such a row is refused instead.
pub const NUMERIC_ATTRS: [&str; 8] = [
    "size",
    "used",
    "total",
    "allocated",
    "free",
    "req_size",
    "allocation_id",
    "range_id",
];

/// The index of `key` in [`NUMERIC_ATTRS`].
pub(crate) fn numeric_attr_index(key: &str) -> Option<usize> {
    numeric_attr_index_of(key.as_bytes())
}

/// [`numeric_attr_index`] of a key's bytes (a match: found by length, then compared once).
pub(crate) fn numeric_attr_index_of(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"size" => 0,
        b"used" => 1,
        b"total" => 2,
        b"allocated" => 3,
        b"free" => 4,
        b"req_size" => 5,
        b"allocation_id" => 6,
        b"range_id" => 7,
        _ => return None,
    })
}

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

/// The rows of a dump file (`.csv` or `.db`), in file order.
pub fn open(
    path: &Path,
) -> Result<Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>, ReadError> {
    if let Some(rewritten) = super::original::normalize_if_original(path)? {
        return Ok(Box::new(Rewritten {
            inner: CsvRows::open(&rewritten.csv)?,
            _file: rewritten,
        }));
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") => Ok(Box::new(DbRows::open(path)?)),
        Some("parquet") => Ok(Box::new(super::parquet::ParquetRows::open(path)?)),
        _ => Ok(Box::new(CutTail {
            inner: CsvRows::open(path)?,
            path: path.to_path_buf(),
            ended: false,
        })),
    }
}

/// Whether `e` is about a CSV dump's last row, cut off where the writing stopped (a full disk,
/// the process killed): the file does not end with a line end, and the bad row starts on its
/// last line. Looked at only when a row is refused.
fn is_cut_last_row(path: &Path, e: &ReadError) -> bool {
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

fn warn_cut_last_row(e: &ReadError) {
    if let ReadError::BadRow { path, line, .. } = e {
        eprintln!(
            "msmemscope: warning: {}:{line}: the last row is cut off (the writing stopped inside \
             it: a full disk, or the process killed); it is left out, the rows before it are read",
            path.display()
        );
    }
}

/// A CSV reader that ends, with one warning, at a cut-off last row instead of refusing the
/// file.
struct CutTail<R> {
    inner: R,
    path: PathBuf,
    ended: bool,
}

impl Iterator for CutTail<CsvRows> {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        match self.inner.next()? {
            Err(e) if is_cut_last_row(&self.path, &e) => {
                warn_cut_last_row(&e);
                self.ended = true;
                None
            }
            other => Some(other),
        }
    }
}

impl<R: RowSource> RowSource for CutTail<R> {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        if self.ended {
            return Ok(None);
        }
        if let Err(e) = self.inner.next_row() {
            if is_cut_last_row(&self.path, &e) {
                warn_cut_last_row(&e);
                self.ended = true;
                return Ok(None);
            }
            return Err(e);
        }
        Ok(self.inner.current())
    }

    fn current(&self) -> Option<&EventRow> {
        if self.ended {
            return None;
        }
        self.inner.current()
    }

    fn progress(&self) -> Option<super::scan::Progress> {
        self.inner.progress()
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
    fn progress(&self) -> Option<super::scan::Progress> {
        None
    }
}

/// The rows of a dump file (`.csv`, `.db` or `.parquet`), in file order, through the fastest
/// reader for its format: CSV dumps are parsed on worker threads ([`super::scan`]).
pub fn open_rows(path: &Path) -> Result<Box<dyn RowSource>, ReadError> {
    if let Some(rewritten) = super::original::normalize_if_original(path)? {
        return Ok(Box::new(Rewritten {
            inner: super::scan::FastCsv::open(&rewritten.csv)?,
            _file: rewritten,
        }));
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") | Some("parquet") => Ok(Box::new(Owned {
            rows: open(path)?,
            row: None,
        })),
        _ => Ok(Box::new(CutTail {
            inner: super::scan::FastCsv::open(path)?,
            path: path.to_path_buf(),
            ended: false,
        })),
    }
}

/// A reader of the original tool's dump rewritten as ours ([`super::original`]): the
/// rewritten file lives as long as its reader.
struct Rewritten<R> {
    inner: R,
    _file: super::original::Normalized,
}

impl<R: Iterator<Item = Result<EventRow, ReadError>>> Iterator for Rewritten<R> {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next()
    }
}

impl<R: RowSource> RowSource for Rewritten<R> {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        self.inner.next_row()
    }

    fn current(&self) -> Option<&EventRow> {
        self.inner.current()
    }

    fn progress(&self) -> Option<super::scan::Progress> {
        self.inner.progress()
    }
}

/// A [`RowSource`] over an iterator of owned rows.
struct Owned {
    rows: Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>,
    row: Option<EventRow>,
}

impl RowSource for Owned {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        self.row = None;
        match self.rows.next() {
            Some(Ok(row)) => Ok(Some(&*self.row.insert(row))),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    fn current(&self) -> Option<&EventRow> {
        self.row.as_ref()
    }
}

fn io_error(path: &Path, e: &std::io::Error) -> ReadError {
    ReadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn not_regular(path: &Path, kind: std::fs::FileType) -> ReadError {
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

/// At most 60 characters of `text`, quoted, for a message that must stay one line.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// Streams rows from a CSV dump (RFC 4180; quoted fields may span lines). Byte-oriented: a
/// record is read whole (at most [`MAX_ROW_BYTES`]), split at commas with `memchr` when it has
/// no quotes (most rows), and unquoted field by field otherwise; Attr stays raw text until an
/// analysis reads a value.
pub struct CsvRows {
    path: PathBuf,
    input: std::io::BufReader<std::fs::File>,
    /// Bytes of the file consumed so far: where the next record starts.
    offset: u64,
    line: u64,
    /// Records read so far, the header included: the number of the data row being read.
    records: u64,
    /// The current record's bytes (possibly several lines).
    raw: Vec<u8>,
    /// The current record's text after unquoting, and the range of each of its first 12
    /// fields in it; `nfields` counts them all.
    text: String,
    fields: Vec<std::ops::Range<usize>>,
    nfields: usize,
    order: IdOrder,
    done: bool,
}

impl CsvRows {
    pub fn open(path: &Path) -> Result<CsvRows, ReadError> {
        let file = open_regular(path)?;
        let mut rows = CsvRows {
            path: path.to_path_buf(),
            input: std::io::BufReader::with_capacity(1 << 20, file),
            offset: 0,
            line: 0,
            records: 0,
            raw: Vec::with_capacity(256),
            text: String::with_capacity(256),
            fields: Vec::with_capacity(12),
            nfields: 0,
            order: IdOrder::default(),
            done: false,
        };
        let not_a_dump = |reason: String| ReadError::NotADump {
            path: path.to_path_buf(),
            reason,
        };
        match rows.next_record() {
            Ok(true) if rows.nfields == 12 && rows.field_strs().eq(HEADER.split(',')) => Ok(rows),
            Ok(true) => Err(not_a_dump(format!("the header is not {HEADER}"))),
            Ok(false) => Err(not_a_dump("the file is empty".into())),
            Err(ReadError::RowTooLong { .. }) => Err(not_a_dump(format!(
                "its first line is longer than {MAX_ROW_BYTES} bytes"
            ))),
            Err(ReadError::BadRow { reason, .. }) => {
                Err(not_a_dump(format!("its first line: {reason}")))
            }
            Err(e) => Err(e),
        }
    }

    /// Where the next record starts, to hand over to another reader of the same file.
    pub(crate) fn position(&self) -> Position {
        Position {
            offset: self.offset,
            line: self.line,
            records: self.records,
        }
    }

    /// A reader of `file` (the dump at `path`, its header already checked) from `at` on, whose
    /// next row must come after the one `order` last saw: it goes on where another reader of the
    /// file stopped, and reads and refuses exactly what a reader from the start would.
    pub(crate) fn resume(
        path: &Path,
        mut file: std::fs::File,
        at: Position,
        order: IdOrder,
    ) -> Result<CsvRows, ReadError> {
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(at.offset))
            .map_err(|e| io_error(path, &e))?;
        Ok(CsvRows {
            path: path.to_path_buf(),
            input: std::io::BufReader::with_capacity(1 << 20, file),
            offset: at.offset,
            line: at.line,
            records: at.records,
            raw: Vec::with_capacity(256),
            text: String::with_capacity(256),
            fields: Vec::with_capacity(12),
            nfields: 0,
            order,
            done: false,
        })
    }

    fn field_strs(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|r| &self.text[r.clone()])
    }

    /// Appends the next line, with its `\n`, to `raw`; the bytes appended (0 at the end of the
    /// file). Never lets `raw` grow past [`MAX_ROW_BYTES`]: a line without end (a sparse or
    /// binary file) is refused after that much, not read whole.
    fn read_line(&mut self) -> Result<usize, ReadError> {
        let mut appended = 0;
        loop {
            let buf = match self.input.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(&self.path, &e)),
            };
            if buf.is_empty() {
                return Ok(appended);
            }
            let (take, ends) = match memchr::memchr(b'\n', buf) {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if self.raw.len() + take > MAX_ROW_BYTES {
                return Err(ReadError::RowTooLong {
                    path: self.path.clone(),
                    line: None,
                    row: self.records,
                });
            }
            self.raw.extend_from_slice(&buf[..take]);
            self.input.consume(take);
            self.offset += take as u64;
            appended += take;
            if ends {
                return Ok(appended);
            }
        }
    }

    /// Reads the next record; false at the end.
    fn next_record(&mut self) -> Result<bool, ReadError> {
        self.raw.clear();
        let first_line = self.line + 1;
        let mut quotes = 0usize;
        loop {
            let start = self.raw.len();
            let n = self.read_line().map_err(|e| match e {
                ReadError::RowTooLong { path, row, .. } => ReadError::RowTooLong {
                    path,
                    line: Some(first_line),
                    row,
                },
                e => e,
            })?;
            if n == 0 {
                if self.raw.is_empty() {
                    return Ok(false);
                }
                if !quotes.is_multiple_of(2) {
                    return Err(self.bad("a quoted field is not closed"));
                }
                break;
            }
            self.line += 1;
            quotes += memchr::memchr_iter(b'"', &self.raw[start..]).count();
            // An odd number of quotes so far: a quoted field goes on on the next line.
            if quotes.is_multiple_of(2) {
                break;
            }
        }
        self.records += 1;
        while matches!(self.raw.last(), Some(b'\n' | b'\r')) {
            self.raw.pop();
        }
        let raw = std::str::from_utf8(&self.raw).map_err(|_| ReadError::BadRow {
            path: self.path.clone(),
            line: self.line,
            reason: "not UTF-8".into(),
        })?;
        match split_record(raw, quotes > 0, &mut self.text, &mut self.fields) {
            Ok(n) => self.nfields = n,
            Err(reason) => {
                let line = self.line;
                return Err(ReadError::BadRow {
                    path: self.path.clone(),
                    line,
                    reason: reason.into(),
                });
            }
        }
        Ok(true)
    }

    fn bad(&self, reason: impl Into<String>) -> ReadError {
        ReadError::BadRow {
            path: self.path.clone(),
            line: self.line,
            reason: reason.into(),
        }
    }

    fn parse(&mut self) -> Result<EventRow, ReadError> {
        if self.nfields != 12 {
            return Err(self.bad(format!("{} fields, expected 12", self.nfields)));
        }
        let row = parse_fields(self.field_strs()).map_err(|reason| self.bad(reason))?;
        self.order
            .check(row.id)
            .map_err(|reason| self.bad(reason))?;
        Ok(row)
    }
}

impl Iterator for CsvRows {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = match self.next_record() {
            Ok(true) => self.parse(),
            Ok(false) => {
                self.done = true;
                return None;
            }
            Err(e) => Err(e),
        };
        // After a bad row the rest cannot be trusted (nor, after a row too long, found).
        self.done = item.is_err();
        Some(item)
    }
}

/// Where a CSV record starts: its byte offset, the lines before it, and the records (the
/// header included) before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) offset: u64,
    pub(crate) line: u64,
    pub(crate) records: u64,
}

/// Splits one CSV record (its line ends removed) into fields: their text goes to `text`, and
/// the range of each of the first 12 in it to `fields`; returns how many fields there are.
/// `quoted` says whether the record has a quote at all: most rows have none, and are split at
/// commas; otherwise fields are unquoted one by one, `""` undoubled.
pub(crate) fn split_record(
    raw: &str,
    quoted: bool,
    text: &mut String,
    fields: &mut Vec<std::ops::Range<usize>>,
) -> Result<usize, &'static str> {
    text.clear();
    fields.clear();
    let b = raw.as_bytes();
    if !quoted {
        text.push_str(raw);
        // At most 12 ranges kept, so that a row of a million commas costs no million ranges.
        let mut nfields = 1;
        let mut start = 0;
        let mut at = 0;
        while let Some(comma) = find_byte(&b[at..], b',').map(|c| at + c) {
            if fields.len() < 11 {
                fields.push(start..comma);
            }
            nfields += 1;
            start = comma + 1;
            at = start;
        }
        fields.push(start..raw.len());
        return Ok(nfields);
    }
    let mut nfields = 0;
    let mut i = 0;
    loop {
        let start = text.len();
        if b.get(i) == Some(&b'"') {
            i += 1;
            loop {
                let Some(q) = find_byte(&b[i..], b'"').map(|q| i + q) else {
                    return Err("a quoted field is not closed");
                };
                text.push_str(&raw[i..q]);
                if b.get(q + 1) == Some(&b'"') {
                    text.push('"');
                    i = q + 2;
                } else {
                    i = q + 1;
                    break;
                }
            }
            // Anything between the closing quote and the comma is kept, as lenient readers do.
            let end = find_byte(&b[i..], b',').map_or(b.len(), |c| i + c);
            text.push_str(&raw[i..end]);
            i = end;
        } else {
            let end = find_byte(&b[i..], b',').map_or(b.len(), |c| i + c);
            text.push_str(&raw[i..end]);
            i = end;
        }
        nfields += 1;
        if fields.len() < 12 {
            fields.push(start..text.len());
        }
        if i >= b.len() {
            break;
        }
        i += 1; // the comma
    }
    Ok(nfields)
}

/// The first `needle` in `hay`. Dump fields are mostly a few bytes long, where a plain loop
/// beats a vector search's set-up; a long field (a stack) gets the vector search.
#[inline]
pub(crate) fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const SHORT: usize = 24;
    let head = &hay[..hay.len().min(SHORT)];
    if let Some(i) = head.iter().position(|&c| c == needle) {
        return Some(i);
    }
    if hay.len() <= SHORT {
        return None;
    }
    memchr::memchr(needle, &hay[SHORT..]).map(|i| SHORT + i)
}

/// Builds a row from the 12 columns in order.
pub(crate) fn parse_fields<'a>(f: impl Iterator<Item = &'a str>) -> Result<EventRow, String> {
    let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
    parse_fields_into(&mut row, f, &mut Vec::new())?;
    Ok(row)
}

/// Fills `row` from the 12 columns in order, reusing its strings' memory: a reader that hands
/// out one row at a time allocates nothing per row. An Attr string a row no longer needs goes
/// to `spare`, and one is taken from there when a row needs it.
pub(crate) fn parse_fields_into<'a>(
    row: &mut EventRow,
    mut f: impl Iterator<Item = &'a str>,
    spare: &mut Vec<String>,
) -> Result<(), String> {
    let mut next = || f.next().unwrap_or("");
    let id = decimal(next()).ok_or_else(|| "ID is not a number".to_string())?;
    let event_text = next();
    row.event =
        Event::parse(event_text).ok_or_else(|| format!("unknown Event {}", excerpt(event_text)))?;
    let type_text = next();
    row.event_type = EventType::parse(type_text)
        .ok_or_else(|| format!("unknown Event Type {}", excerpt(type_text)))?;
    let name = next();
    row.name.clear();
    row.name.push_str(if name == "N/A" { "" } else { name });
    row.id = id;
    row.ts_ns = decimal(next()).ok_or_else(|| "Timestamp(ns) is not a number".to_string())?;
    row.pid = decimal(next())
        .and_then(|pid| u32::try_from(pid).ok())
        .ok_or_else(|| "Process Id is not a number".to_string())?;
    row.tid = decimal(next()).ok_or_else(|| "Thread Id is not a number".to_string())?;
    let device = next();
    row.device =
        DeviceId::parse(device).ok_or_else(|| format!("bad Device Id {}", excerpt(device)))?;
    let ptr = next();
    row.ptr = match ptr {
        "N/A" | "" => None,
        p => {
            let hex = p.strip_prefix("0x").unwrap_or(p);
            let value = hexadecimal(hex);
            Some(value.ok_or_else(|| format!("bad Ptr {}", excerpt(p)))?)
        }
    };
    let attrs = next();
    // Readers reuse rows; the map is empty but for rows built by hand, and clearing an empty
    // one still costs a call.
    if !row.attrs.is_empty() {
        row.attrs.clear();
    }
    if has_attrs(attrs) {
        // Kept as text: analyses read single values with `attr_u64`/`attr_str`, and
        // `parse_attrs` builds the map for the rest; checked here so that both read what the
        // row says.
        let numbers = check_attrs_numbers(attrs)?;
        keep_attrs(row, numbers, spare, |kept| {
            kept.clear();
            kept.push_str(attrs);
        });
    } else if let Some(unused) = row.attrs_json.take() {
        spare.push(unused);
    }
    row.python_stack.clear();
    row.python_stack.push_str(next());
    row.c_stack.clear();
    row.c_stack.push_str(next());
    Ok(())
}

/// Makes `attrs` (a row's Attr text, which [`parse_fields_into`] was given as empty) the row's,
/// checked as that function checks it: its memory moves into the row, and the row's old string
/// comes back in `attrs`, so a reader that unquoted the text into a string of its own copies
/// nothing.
pub(crate) fn adopt_attrs(
    row: &mut EventRow,
    attrs: &mut String,
    spare: &mut Vec<String>,
) -> Result<(), String> {
    if !has_attrs(attrs) {
        return Ok(());
    }
    let numbers = check_attrs_numbers(attrs)?;
    keep_attrs(row, numbers, spare, |kept| std::mem::swap(kept, attrs));
    Ok(())
}

/// Whether an Attr text holds anything (`{}` is written for none).
fn has_attrs(attrs: &str) -> bool {
    !attrs.is_empty() && attrs != "{}"
}

/// Gives `row` its Attr text through `put` (into the row's string, or one from `spare`), with
/// the numeric values the check found in it.
fn keep_attrs(
    row: &mut EventRow,
    numbers: Option<super::flat_json::Plain>,
    spare: &mut Vec<String>,
    put: impl FnOnce(&mut String),
) {
    let kept = row
        .attrs_json
        .get_or_insert_with(|| spare.pop().unwrap_or_default());
    put(kept);
    row.numbers = match numbers {
        Some(plain) => AttrNumbers::of(kept, plain),
        None => AttrNumbers::default(),
    };
}

/// A decimal `u64` as `str::parse` reads one (an optional `+`, then digits), without its
/// generality: readers parse four of these on every row.
fn decimal(text: &str) -> Option<u64> {
    decimal_digits(text.strip_prefix('+').unwrap_or(text).as_bytes())
}

/// Digits only (at least one) as a `u64`; `None` for anything else or an overflow.
pub(crate) fn decimal_digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    if digits.len() <= 19 {
        // Nineteen digits stay below 10^19 < u64::MAX: no step can overflow. Eight at a time,
        // since a dump's timestamps have nineteen.
        let mut value = 0u64;
        let mut eights = digits.chunks_exact(8);
        for eight in &mut eights {
            value = value * 100_000_000 + eight_digits(eight.try_into().expect("8 bytes"))?;
        }
        for &d in eights.remainder() {
            let d = d.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            value = value * 10 + u64::from(d);
        }
        return Some(value);
    }
    let mut value = 0u64;
    for &d in digits {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(value)
}

/// Eight ASCII digits as their value, all in one word; `None` when any byte is not a digit.
fn eight_digits(eight: [u8; 8]) -> Option<u64> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let word = u64::from_le_bytes(eight);
    // A digit's high nibble is 3, and its low nibble plus 6 stays below 16.
    let digits = word & (0xF0 * ONES) == 0x30 * ONES
        && (word.wrapping_add(0x06 * ONES)) & (0xF0 * ONES) == 0x30 * ONES;
    if !digits {
        return None;
    }
    // The first byte is the lowest and the most significant digit: pairs, then fours, then
    // all eight.
    let mut v = word - 0x30 * ONES;
    v = (v * 10 + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    v = (v * 100 + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    v = (v * 10_000 + (v >> 32)) & 0xFFFF_FFFF;
    Some(v)
}

/// Each byte's hex digit value, or [`NOT_HEX`].
const HEX_DIGITS: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = match c as u8 {
            d @ b'0'..=b'9' => d - b'0',
            d @ b'a'..=b'f' => d - b'a' + 10,
            d @ b'A'..=b'F' => d - b'A' + 10,
            _ => NOT_HEX,
        };
        c += 1;
    }
    table
};
const NOT_HEX: u8 = 0x80;

/// Hex digits only (no sign, no prefix), at most 64 bits.
fn hexadecimal(text: &str) -> Option<u64> {
    let mut digits = text.as_bytes();
    if digits.is_empty() {
        return None;
    }
    // Leading zeros are not among the sixteen digits a u64 holds.
    while digits.len() > 16 && digits[0] == b'0' {
        digits = &digits[1..];
    }
    if digits.len() > 16 {
        return None;
    }
    if let Ok(sixteen) = <&[u8; 16]>::try_from(digits) {
        // A dump's Ptr: sixteen digits, eight to a word.
        let (high, low) = sixteen.split_at(8);
        let high = eight_hex_digits(high.try_into().expect("8 bytes"))?;
        let low = eight_hex_digits(low.try_into().expect("8 bytes"))?;
        return Some(u64::from(high) << 32 | u64::from(low));
    }
    let mut value = 0u64;
    let mut seen = 0u8;
    for &c in digits {
        let d = HEX_DIGITS[usize::from(c)];
        seen |= d;
        value = value << 4 | u64::from(d & 0xF);
    }
    (seen & NOT_HEX == 0).then_some(value)
}

/// Eight ASCII hex digits (either case) as their value, all in one word; `None` when any byte
/// is not one.
fn eight_hex_digits(eight: [u8; 8]) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x80 * ONES;
    let word = u64::from_le_bytes(eight);
    if word & HIGH != 0 {
        return None;
    }
    // Every byte is below 0x80, so adding up to 0x80 to each cannot carry into the next: a
    // byte's high bit then says whether it is at least a bound.
    let at_least = |bound: u8| word.wrapping_add(u64::from(0x80 - bound) * ONES) & HIGH;
    let lower = word | (0x20 * ONES); // letters to lower case; digits have the bit already
    let lower_at_least = |bound: u8| lower.wrapping_add(u64::from(0x80 - bound) * ONES) & HIGH;
    let digit = at_least(b'0') & !at_least(b'9' + 1);
    let letter = lower_at_least(b'a') & !lower_at_least(b'f' + 1);
    if digit | letter != HIGH {
        return None;
    }
    // Each byte's value: its low nibble, plus 9 for a letter ('a' is 0x61).
    let mut v = (word & (0x0F * ONES)) + (letter >> 7) * 9;
    // The first byte is the lowest and the most significant digit: pairs, fours, then eight.
    v = (v & 0x00FF_00FF_00FF_00FF) << 4 | (v >> 8 & 0x00FF_00FF_00FF_00FF);
    v = (v & 0x0000_FFFF_0000_FFFF) << 8 | (v >> 16 & 0x0000_FFFF_0000_FFFF);
    v = (v & 0xFFFF_FFFF) << 16 | v >> 32;
    Some(v as u32)
}

/// Checks that Attr is one JSON object whose [`NUMERIC_ATTRS`] are integers from 0 to
/// `u64::MAX`, each given once and spelled without escapes (`attr_u64` reads the raw text, so
/// it must find them as written); the reason names the key. Public so that a producer can
/// refuse at emit time what the readers would refuse later.
pub fn check_attrs(attrs: &str) -> Result<(), String> {
    check_attrs_numbers(attrs).map(drop)
}

/// [`check_attrs`], and the [`NUMERIC_ATTRS`] values (which are present, and each value) when
/// the quick accept took the object.
fn check_attrs_numbers(attrs: &str) -> Result<Option<super::flat_json::Plain>, String> {
    if let Some(numbers) = super::flat_json::plain_object(attrs) {
        return Ok(Some(numbers));
    }
    check_attrs_fully(attrs).map(|()| None)
}

/// [`check_attrs`] without the quick accept: a full JSON walk.
pub(crate) fn check_attrs_fully(attrs: &str) -> Result<(), String> {
    use serde::Deserializer as _;
    let mut de = serde_json::Deserializer::from_str(attrs);
    let checked = de
        .deserialize_map(AttrCheck)
        .and_then(|r| de.end().map(|_| r));
    let not_u64 = |key: &str, written: &str| {
        format!(
            "Attr {key:?} is not an integer from 0 to {}: {}",
            u64::MAX,
            excerpt(written)
        )
    };
    match checked {
        Ok(Ok(seen)) => {
            // `attr_u64` reads the digits as written: `-0`, which JSON takes for 0, would be
            // nothing to it.
            for (index, key) in NUMERIC_ATTRS.iter().enumerate() {
                if seen & (1 << index) == 0 {
                    continue;
                }
                let written = super::row::raw_number(attrs, key).unwrap_or_default();
                if written.is_empty() || !written.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(not_u64(key, written));
                }
            }
            Ok(())
        }
        Ok(Err(bad)) => Err(match bad {
            BadAttr::Twice(key) => format!("Attr {key:?} is given twice"),
            BadAttr::Escaped(key) => format!("Attr {key:?} is written with escapes"),
            BadAttr::NotU64(key, value) => {
                // The number as written: a too-large one parses as a float, which would
                // print differently.
                let written = value
                    .is_number()
                    .then(|| super::row::raw_number(attrs, key))
                    .flatten()
                    .map_or_else(|| value.to_string(), str::to_owned);
                not_u64(key, &written)
            }
        }),
        Err(e) => Err(format!(
            "Attr is not a JSON object ({e}): {}",
            excerpt(attrs)
        )),
    }
}

enum BadAttr {
    Twice(&'static str),
    Escaped(&'static str),
    NotU64(&'static str, serde_json::Value),
}

/// Walks an Attr object once, parsing only the values of [`NUMERIC_ATTRS`].
struct AttrCheck;

impl<'de> serde::de::Visitor<'de> for AttrCheck {
    /// The [`NUMERIC_ATTRS`] present, as a bit set by index.
    type Value = Result<u32, BadAttr>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = 0u32;
        let mut bad = None;
        while let Some(key) = map.next_key::<AttrKey>()? {
            let AttrKey::Numeric { index, escaped } = key else {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            };
            let name = NUMERIC_ATTRS[index];
            let value: serde_json::Value = map.next_value()?;
            if bad.is_some() {
                continue;
            }
            if escaped {
                bad = Some(BadAttr::Escaped(name));
            } else if seen & (1 << index) != 0 {
                bad = Some(BadAttr::Twice(name));
            } else if value.as_u64().is_none() {
                bad = Some(BadAttr::NotU64(name, value));
            }
            seen |= 1 << index;
        }
        Ok(bad.map_or(Ok(seen), Err))
    }
}

/// An Attr key: one of [`NUMERIC_ATTRS`] (and whether its text had escapes), or another.
enum AttrKey {
    Numeric { index: usize, escaped: bool },
    Other,
}

impl<'de> serde::Deserialize<'de> for AttrKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AttrKey, D::Error> {
        struct KeyVisitor;
        impl KeyVisitor {
            fn key(text: &str, escaped: bool) -> AttrKey {
                NUMERIC_ATTRS
                    .iter()
                    .position(|k| *k == text)
                    .map_or(AttrKey::Other, |index| AttrKey::Numeric { index, escaped })
            }
        }
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = AttrKey;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }

            // serde_json hands a key over borrowed exactly when its text has no escapes.
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<AttrKey, E> {
                Ok(KeyVisitor::key(v, false))
            }

            fn visit_str<E>(self, v: &str) -> Result<AttrKey, E> {
                Ok(KeyVisitor::key(v, true))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Streams rows from a SQLite dump, in ID order.
pub struct DbRows {
    path: PathBuf,
    conn: rusqlite::Connection,
    /// Rows fetched and not yet handed out; a page ends at its first bad row.
    page: std::collections::VecDeque<Fetched>,
    /// The ID of the last row fetched, as stored (the next page starts there).
    last_id: Option<rusqlite::types::Value>,
    /// Rows handed out so far.
    rows: u64,
    order: IdOrder,
    done: bool,
}

/// One row of a page: its 12 values as text, or why it is unusable.
enum Fetched {
    Row(Vec<String>),
    /// The row's ID where it is a number, and what is wrong.
    Bad(Option<u64>, String),
    TooLong,
    Failed(ReadError),
}

/// Rows per page, and the bytes after which a page ends early: keyset pagination keeps
/// memory bounded by what a page holds.
const PAGE: i64 = 50_000;
const PAGE_BYTES: usize = 8 << 20;

/// The columns read, in the CSV's order: the header's names.
fn select_columns() -> String {
    HEADER
        .split(',')
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

impl DbRows {
    pub fn open(path: &Path) -> Result<DbRows, ReadError> {
        // SQLite would open a FIFO and block in it.
        drop(open_regular(path)?);
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| sqlite_error(path, e))?;
        // SQLite then refuses (SQLITE_TOOBIG) to load any longer value, instead of allocating
        // it: a damaged or hostile file cannot make a row cost more than the cap.
        // SAFETY: the handle is this open connection's; sqlite3_limit only sets a number.
        unsafe {
            rusqlite::ffi::sqlite3_limit(
                conn.handle(),
                rusqlite::ffi::SQLITE_LIMIT_LENGTH,
                MAX_ROW_BYTES as i32,
            );
        }
        let not_a_dump = |reason: String| ReadError::NotADump {
            path: path.to_path_buf(),
            reason,
        };
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master \
                 WHERE name = 'memscope_dump' AND type IN ('table', 'view')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| sqlite_error(path, e))?;
        if tables != 1 {
            return Err(not_a_dump("no table memscope_dump".into()));
        }
        let columns: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info('memscope_dump')")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<_, _>>()
            })
            .map_err(|e| sqlite_error(path, e))?;
        // SQLite matches column names without regard to ASCII case, and so does the query.
        if let Some(missing) = HEADER
            .split(',')
            .find(|c| !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
        {
            return Err(not_a_dump(format!(
                "table memscope_dump lacks column \"{missing}\""
            )));
        }
        Ok(DbRows {
            path: path.to_path_buf(),
            conn,
            page: Default::default(),
            last_id: None,
            rows: 0,
            order: IdOrder::default(),
            done: false,
        })
    }

    /// The next page, keyset-paginated by ID. A page starts at the last ID fetched, inclusive,
    /// and skips that one row: a second row with the same ID is then read, not jumped over,
    /// and refused as a repeat.
    fn fetch(&mut self) {
        let columns = select_columns();
        let (sql, params) = match &self.last_id {
            Some(last) => (
                format!(
                    "SELECT {columns} FROM memscope_dump WHERE \"ID\" >= ?1 ORDER BY \"ID\" LIMIT ?2"
                ),
                vec![last.clone(), rusqlite::types::Value::Integer(PAGE + 1)],
            ),
            None => (
                format!("SELECT {columns} FROM memscope_dump ORDER BY \"ID\" LIMIT ?1"),
                vec![rusqlite::types::Value::Integer(PAGE)],
            ),
        };
        let failed = |e| Fetched::Failed(sqlite_error(&self.path, e));
        let mut statement = match self.conn.prepare_cached(&sql) {
            Ok(s) => s,
            Err(e) => return self.page.push_back(failed(e)),
        };
        let mut rows = match statement.query(rusqlite::params_from_iter(params)) {
            Ok(rows) => rows,
            Err(e) => return self.page.push_back(failed(e)),
        };
        let mut skip = self.last_id.clone();
        let mut bytes = 0;
        let mut page = std::collections::VecDeque::new();
        loop {
            let row = match rows.next() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) if is_too_big(&e) => {
                    page.push_back(Fetched::TooLong);
                    break;
                }
                Err(e) => {
                    page.push_back(failed(e));
                    break;
                }
            };
            let id = match row.get_ref(0) {
                Ok(v) => stored_value(v),
                Err(e) => {
                    page.push_back(failed(e));
                    break;
                }
            };
            if skip.take().is_some_and(|last| Some(last) == id) {
                continue;
            }
            let fetched = read_values(row).map_err(|f| match f {
                Fetched::Bad(_, reason) => Fetched::Bad(id.as_ref().and_then(id_number), reason),
                f => f,
            });
            // A row without an ID to resume from is refused when handed out: nothing after
            // it is needed, and the next page could not start past it.
            let stop = fetched.is_err() || id.is_none();
            match fetched {
                Ok((values, len)) => {
                    bytes += len;
                    page.push_back(Fetched::Row(values));
                }
                Err(f) => page.push_back(f),
            }
            if stop {
                break;
            }
            self.last_id = id;
            if bytes >= PAGE_BYTES {
                break;
            }
        }
        self.page = page;
    }
}

/// A row's values as the CSV's text, and their total length.
fn read_values(row: &rusqlite::Row) -> Result<(Vec<String>, usize), Fetched> {
    use rusqlite::types::ValueRef;
    let mut values = Vec::with_capacity(12);
    let mut len = 0;
    for (i, column) in HEADER.split(',').enumerate() {
        let value = match row.get_ref(i) {
            Ok(v) => v,
            Err(e) if is_too_big(&e) => return Err(Fetched::TooLong),
            Err(e) => return Err(Fetched::Bad(None, format!("{column}: {e}"))),
        };
        let text = match value {
            ValueRef::Null => String::new(),
            ValueRef::Integer(n) => n.to_string(),
            ValueRef::Real(f) => f.to_string(),
            ValueRef::Text(t) => match std::str::from_utf8(t) {
                Ok(t) => t.to_owned(),
                Err(_) => return Err(Fetched::Bad(None, format!("{column} is not UTF-8"))),
            },
            ValueRef::Blob(_) => {
                return Err(Fetched::Bad(None, format!("{column} is a BLOB, not text")))
            }
        };
        len += text.len();
        if len > MAX_ROW_BYTES {
            return Err(Fetched::TooLong);
        }
        values.push(text);
    }
    Ok((values, len))
}

/// An ID as stored, to start the next page at; `None` for one no page could start at (it is
/// refused as not a number anyway).
fn stored_value(v: rusqlite::types::ValueRef) -> Option<rusqlite::types::Value> {
    use rusqlite::types::{Value, ValueRef};
    match v {
        ValueRef::Integer(n) => Some(Value::Integer(n)),
        ValueRef::Real(f) => Some(Value::Real(f)),
        ValueRef::Text(t) => std::str::from_utf8(t).ok().map(|t| Value::Text(t.into())),
        ValueRef::Null | ValueRef::Blob(_) => None,
    }
}

fn id_number(v: &rusqlite::types::Value) -> Option<u64> {
    match v {
        rusqlite::types::Value::Integer(n) => u64::try_from(*n).ok(),
        rusqlite::types::Value::Text(t) => t.parse().ok(),
        _ => None,
    }
}

fn is_too_big(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::TooBig)
}

/// A damaged file or one that is not SQLite is bad input; anything else (permissions, locks,
/// the disk) is an I/O failure.
fn sqlite_error(path: &Path, e: rusqlite::Error) -> ReadError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => ReadError::NotADump {
            path: path.to_path_buf(),
            reason: "not an SQLite database".into(),
        },
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => ReadError::NotADump {
            path: path.to_path_buf(),
            reason: format!("a damaged SQLite database ({e})"),
        },
        _ => ReadError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
    }
}

impl Iterator for DbRows {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.page.is_empty() {
            self.fetch();
        }
        let Some(fetched) = self.page.pop_front() else {
            self.done = true;
            return None;
        };
        self.rows += 1;
        let position = self.rows;
        let bad = |line: u64, reason: String| ReadError::BadRow {
            path: self.path.clone(),
            line,
            reason,
        };
        let item = match fetched {
            Fetched::Row(values) => {
                let line = values[0].parse().unwrap_or(position);
                parse_fields(values.iter().map(String::as_str))
                    .and_then(|row| self.order.check(row.id).map(|_| row))
                    .map_err(|reason| bad(line, reason))
            }
            Fetched::Bad(id, reason) => Err(bad(id.unwrap_or(position), reason)),
            Fetched::TooLong => Err(ReadError::RowTooLong {
                path: self.path.clone(),
                line: None,
                row: position,
            }),
            Fetched::Failed(e) => Err(e),
        };
        self.done = item.is_err();
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::csv::write_row;

    fn temp(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("msmemscope-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn numbers_known_from_the_check_answer_only_for_their_text() {
        let fields = |attrs: &'static str| {
            [
                "7", "MALLOC", "PTA", "N/A", "5", "1", "1", "cpu", "0x10", attrs, "", "",
            ]
            .into_iter()
        };
        let mut row = EventRow::new(Event::Free, EventType::Pta, "");
        parse_fields_into(&mut row, fields(r#"{"size":5,"used":70}"#), &mut Vec::new()).unwrap();
        assert_eq!(row.attr_u64("size"), Some(5));
        assert_eq!(row.attr_u64("used"), Some(70));
        assert_eq!(row.attr_u64("total"), None);
        // The row's memory is reused for the next: same length, other values.
        parse_fields_into(&mut row, fields(r#"{"size":6,"used":71}"#), &mut Vec::new()).unwrap();
        assert_eq!(
            (row.attr_u64("size"), row.attr_u64("used")),
            (Some(6), Some(71))
        );
        // Escapes are the full check's: nothing known, the text is read.
        let escaped = r#"{"size":8,"owner":"a\"b"}"#;
        parse_fields_into(&mut row, fields(escaped), &mut Vec::new()).unwrap();
        assert_eq!(row.attr_u64("size"), Some(8));
        // A text put in place of the one read is read, not answered from what was known.
        row.attrs_json = Some(r#"{"size":9,"used":72}"#.into());
        assert_eq!(row.attr_u64("size"), Some(9));
    }

    #[test]
    fn numeric_attr_indices_follow_the_list() {
        for (i, key) in NUMERIC_ATTRS.iter().enumerate() {
            assert_eq!(numeric_attr_index(key), Some(i));
        }
        assert_eq!(numeric_attr_index("owner"), None);
    }

    #[test]
    fn numbers_read_as_the_standard_parsers_read_them() {
        for text in [
            "",
            "0",
            "+7",
            "-1",
            "++1",
            "12a",
            "18446744073709551615",
            "18446744073709551616",
            "00042",
            " 1",
            "+",
            "1700000000000000137",
            "9999999999999999999",
            "99999999999999999999",
            "+9999999999999999999",
            "000000000000000000000000001",
            "999999999999999999a",
        ] {
            assert_eq!(decimal(text), text.parse::<u64>().ok(), "{text:?}");
        }
        for text in [
            "",
            "0",
            "ff",
            "FF",
            "+1",
            "-1",
            "g",
            "ffffffffffffffff",
            "10000000000000000",
            "000000000000000001",
        ] {
            let standard = (!text.starts_with(['+', '-']))
                .then(|| u64::from_str_radix(text, 16).ok())
                .flatten();
            assert_eq!(hexadecimal(text), standard, "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_numbers_read_as_the_standard_parsers_read_them(
            text in "[+0-9a-fA-F:/ ]{0,24}",
            n in proptest::prelude::any::<u64>(),
            width in 0usize..24,
        ) {
            proptest::prop_assert_eq!(decimal(&text), text.parse::<u64>().ok(), "{:?}", text);
            let written = format!("{n:0width$}");
            proptest::prop_assert_eq!(decimal(&written), Some(n));
            let hex_standard = (!text.starts_with(['+', '-']))
                .then(|| u64::from_str_radix(&text, 16).ok())
                .flatten();
            proptest::prop_assert_eq!(hexadecimal(&text), hex_standard, "{:?}", text);
            proptest::prop_assert_eq!(hexadecimal(&format!("{n:0width$x}")), Some(n));
            proptest::prop_assert_eq!(hexadecimal(&format!("{n:016X}")), Some(n));
        }

        /// Sixteen digits, a Ptr's width, are read a word at a time: mostly hex digits, some
        /// bytes next to the digit and letter ranges, and non-ASCII.
        #[test]
        fn sixteen_hex_digits_read_as_the_standard_parser_reads_them(
            text in "([0-9a-fA-F]{1,4}|[/:@G`g\x7f é+]){1,16}",
        ) {
            let sixteen: String = text.chars().take(16).collect();
            let standard = (!sixteen.starts_with(['+', '-']))
                .then(|| u64::from_str_radix(&sixteen, 16).ok())
                .flatten();
            proptest::prop_assert_eq!(hexadecimal(&sixteen), standard, "{:?}", sixteen);
        }
    }

    #[test]
    fn round_trips_written_rows() {
        let mut a = EventRow::new(Event::Malloc, EventType::Pta, "");
        a.id = 1;
        a.ts_ns = 5;
        a.device = DeviceId::Cpu;
        a.ptr = Some(0x1000);
        a.attrs.insert("size".into(), 64.into());
        a.python_stack = "a.py(1): f\nb.py(2): \"g\"".into();
        let mut b = EventRow::new(Event::OpLaunch, EventType::AtenStart, "aten::add.Tensor");
        b.id = 2;
        let mut text = format!("{HEADER}\n");
        write_row(&mut text, &a);
        write_row(&mut text, &b);
        let mut rows: Vec<EventRow> = open(&temp("ok.csv", &text))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        rows[0].parse_attrs();
        assert_eq!(rows, vec![a, b]);
    }

    #[test]
    fn errors_name_file_and_line() {
        let missing = open(Path::new("/nonexistent/x.csv"))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(missing, "/nonexistent/x.csv: no such file");
        let path = temp("bad.csv", &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n2,BOGUS,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n"));
        let results: Vec<_> = open(&path).unwrap().collect();
        assert!(results[0].is_ok());
        let err = results[1].as_ref().unwrap_err().to_string();
        assert!(
            err.ends_with("bad.csv:3: malformed row: unknown Event \"BOGUS\""),
            "{err}"
        );
        let path = temp("nohdr.csv", "a,b\n");
        assert!(open(&path)
            .err()
            .unwrap()
            .to_string()
            .contains("not a memscope dump"));
    }

    /// Removes the test's large files, which would otherwise pile up in the temporary directory.
    fn remove(paths: &[&Path]) {
        for path in paths {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The first error of a dump, as its message.
    fn first_error(path: &Path) -> String {
        match open(path) {
            Err(e) => e.to_string(),
            Ok(rows) => rows
                .filter_map(Result::err)
                .next()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        }
    }

    const MALLOC: &str = "2,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{\"\"size\"\":64}\",,";

    #[test]
    fn a_line_without_end_is_refused_at_the_cap() {
        let path = temp(
            "sparse.csv",
            &format!("{HEADER}\n1,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n"),
        );
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(3 << 30).unwrap();
        drop(file);
        let err = first_error(&path);
        assert_eq!(
            err,
            format!(
                "{}:3: row 2 is longer than 16777216 bytes: not a memscope dump",
                path.display()
            )
        );
        remove(&[&path]);
        // A header that long is no header.
        let path = temp("sparse_header.csv", "");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: its first line is longer than 16777216 bytes",
                path.display()
            )
        );
        remove(&[&path]);
        // A quoted field that never closes is capped the same way, across lines.
        let mut text = format!("{HEADER}\n1,MSTX,Mark,\"a");
        text.push_str(&"\n".repeat(MAX_ROW_BYTES));
        let path = temp("open_quote.csv", &text);
        assert!(
            first_error(&path)
                .ends_with(":2: row 1 is longer than 16777216 bytes: not a memscope dump"),
            "{}",
            first_error(&path)
        );
        remove(&[&path]);
        // A row of exactly the cap, its line end included, is read; one byte more is not.
        let stack = MAX_ROW_BYTES - MALLOC.len() - 1;
        let long = format!("{MALLOC}{}\n", "x".repeat(stack));
        let path = temp("at_cap.csv", &format!("{HEADER}\n{long}"));
        let row = open(&path).unwrap().next().unwrap().unwrap();
        assert_eq!(row.c_stack.len(), stack);
        remove(&[&path]);
        let long = format!("{MALLOC}{}\n", "x".repeat(stack + 1));
        let path = temp("over_cap.csv", &format!("{HEADER}\n{long}"));
        assert!(first_error(&path)
            .ends_with(":2: row 1 is longer than 16777216 bytes: not a memscope dump"));
        remove(&[&path]);
    }

    #[test]
    fn non_regular_files_are_refused() {
        let dir = temp("x", "").parent().unwrap().to_path_buf();
        let fifo = dir.join("fifo.csv");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for name in ["fifo.csv", "fifo.db"] {
            let path = dir.join(name);
            if name.ends_with(".db") {
                let _ = std::fs::remove_file(&path);
                std::os::unix::fs::symlink(&fifo, &path).unwrap();
            }
            assert_eq!(
                first_error(&path),
                format!(
                    "{}: not a memscope dump: a FIFO, not a regular file",
                    path.display()
                )
            );
        }
        let zero = dir.join("zero.csv");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(
            first_error(&zero),
            format!(
                "{}: not a memscope dump: a character device, not a regular file",
                zero.display()
            )
        );
        assert_eq!(
            first_error(&dir),
            format!(
                "{}: not a memscope dump: a directory, not a regular file",
                dir.display()
            )
        );
    }

    #[test]
    fn values_that_do_not_fit_are_refused() {
        let cases = [
            (
                r#"{""size"":18446744073709551616}"#,
                r#"Attr "size" is not an integer from 0 to 18446744073709551615: "18446744073709551616""#,
            ),
            (
                r#"{""size"":-1}"#,
                r#"Attr "size" is not an integer from 0 to 18446744073709551615: "-1""#,
            ),
            (
                r#"{""used"":1.5}"#,
                r#"Attr "used" is not an integer from 0 to 18446744073709551615: "1.5""#,
            ),
            (
                r#"{""total"":""7""}"#,
                r#"Attr "total" is not an integer from 0 to 18446744073709551615: "\"7\"""#,
            ),
            (
                r#"{""size"":1,""size"":2}"#,
                r#"Attr "size" is given twice"#,
            ),
            (
                r#"{""si\u007ae"":1}"#,
                r#"Attr "size" is written with escapes"#,
            ),
            (
                r#"{""size"":1"#,
                r#"Attr is not a JSON object (EOF while parsing an object at line 1 column 9): "{\"size\":1""#,
            ),
            (
                r#"{""size"":1}x"#,
                r#"Attr is not a JSON object (trailing characters at line 1 column 11): "{\"size\":1}x""#,
            ),
        ];
        for (attr, reason) in cases {
            let path = temp(
                "overflow.csv",
                &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{attr}\",,\n"),
            );
            assert_eq!(
                first_error(&path),
                format!("{}:2: malformed row: {reason}", path.display())
            );
        }
        // The largest value, and keys that are not counted, are fine.
        let path = temp("max.csv", &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{{\"\"size\"\":18446744073709551615,\"\"owner\"\":-1.5}}\",,\n"));
        let row = open(&path).unwrap().next().unwrap().unwrap();
        assert_eq!(row.attr_u64("size"), Some(u64::MAX));
        for (ptr, reason) in [
            ("0x", "bad Ptr \"0x\""),
            ("0x+1", "bad Ptr \"0x+1\""),
            ("0x10000000000000000", "bad Ptr \"0x10000000000000000\""),
        ] {
            let path = temp(
                "ptr.csv",
                &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,{ptr},{{}},,\n"),
            );
            assert_eq!(
                first_error(&path),
                format!("{}:2: malformed row: {reason}", path.display())
            );
        }
    }

    #[test]
    fn ids_must_ascend() {
        let row = |id: u64| format!("{id},MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n");
        let path = temp(
            "dup.csv",
            &format!("{HEADER}\n{}{}{}", row(1), row(2), row(2)),
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}:4: malformed row: ID 2 repeats the previous row's ID",
                path.display()
            )
        );
        let path = temp(
            "order.csv",
            &format!("{HEADER}\n{}{}{}", row(1), row(3), row(2)),
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}:4: malformed row: ID 2 comes after ID 3: rows must be in ascending ID order",
                path.display()
            )
        );
        // The iterator stops at its first error.
        let path = temp(
            "stop.csv",
            &format!("{HEADER}\n{}{}{}", row(2), row(1), row(3)),
        );
        assert_eq!(open(&path).unwrap().count(), 2);
    }

    fn db(name: &str, schema: &str, rows: &[&[rusqlite::types::Value]]) -> PathBuf {
        let path = temp(name, "");
        std::fs::remove_file(&path).unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(schema).unwrap();
        for row in rows {
            let marks = vec!["?"; row.len()].join(",");
            conn.execute(
                &format!("INSERT INTO memscope_dump VALUES ({marks})"),
                rusqlite::params_from_iter(row.iter()),
            )
            .unwrap();
        }
        path
    }

    fn db_row(id: i64, attr: &str, stack: rusqlite::types::Value) -> Vec<rusqlite::types::Value> {
        use rusqlite::types::Value;
        let t = |s: &str| Value::Text(s.into());
        vec![
            Value::Integer(id),
            t("MALLOC"),
            t("PTA"),
            t("N/A"),
            Value::Integer(5),
            Value::Integer(1),
            Value::Integer(1),
            t("cpu"),
            t("0x10"),
            t(attr),
            stack,
            t(""),
        ]
    }

    const LOOSE: &str = "CREATE TABLE memscope_dump (\"ID\", \"Event\", \"Event Type\", \"Name\", \"Timestamp(ns)\", \"Process Id\", \"Thread Id\", \"Device Id\", \"Ptr\", \"Attr\", \"Call Stack(Python)\", \"Call Stack(C)\")";

    #[test]
    fn sqlite_dumps_are_checked_like_csv() {
        use rusqlite::types::Value;
        let path = db(
            "schema.db",
            "CREATE TABLE memscope_dump (\"ID\" INTEGER, \"Event\" TEXT)",
            &[],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: table memscope_dump lacks column \"Event Type\"",
                path.display()
            )
        );
        let path = db("none.db", "CREATE TABLE other (a)", &[]);
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: no table memscope_dump",
                path.display()
            )
        );
        let path = temp("text.db", &format!("{HEADER}\n"));
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: not an SQLite database",
                path.display()
            )
        );

        let big = "{\"size\":18446744073709551616}";
        let path = db(
            "overflow.db",
            crate::events::db::CREATE_TABLE,
            &[&db_row(1, big, Value::Null)],
        );
        assert_eq!(
            first_error(&path),
            format!("{}:1: malformed row: Attr \"size\" is not an integer from 0 to 18446744073709551615: \"18446744073709551616\"", path.display())
        );
        let path = db(
            "utf8.db",
            LOOSE,
            &[
                &db_row(1, "{}", Value::Null),
                &db_row(2, "{}", Value::Text(String::new())),
            ],
        );
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute(
                "UPDATE memscope_dump SET \"Name\" = CAST(x'ff00' AS TEXT) WHERE \"ID\" = 2",
                [],
            )
            .unwrap();
        }
        assert_eq!(
            first_error(&path),
            format!("{}:2: malformed row: Name is not UTF-8", path.display())
        );
        let path = db(
            "blob.db",
            LOOSE,
            &[&db_row(7, "{}", Value::Blob(vec![1, 2]))],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}:7: malformed row: Call Stack(Python) is a BLOB, not text",
                path.display()
            )
        );

        // A value over the cap is refused by SQLite before it is loaded.
        let huge = Value::Text("x".repeat(MAX_ROW_BYTES + 1));
        let path = db(
            "long.db",
            crate::events::db::CREATE_TABLE,
            &[&db_row(1, "{}", Value::Null), &db_row(2, "{}", huge)],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}: row 2 is longer than 16777216 bytes: not a memscope dump",
                path.display()
            )
        );
        remove(&[&path]);
        // So is a row whose values add up past it.
        let half = || Value::Text("x".repeat(MAX_ROW_BYTES / 2 + 1));
        let mut row = db_row(1, "{}", half());
        row[11] = half();
        let path = db("sum.db", crate::events::db::CREATE_TABLE, &[&row]);
        assert_eq!(
            first_error(&path),
            format!(
                "{}: row 1 is longer than 16777216 bytes: not a memscope dump",
                path.display()
            )
        );
        remove(&[&path]);
    }

    #[test]
    fn sqlite_repeats_are_found_across_pages() {
        use rusqlite::types::Value;
        // Two 5 MiB rows end a page (PAGE_BYTES); the repeat of the second starts the next.
        let stack = || Value::Text("x".repeat(5 << 20));
        let rows = [
            db_row(1, "{}", stack()),
            db_row(2, "{}", stack()),
            db_row(2, "{}", Value::Null),
            db_row(3, "{}", Value::Null),
        ];
        let refs: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
        let path = db("repeat.db", LOOSE, &refs);
        assert_eq!(
            first_error(&path),
            format!(
                "{}:2: malformed row: ID 2 repeats the previous row's ID",
                path.display()
            )
        );
        remove(&[&path]);
        // Without the repeat every row is read once, in ID order.
        let rows = [
            db_row(3, "{}", stack()),
            db_row(1, "{}", stack()),
            db_row(2, "{}", stack()),
            db_row(4, "{}", Value::Null),
        ];
        let refs: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
        let path = db("pages.db", LOOSE, &refs);
        let ids: Vec<u64> = open(&path).unwrap().map(|r| r.unwrap().id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        remove(&[&path]);
    }
}
