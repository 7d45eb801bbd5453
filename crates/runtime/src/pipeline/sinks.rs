//! Where rows go: `device_{id}/dump/memscope_dump_{ts}.csv` or `.db` (SPEC §6). One file per
//! device, opened on the first row for that device; rows without a device (marks, steps, op
//! launches) go to every device file open at the time. Until the first device file opens they
//! wait in memory (so `--device=cuda:0` makes no CPU file just for them); if the run ends
//! without any device row, they go to the CPU file.
//!
//! `--format parquet` writes the CSV as a journal (a Parquet file is only readable once its
//! footer is written, and a killed process writes none): flushed as the CSV is, so a crash
//! loses what a CSV run loses, and turned into `memscope_dump_{ts}.parquet` when the run ends
//! ([`convert_journals`]), by the launcher in launched runs (it outlives a killed target).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use msmemscope_core::config::DataFormat;
use msmemscope_core::events::sqlite::write as db;
use msmemscope_core::events::{csv, DeviceId, EventRow};
use msmemscope_core::held_fd::HeldFile;
use msmemscope_core::run_dir::RunDir;

trait Sink: Send {
    fn write(&mut self, row: &EventRow) -> Result<(), String>;
    /// Makes everything written so far durable against a crash of the process.
    fn flush(&mut self) -> Result<(), String>;
}

struct CsvSink {
    /// Held by identity: a descriptor the program closed and reused is never written.
    file: std::io::BufWriter<HeldFile>,
    scratch: String,
}

impl Sink for CsvSink {
    fn write(&mut self, row: &EventRow) -> Result<(), String> {
        self.scratch.clear();
        csv::write_row(&mut self.scratch, row);
        self.file
            .write_all(self.scratch.as_bytes())
            .map_err(|e| e.to_string())
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
    fn write(&mut self, row: &EventRow) -> Result<(), String> {
        if !self.pending {
            self.conn
                .execute_batch("BEGIN")
                .map_err(|e| e.to_string())?;
            self.pending = true;
        }
        db::insert(&self.conn, row).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        if self.pending {
            self.pending = false;
            self.conn
                .execute_batch("COMMIT")
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Device-less rows held for the first device file at most: past them, they go to the CPU file,
/// where the run's end would put them too. A run whose rows have no device (`--events=launch`)
/// would otherwise hold its whole dump in memory, and write none of it before exit.
const UNROUTED_ROWS: usize = 1 << 16;

/// The dump files of one run.
pub struct Sinks {
    run_dir: Arc<RunDir>,
    format: DataFormat,
    stamp: String,
    open: BTreeMap<DeviceId, Box<dyn Sink>>,
    /// Device-less rows written before any device file existed (at most [`UNROUTED_ROWS`]).
    unrouted: Vec<EventRow>,
    /// Files created so far (for the end-of-run summary).
    pub paths: Vec<PathBuf>,
    /// The same files reached through the run directory's descriptor, for reading back.
    held_paths: Vec<PathBuf>,
    /// `--format parquet`: the CSV journals, relative to the run directory.
    journals: Vec<PathBuf>,
}

impl Sinks {
    pub fn new(run_dir: &Arc<RunDir>, format: DataFormat) -> Sinks {
        Sinks {
            run_dir: run_dir.clone(),
            format,
            stamp: msmemscope_core::run_dir::local_timestamp(),
            open: BTreeMap::new(),
            unrouted: Vec::new(),
            paths: Vec::new(),
            held_paths: Vec::new(),
            journals: Vec::new(),
        }
    }

    /// `--format parquet`: the CSV journals written so far (relative to the run directory).
    pub fn journals(&self) -> Vec<PathBuf> {
        self.journals.clone()
    }

    fn sink_for(&mut self, device: DeviceId) -> Result<&mut Box<dyn Sink>, String> {
        if !self.open.contains_key(&device) {
            let dir = Path::new(device.dir_name().as_str()).join("dump");
            let (sink, relative): (Box<dyn Sink>, PathBuf) = match self.format {
                DataFormat::Csv | DataFormat::Parquet => {
                    let (path, mut file) = if self.format == DataFormat::Parquet {
                        // The Parquet file's name must be free too when the journal ends.
                        create_unique(&self.run_dir, &dir, &self.stamp, "csv", Some("parquet"))?
                    } else {
                        create_unique(&self.run_dir, &dir, &self.stamp, "csv", None)?
                    };
                    if self.format == DataFormat::Parquet {
                        self.journals.push(path.clone());
                    }
                    writeln!(file, "{}", csv::HEADER).map_err(|e| e.to_string())?;
                    let file = HeldFile::new(file, &self.run_dir.path().join(&path))
                        .map_err(|e| e.to_string())?;
                    let file = std::io::BufWriter::with_capacity(1 << 20, file);
                    (
                        Box::new(CsvSink {
                            file,
                            scratch: String::new(),
                        }),
                        path,
                    )
                }
                DataFormat::Db => {
                    // Create the file ourselves first: exclusive and never through a symlink.
                    let (path, file) = create_unique(&self.run_dir, &dir, &self.stamp, "db", None)?;
                    drop(file);
                    // SQLite opens by name (and makes its journal next to it): the name goes
                    // through the held descriptor (/proc/self/fd/N/...), not the run's path.
                    let conn = rusqlite::Connection::open(self.run_dir.resolved().join(&path))
                        .map_err(|e| e.to_string())?;
                    conn.execute_batch(db::CREATE_TABLE)
                        .map_err(|e| e.to_string())?;
                    (
                        Box::new(DbSink {
                            conn,
                            pending: false,
                        }),
                        path,
                    )
                }
            };
            let mut sink = sink;
            if self.open.is_empty() {
                for waiting in self.unrouted.drain(..) {
                    sink.write(&waiting)?;
                }
            } else {
                self.replay_deviceless(sink.as_mut())?;
            }
            self.paths.push(self.run_dir.path().join(&relative));
            self.held_paths
                .push(self.run_dir.resolved().join(&relative));
            self.open.insert(device, sink);
        }
        Ok(self.open.get_mut(&device).expect("just inserted"))
    }

    /// A device file that opens after another starts with the rows without a device written so
    /// far (marks, steps, op launches), read back from the first file: every device's dump then
    /// holds the whole step and mark structure, as offline analyses of one file need.
    fn replay_deviceless(&mut self, sink: &mut dyn Sink) -> Result<(), String> {
        for open in self.open.values_mut() {
            open.flush()?;
        }
        let Some(first) = self.held_paths.first() else {
            return Ok(());
        };
        // The reader of the format written (not `reader::open`, whose Parquet reader the
        // runtime does not need to carry).
        use msmemscope_core::events::reader::{CsvRows, DbRows};
        let rows: Box<dyn Iterator<Item = _>> = match self.format {
            DataFormat::Db => Box::new(DbRows::open(first).map_err(|e| e.to_string())?),
            DataFormat::Csv | DataFormat::Parquet => {
                Box::new(CsvRows::open(first).map_err(|e| e.to_string())?)
            }
        };
        for row in rows {
            let row = row.map_err(|e| e.to_string())?;
            if row.device == DeviceId::None {
                sink.write(&row)?;
            }
        }
        Ok(())
    }

    /// Writes one row (rows arrive in time order).
    pub fn write(&mut self, row: &EventRow) -> Result<(), String> {
        if row.device == DeviceId::None {
            if self.open.is_empty() {
                if self.unrouted.len() < UNROUTED_ROWS {
                    self.unrouted.push(row.clone());
                    return Ok(());
                }
                self.sink_for(DeviceId::Cpu)?;
            }
            for sink in self.open.values_mut() {
                sink.write(row)?;
            }
            Ok(())
        } else {
            self.sink_for(row.device)?.write(row)
        }
    }

    /// Makes everything written durable; `last` also places rows still waiting for a device.
    pub fn flush(&mut self, last: bool) -> Result<(), String> {
        if last && self.open.is_empty() && !self.unrouted.is_empty() {
            self.sink_for(DeviceId::Cpu)?;
        }
        for sink in self.open.values_mut() {
            sink.flush()?;
        }
        Ok(())
    }
}

/// `memscope_dump_{stamp}.{ext}`, or with `_2`, `_3`… when a file of that name exists (another
/// process of the run wrote it in the same second), or one of that stem and extension `also`.
fn create_unique(
    run_dir: &RunDir,
    dir: &Path,
    stamp: &str,
    ext: &str,
    also: Option<&str>,
) -> Result<(PathBuf, std::fs::File), String> {
    let mut last_error = String::new();
    for n in 1..100 {
        let stem = if n == 1 {
            format!("memscope_dump_{stamp}")
        } else {
            format!("memscope_dump_{stamp}_{n}")
        };
        if let Some(also) = also {
            let taken = run_dir
                .open_dir(dir)
                .and_then(|d| d.has_entry(Path::new(&format!("{stem}.{also}"))));
            if matches!(taken, Ok(true)) {
                continue;
            }
        }
        // The directories on the way (`device_*/dump/`) are made 0750 by the same helper.
        let relative = dir.join(format!("{stem}.{ext}"));
        match run_dir.create_file(&relative) {
            Ok(file) => return Ok((relative, file)),
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
}

/// Turns each `--format parquet` journal into `memscope_dump_{ts}.parquet` beside it and
/// removes the journal; a journal that cannot be converted stays, and the log says why (it is
/// a complete CSV dump, and `msmemscope export --format parquet` converts it later).
pub fn convert_journals(run_dir: &RunDir, journals: &[PathBuf]) {
    use msmemscope_core::events::parquet::export::{export, Source};
    for journal in journals {
        let (Some(parent), Some(name)) = (journal.parent(), journal.file_name()) else {
            continue;
        };
        let name = name.to_string_lossy();
        let converted = run_dir
            .open_dir(parent)
            .map_err(|e| format!("cannot open {}: {e}", run_dir.path().join(parent).display()))
            .and_then(|dir| export(&dir, &name, Source::Journal, false).map_err(|e| e.to_string()));
        match converted {
            Ok(done) => crate::log::info(&format!(
                "event dump: {} ({} rows{})",
                done.path.display(),
                done.rows,
                if done.cut_row_left_out {
                    "; the journal's last row was cut off and is left out"
                } else {
                    ""
                }
            )),
            Err(e) => crate::log::error(&format!(
                "event dump: not converted to Parquet: {e}; the rows stay in {}",
                run_dir.path().join(journal).display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msmemscope_core::events::{Event, EventType};

    fn rows_in(dir: &Path) -> usize {
        let files: Vec<_> = std::fs::read_dir(dir.join("device_cpu/dump"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap().lines().count() - 1)
            .sum()
    }

    /// Device-less rows wait for the first device file only up to a bound: then they go to the
    /// CPU file, and later ones are written as they come.
    #[test]
    fn device_less_rows_wait_for_a_device_file_only_so_long() {
        let dir = std::env::temp_dir().join(format!("msmemscope_sinks_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run_dir = Arc::new(RunDir::open(&dir).unwrap());
        let mut sinks = Sinks::new(&run_dir, DataFormat::Csv);
        let row = EventRow::new(Event::OpLaunch, EventType::AtenStart, "aten::mm.default");
        for _ in 0..UNROUTED_ROWS {
            sinks.write(&row).unwrap();
        }
        sinks.flush(false).unwrap();
        assert_eq!(rows_in(&dir), 0, "held for a device file");
        for _ in 0..3 {
            sinks.write(&row).unwrap();
        }
        sinks.flush(false).unwrap();
        assert_eq!(rows_in(&dir), UNROUTED_ROWS + 3);
        assert!(sinks.unrouted.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
