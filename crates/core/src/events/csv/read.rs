//! The reference CSV reader: one record at a time (RFC 4180; quoted fields may span lines).

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::write::HEADER;
use crate::events::fields::parse_fields;
use crate::events::row::EventRow;
use crate::events::source::{io_error, open_regular, IdOrder, ReadError, MAX_ROW_BYTES};

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
