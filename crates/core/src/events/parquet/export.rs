//! A dump file turned into `memscope_dump_{ts}.parquet` beside it, inside a held directory:
//! read through [`crate::events::reader`] (every dump check applies), written to
//! `memscope_dump_{ts}.parquet.{pid}.partial` (created exclusively, never through a symlink)
//! and given its name only when complete, never over an existing entry. Used by
//! `msmemscope export --format parquet`, and for `--format parquet` runs by the launcher (after
//! its target ends, however it ends) and the runtime (at exit, in runs without a launcher),
//! which convert the run's CSV journal.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::writer::{ParquetWriter, WriteError};
use crate::events::csv::read::CsvRows;
use crate::events::csv::scan::FastCsv;
use crate::events::original;
use crate::events::source::{count_line_ends, is_cut_last_row, ReadError, RowSource};
use crate::events::sqlite::read::DbRows;
use crate::run_dir::RunDir;

/// What the file being exported is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A finished dump (`.csv` or `.db`): read strictly and kept.
    Dump,
    /// The CSV journal of a `--format parquet` run: its last row may have been cut off by a
    /// kill of the process that wrote it (that row is left out, and said); removed once the
    /// Parquet file has its name.
    Journal,
}

/// A written Parquet file.
#[derive(Debug)]
pub struct Exported {
    /// Its path (the directory's path joined with its name).
    pub path: PathBuf,
    pub rows: u64,
    /// The last row, cut off where the writing stopped (a journal's by a kill, a kept dump's
    /// by a kill or a failed write), was left out.
    pub cut_row_left_out: bool,
}

/// Why no Parquet file was written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The Parquet file's name is taken (by an earlier export, or anything else): left alone.
    #[error("{path} exists: left alone")]
    Exists { path: PathBuf },
    /// The input is not a readable dump (one line naming the file and the row).
    #[error("{0}")]
    Read(ReadError),
    /// A row holds a value Parquet's signed INT64 cannot hold.
    #[error("{path}: {source}")]
    Row { path: PathBuf, source: WriteError },
    /// Writing failed.
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
    /// The name is not a dump's.
    #[error(
        "{path}: not a dump file name (memscope_dump_*.csv or .db, or a step part step_*_*.csv)"
    )]
    NotADumpName { path: PathBuf },
}

impl ExportError {
    /// Whether the input is to blame (a usage error: exit status 2), not the output.
    pub fn is_input(&self) -> bool {
        match self {
            ExportError::Read(e) => !matches!(e, ReadError::Io { .. }),
            ExportError::Row { source, .. } => matches!(source, WriteError::TooLarge { .. }),
            ExportError::NotADumpName { .. } => true,
            ExportError::Exists { .. } | ExportError::Write { .. } => false,
        }
    }
}

/// `memscope_dump_{ts}.parquet` for the dump `memscope_dump_{ts}.csv` or `.db`, and
/// `step_{S}_{P}.parquet` for a bounded run's step part (`crate::events::parts`).
pub fn parquet_name(dump: &str) -> Option<String> {
    let stem = dump
        .strip_suffix(".csv")
        .or_else(|| dump.strip_suffix(".db"))?;
    (stem.starts_with("memscope_dump_") || crate::events::parts::is_part_name(dump))
        .then(|| format!("{stem}.parquet"))
}

/// Writes the Parquet form of the dump `name` of `dir` beside it. With `parallel` the dump is
/// parsed on threads of its own while this one encodes (the CLI; the runtime, inside the
/// program, adds no thread).
pub fn export(
    dir: &RunDir,
    name: &str,
    source: Source,
    parallel: bool,
) -> Result<Exported, ExportError> {
    let shown = dir.path().join(name);
    let target = parquet_name(name).ok_or_else(|| ExportError::NotADumpName {
        path: shown.clone(),
    })?;
    let path = dir.path().join(&target);
    let write_error = |e: &dyn std::fmt::Display| ExportError::Write {
        path: path.clone(),
        message: e.to_string(),
    };
    match dir.has_entry(Path::new(&target)) {
        Ok(true) => return Err(ExportError::Exists { path }),
        Ok(false) => {}
        Err(e) => return Err(write_error(&e)),
    }
    let mut cut = false;
    if source == Source::Journal {
        cut = cut_torn_line(dir, name).map_err(|e| ExportError::Write {
            path: shown.clone(),
            message: e.to_string(),
        })?;
    }
    if source == Source::Dump {
        crate::events::run_end::say_once(&shown);
    }
    // Read through the held descriptor (whatever was renamed since), named by the dump's path.
    let resolved = dir.resolved().join(name);
    // The original tool's dump is exported as the dump of ours it reads as (a journal is ours).
    let rewritten = match source {
        Source::Dump => original::normalize_if_original_as(&resolved, &shown)
            .map_err(|e| read_error(e, &shown))?,
        Source::Journal => None,
    };
    let resolved = rewritten.as_ref().map_or(resolved, |r| r.csv.clone());
    let csv = resolved.extension().is_none_or(|e| e != "db");
    let rows = if parallel && csv {
        // CSV parsed on worker threads, rows borrowed (no copy of each).
        Rows::Fast(FastCsv::open(&resolved).map_err(|e| read_error(e, &shown))?)
    } else {
        Rows::Owned(
            open_dump(&resolved).map_err(|e| read_error(e, &shown))?,
            None,
        )
    };
    let (partial, file) = create_partial(dir, &target).map_err(|e| write_error(&e))?;
    let written = std::thread::scope(|scope| {
        let mut rows = match rows {
            Rows::Owned(rows, _) if parallel => {
                Rows::Owned(Box::new(read_ahead(scope, rows)), None)
            }
            rows => rows,
        };
        let mut out = ParquetWriter::new(std::io::BufWriter::with_capacity(1 << 20, file))
            .map_err(|e| write_error(&e))?;
        loop {
            let row = match rows.next_row() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) if source == Source::Journal && at_last_line(dir, name, &e) => {
                    // A row with a line end inside it, cut after one: the rest is gone.
                    cut = true;
                    break;
                }
                Err(e) if source == Source::Dump && csv && is_cut_last_row(&resolved, &e) => {
                    // A kept dump whose writing stopped inside its last row (a kill, a full
                    // disk), read as the readers read it; the file itself is left as it is.
                    cut = true;
                    break;
                }
                Err(e) => return Err(read_error(e, &shown)),
            };
            out.push(row).map_err(|source| match source {
                WriteError::TooLarge { .. } => ExportError::Row {
                    path: shown.clone(),
                    source,
                },
                e => write_error(&e),
            })?;
        }
        let (buffered, rows) = out.finish().map_err(|e| write_error(&e))?;
        let file = buffered.into_inner().map_err(|e| write_error(e.error()))?;
        // On disk before it has its name: a crash never leaves a named, partial file.
        file.sync_all().map_err(|e| write_error(&e))?;
        Ok(rows)
    });
    let published = written.and_then(|rows| {
        dir.publish(Path::new(&partial), Path::new(&target))
            .map(|()| rows)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => ExportError::Exists { path: path.clone() },
                _ => write_error(&e),
            })
    });
    let rows = match published {
        Ok(rows) => rows,
        Err(e) => {
            let _ = dir.remove_file(Path::new(&partial));
            return Err(e);
        }
    };
    if source == Source::Journal {
        // The rows are in the Parquet file now; a journal that cannot go is only a spare copy.
        let _ = dir.remove_file(Path::new(name));
    }
    Ok(Exported {
        path,
        rows,
        cut_row_left_out: cut,
    })
}

/// The rows of a CSV or SQLite dump, through the format readers (so every dump check
/// applies). Not `reader::open`: what is exported is never Parquet, and the runtime, which
/// exports its journals, then carries no Parquet reader.
fn open_dump(path: &Path) -> Result<Box<dyn Iterator<Item = RowResult> + Send>, ReadError> {
    Ok(match path.extension().and_then(|e| e.to_str()) {
        Some("db") => Box::new(DbRows::open(path)?),
        _ => Box::new(CsvRows::open(path)?),
    })
}

type RowResult = Result<crate::events::EventRow, ReadError>;

/// The rows being exported: the fast CSV reader's borrowed rows, or owned rows from an
/// iterator (a SQLite dump, or any dump when the export must not start reader threads).
#[allow(clippy::large_enum_variant)] // one per export, on the stack
enum Rows<'a> {
    Fast(FastCsv),
    Owned(
        Box<dyn Iterator<Item = RowResult> + Send + 'a>,
        Option<crate::events::EventRow>,
    ),
}

impl Rows<'_> {
    fn next_row(&mut self) -> Result<Option<&crate::events::EventRow>, ReadError> {
        match self {
            Rows::Fast(rows) => rows.next_row(),
            Rows::Owned(rows, current) => match rows.next() {
                Some(Ok(row)) => Ok(Some(&*current.insert(row))),
                Some(Err(e)) => Err(e),
                None => Ok(None),
            },
        }
    }
}

/// Rows handed from the parsing thread at a time.
const BATCH: usize = 4096;

/// `rows` parsed on a scoped thread, handed over in batches; an error is the last item, and
/// dropping the iterator ends the thread.
fn read_ahead<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    rows: Box<dyn Iterator<Item = RowResult> + Send>,
) -> impl Iterator<Item = RowResult> + 'scope {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<RowResult>>(4);
    scope.spawn(move || {
        let mut batch = Vec::with_capacity(BATCH);
        for row in rows {
            let failed = row.is_err();
            batch.push(row);
            if batch.len() == BATCH || failed {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if tx.send(full).is_err() || failed {
                    return;
                }
            }
        }
        if !batch.is_empty() {
            let _ = tx.send(batch);
        }
    });
    rx.into_iter().flatten()
}

/// A read error named by the dump's path rather than the descriptor path it was read by.
fn read_error(e: ReadError, shown: &Path) -> ExportError {
    let path = shown.to_path_buf();
    ExportError::Read(match e {
        ReadError::Missing { .. } => ReadError::Missing { path },
        ReadError::Io { message, .. } => ReadError::Io { path, message },
        ReadError::NotADump { reason, .. } => ReadError::NotADump { path, reason },
        ReadError::BadRow { line, reason, .. } => ReadError::BadRow { path, line, reason },
        ReadError::RowTooLong { line, row, .. } => ReadError::RowTooLong { path, line, row },
    })
}

/// `{target}.{pid}.partial`, created exclusively (another number if a stale one is there).
fn create_partial(dir: &RunDir, target: &str) -> std::io::Result<(String, std::fs::File)> {
    let pid = std::process::id();
    let mut last = None;
    for attempt in 0..100 {
        let name = match attempt {
            0 => format!("{target}.{pid}.partial"),
            n => format!("{target}.{pid}_{n}.partial"),
        };
        match dir.create_file_io(Path::new(&name)) {
            Ok(file) => return Ok((name, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EEXIST)))
}

/// A journal whose process was killed in the middle of a write ends in a partial line: cut it
/// off (what no reader could read) so the rows before it are read. True when it did.
fn cut_torn_line(dir: &RunDir, name: &str) -> std::io::Result<bool> {
    let mut file = dir.open_read_write(Path::new(name))?;
    let len = file.metadata()?.len();
    let mut keep = len;
    let mut block = vec![0u8; 64 << 10];
    while keep > 0 {
        let start = keep.saturating_sub(block.len() as u64);
        let n = (keep - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut block[..n])?;
        match memchr::memrchr(b'\n', &block[..n]) {
            Some(i) => {
                keep = start + i as u64 + 1;
                break;
            }
            None => keep = start,
        }
    }
    // Not even the header is whole: nothing to keep, and the reader says what it is.
    if keep == len || keep == 0 {
        return Ok(false);
    }
    file.set_len(keep)?;
    file.flush()?;
    Ok(true)
}

/// Whether a journal's read error is about its last line: the last record, cut off inside a
/// quoted field after one of its line ends.
fn at_last_line(dir: &RunDir, name: &str, e: &ReadError) -> bool {
    let ReadError::BadRow { line, .. } = e else {
        return false;
    };
    let Ok(file) = dir.open_read_write(Path::new(name)) else {
        return false;
    };
    count_line_ends(file).is_ok_and(|lines| *line == lines)
}
