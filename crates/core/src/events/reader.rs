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

use std::path::{Path, PathBuf};

use super::row::EventRow;

pub use super::attrs::{check_attrs, NUMERIC_ATTRS};
pub use super::csv::read::CsvRows;
use super::csv::scan::FastCsv;
pub use super::source::{count_line_ends, Progress, ReadError, RowSource, MAX_ROW_BYTES};
pub use super::sqlite::read::DbRows;

/// The rows of a dump (`.csv`, `.db` or `.parquet`), in file order: the file, then the step
/// parts a bounded run kept beside it (`super::parts`), with one note on stderr naming the
/// steps whose rows are gone.
pub fn open(
    path: &Path,
) -> Result<Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>, ReadError> {
    let chain = Chain::of(path, open_file)?;
    if chain.rest.is_empty() {
        return Ok(chain.current);
    }
    Ok(Box::new(chain))
}

/// The step part files (and later segments) kept beside a dump's head (none for a run within
/// its budget), after the notes about a run that ended early, the steps whose rows are gone
/// and the segment a killed run left unfinished.
fn parts_of(path: &Path) -> Vec<PathBuf> {
    super::run_end::say_once(path);
    for open in super::parts::open_segments(path) {
        eprintln!(
            "msmemscope: note: {}",
            super::parts::open_segment_note(&open)
        );
    }
    let files = super::parts::dump_files(path);
    if files.len() > 1 {
        if let Some(note) = super::parts::coverage_note(path, &files) {
            eprintln!("msmemscope: note: {note}");
        }
    }
    files.into_iter().skip(1).collect()
}

/// A dump's files read one after another, as one stream of rows in ascending ID order.
struct Chain<S> {
    current: S,
    /// The file being read.
    path: PathBuf,
    /// The files still to read, the next one last.
    rest: Vec<PathBuf>,
    /// How each file is opened.
    open: fn(&Path) -> Result<S, ReadError>,
    last_id: Option<u64>,
    failed: bool,
}

impl<S> Chain<S> {
    /// The dump at `path` (its head) and the parts kept beside it.
    fn of(path: &Path, open: fn(&Path) -> Result<S, ReadError>) -> Result<Chain<S>, ReadError> {
        let mut rest = parts_of(path);
        rest.reverse();
        Ok(Chain {
            current: open(path)?,
            path: path.to_path_buf(),
            rest,
            open,
            last_id: None,
            failed: false,
        })
    }

    /// Whether `row` (the first of a file) comes after the previous file's rows.
    fn in_order(&mut self, id: u64) -> Result<(), ReadError> {
        if self.last_id.is_some_and(|last| id <= last) {
            self.failed = true;
            return Err(ReadError::BadRow {
                path: self.path.clone(),
                line: 2,
                reason: format!(
                    "ID {id} comes after ID {} of the dump's earlier file: rows must be in \
                     ascending ID order",
                    self.last_id.unwrap_or(0)
                ),
            });
        }
        Ok(())
    }
}

type Rows = Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>;

impl Iterator for Chain<Rows> {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.failed {
                return None;
            }
            match self.current.next() {
                Some(Ok(row)) => {
                    if let Err(e) = self.in_order(row.id) {
                        return Some(Err(e));
                    }
                    self.last_id = Some(row.id);
                    return Some(Ok(row));
                }
                Some(Err(e)) => {
                    self.failed = true;
                    return Some(Err(e));
                }
                None => {
                    let next = self.rest.pop()?;
                    match (self.open)(&next) {
                        Ok(rows) => {
                            self.current = rows;
                            self.path = next;
                        }
                        Err(e) => {
                            self.failed = true;
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
    }
}

impl RowSource for Chain<Box<dyn RowSource>> {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        loop {
            if self.failed {
                return Ok(None);
            }
            let id = match self.current.next_row() {
                Ok(Some(row)) => Some(row.id),
                Ok(None) => None,
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            };
            match id {
                Some(id) => {
                    self.in_order(id)?;
                    self.last_id = Some(id);
                    return Ok(self.current.current());
                }
                None => {
                    let Some(next) = self.rest.pop() else {
                        return Ok(None);
                    };
                    self.current = (self.open)(&next).inspect_err(|_| self.failed = true)?;
                    self.path = next;
                }
            }
        }
    }

    fn current(&self) -> Option<&EventRow> {
        if self.failed {
            return None;
        }
        self.current.current()
    }

    fn progress(&self) -> Option<Progress> {
        self.current.progress()
    }
}

/// The rows of one dump file, in file order.
fn open_file(
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

fn warn_cut_last_row(e: &ReadError) {
    if let ReadError::BadRow { path, line, .. } = e {
        eprintln!(
            "msmemscope: warning: {}:{line}: the last row is cut off (the writing stopped inside \
             it: {}); it is left out, the rows before it are read",
            path.display(),
            super::run_end::cut_row_cause(path)
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
            Err(e) if super::source::is_cut_last_row(&self.path, &e) => {
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
            if super::source::is_cut_last_row(&self.path, &e) {
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

    fn progress(&self) -> Option<Progress> {
        self.inner.progress()
    }
}

/// The rows of a dump (`.csv`, `.db` or `.parquet`, and the step parts a bounded run kept
/// beside it), in file order, through the fastest reader for its format: CSV dumps are parsed
/// on worker threads ([`super::scan`]).
pub fn open_rows(path: &Path) -> Result<Box<dyn RowSource>, ReadError> {
    let chain = Chain::of(path, open_rows_file)?;
    if chain.rest.is_empty() {
        return Ok(chain.current);
    }
    Ok(Box::new(chain))
}

/// [`open_rows`] of one file.
fn open_rows_file(path: &Path) -> Result<Box<dyn RowSource>, ReadError> {
    if let Some(rewritten) = super::original::normalize_if_original(path)? {
        return Ok(Box::new(Rewritten {
            inner: FastCsv::open(&rewritten.csv)?,
            _file: rewritten,
        }));
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") | Some("parquet") => Ok(Box::new(Owned {
            rows: open_file(path)?,
            row: None,
        })),
        _ => Ok(Box::new(CutTail {
            inner: FastCsv::open(path)?,
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

    fn progress(&self) -> Option<Progress> {
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

#[cfg(test)]
mod tests;
