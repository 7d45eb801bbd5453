//! The dump's file formats, one row at a time: CSV, SQLite, and (in `super::segments`) a
//! Parquet segment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use msmemscope_core::config::DataFormat;
use msmemscope_core::events::sqlite::write as db;
use msmemscope_core::events::{csv, EventRow};
use msmemscope_core::held_fd::HeldFile;
use msmemscope_core::run_dir::RunDir;

use super::segments::ParquetSink;

pub(super) trait Sink: Send {
    /// Writes one row; the bytes it took in the file (an estimate where the format can't say).
    fn write(&mut self, row: &EventRow) -> Result<u64, String>;
    /// Makes everything written so far durable against a crash of the process (a Parquet
    /// segment's rows only once it is closed).
    fn flush(&mut self) -> Result<(), String>;
    /// Whether the file is to be closed now, its rows made readable (a Parquet segment).
    fn due(&self, _now: Instant) -> bool {
        false
    }
    /// Completes the file.
    fn close(mut self: Box<Self>) -> Result<(), String> {
        self.flush()
    }
}

struct CsvSink {
    /// Held by identity: a descriptor the program closed and reused is never written.
    file: std::io::BufWriter<HeldFile>,
    scratch: String,
    rows: csv::RowWriter,
}

impl Sink for CsvSink {
    fn write(&mut self, row: &EventRow) -> Result<u64, String> {
        self.scratch.clear();
        self.rows.write(&mut self.scratch, row);
        self.file
            .write_all(self.scratch.as_bytes())
            .map_err(|e| e.to_string())?;
        Ok(self.scratch.len() as u64)
    }

    fn flush(&mut self) -> Result<(), String> {
        // In the kernel's page cache the data outlives the process.
        self.file.flush().map_err(|e| e.to_string())
    }
}

struct DbSink {
    conn: rusqlite::Connection,
    pending: bool,
}

impl Sink for DbSink {
    fn write(&mut self, row: &EventRow) -> Result<u64, String> {
        if !self.pending {
            self.conn
                .execute_batch("BEGIN")
                .map_err(|e| e.to_string())?;
            self.pending = true;
        }
        if let Err(e) = db::insert(&self.conn, row) {
            self.abandon();
            return Err(e.to_string());
        }
        // SQLite says its size only per page: the texts and the numbers' columns.
        Ok((row.name.len()
            + row.attrs_json.as_ref().map_or(64, String::len)
            + row.python_stack.len()
            + row.c_stack.len()
            + 48) as u64)
    }

    fn flush(&mut self) -> Result<(), String> {
        if self.pending {
            self.pending = false;
            if let Err(e) = self.conn.execute_batch("COMMIT") {
                self.abandon();
                return Err(e.to_string());
            }
        }
        Ok(())
    }
}

impl DbSink {
    /// Rolls the failed transaction back (a full disk, the file size limit): the file keeps
    /// the rows committed before it, and no hot journal is left, which a reader would have to
    /// write to roll back (readers open the dump read-only).
    fn abandon(&mut self) {
        let _ = self.conn.execute_batch("ROLLBACK");
        self.pending = false;
        // After an I/O error SQLite may refuse the rollback and keep the journal until the
        // connection closes, which the runtime's never does: a fresh connection takes over, and
        // its first read rolls the journal back once the old one has let go of its locks.
        let Some(path) = self.conn.path().map(PathBuf::from) else {
            return;
        };
        if let Ok(fresh) = rusqlite::Connection::open(&path) {
            drop(std::mem::replace(&mut self.conn, fresh));
            let _ = self
                .conn
                .query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()));
        }
    }
}

/// A new dump file of `format` at `relative` in the run directory (created before,
/// exclusively, as `file`: a Parquet segment under its `.open` name); a Parquet segment closes
/// after `age`.
pub(super) fn open(
    format: DataFormat,
    run_dir: &RunDir,
    relative: &Path,
    file: std::fs::File,
    age: Duration,
) -> Result<Box<dyn Sink>, String> {
    match format {
        DataFormat::Parquet => Ok(Box::new(ParquetSink::new(run_dir, relative, file, age)?)),
        DataFormat::Csv => {
            let mut file = file;
            writeln!(file, "{}", csv::HEADER).map_err(|e| e.to_string())?;
            let file =
                HeldFile::new(file, &run_dir.path().join(relative)).map_err(|e| e.to_string())?;
            Ok(Box::new(CsvSink {
                file: std::io::BufWriter::with_capacity(1 << 20, file),
                scratch: String::new(),
                rows: csv::RowWriter::default(),
            }))
        }
        DataFormat::Db => {
            drop(file);
            // SQLite opens by name (and makes its journal next to it): the name goes
            // through the held descriptor (/proc/self/fd/N/...), not the run's path.
            let conn = rusqlite::Connection::open(run_dir.resolved().join(relative))
                .map_err(|e| e.to_string())?;
            conn.execute_batch(db::CREATE_TABLE)
                .map_err(|e| e.to_string())?;
            Ok(Box::new(DbSink {
                conn,
                pending: false,
            }))
        }
    }
}
