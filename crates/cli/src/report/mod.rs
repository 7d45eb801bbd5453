//! `msmemscope report DIR`: one self-contained HTML page per run (`msmemscope_report.html` in
//! the run directory), and `msmemscope export --format torch-snapshot|parquet DIR`.
//!
//! Everything heavy happens here, in one streaming pass per dump file: the timeline is reduced
//! to time buckets (`timeline.rs`), the leaks analysis is core's, the other views read the
//! files the run wrote (`sections.rs`). The page (`page.rs`) gets only those aggregates, so it
//! stays small and responsive for any dump size.
//!
//! Exit status: 0 written; 2 when DIR is not a run (or output) directory or a file in it is
//! not what its name says (one line naming it); 1 when writing fails.

mod page;
pub mod parquet;
mod pickle;
pub(crate) mod run_file;
mod sections;
mod timeline;
mod torch_snapshot;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::failure::Failure;
use msmemscope_core::events::reader::{self, ReadError};
use msmemscope_core::events::EventRow;
use serde_json::{json, Value};

pub use torch_snapshot::export as export_torch_snapshot;

/// The page's file name inside the run directory.
pub const REPORT_FILE: &str = "msmemscope_report.html";

/// Whether `dir` is one run's directory (what the launcher or the Python API creates).
fn is_run_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file()
        || dir.join("host_leak").is_dir()
        || dump_files(dir).map(|d| !d.is_empty()).unwrap_or(false)
}

/// The run directories `dir` stands for: itself, or the `msmemscope_*` runs inside an output
/// directory.
pub fn runs_of(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    if !dir.is_dir() {
        return Err(Failure::input(format!(
            "{}: no such directory; give a run directory (msmemscope_PID_TIMESTAMP) or the output directory holding runs",
            dir.display()
        )));
    }
    if is_run_dir(dir) {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut runs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Failure::io(format!("cannot list {}: {e}", dir.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("msmemscope_"))
                && p.is_dir()
                && is_run_dir(p)
        })
        .collect();
    runs.sort();
    if runs.is_empty() {
        return Err(Failure::input(format!(
            "{}: not a run directory (no config.json, device_*/dump/ or host_leak/) and it holds no msmemscope_* runs",
            dir.display()
        )));
    }
    Ok(runs)
}

/// `device_*/dump/memscope_dump_*.{csv,db,parquet}` of a run, with the device directory's
/// name. A `.parquet` beside a `.csv` or `.db` of the same name is its export, the same rows:
/// only the original is listed, so no row is read twice.
pub fn dump_files(run: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(run) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("device_") || !entry.path().is_dir() {
            continue;
        }
        let Ok(dumps) = std::fs::read_dir(entry.path().join("dump")) else {
            continue;
        };
        let mut here = Vec::new();
        for dump in dumps.flatten() {
            let file = dump.file_name().to_string_lossy().into_owned();
            if file.starts_with("memscope_dump_")
                && [".csv", ".db", ".parquet"]
                    .iter()
                    .any(|e| file.ends_with(e))
            {
                here.push(dump.path());
            }
        }
        let exported = |p: &PathBuf| {
            p.extension().is_some_and(|e| e == "parquet")
                && ["csv", "db"]
                    .iter()
                    .any(|e| here.contains(&p.with_extension(e)))
        };
        let originals: Vec<PathBuf> = here.iter().filter(|p| !exported(p)).cloned().collect();
        files.extend(originals.into_iter().map(|p| (name.clone(), p)));
    }
    files.sort();
    Ok(files)
}

/// Whether the run's configuration (config.json) has the OOM analysis among its analyses
/// (`"oom"`, or `{"oom": K}`). Without the file (a dump from elsewhere), yes.
fn asks_for_oom(config: &Value) -> bool {
    match config.get("analysis").and_then(Value::as_array) {
        Some(analyses) => analyses
            .iter()
            .any(|a| a.as_str() == Some("oom") || a.get("oom").is_some()),
        None => true,
    }
}

/// Reads one run and writes its page; returns the page's path.
pub fn generate(run: &Path) -> Result<PathBuf, Failure> {
    let dumps =
        dump_files(run).map_err(|e| Failure::io(format!("cannot list {}: {e}", run.display())))?;
    let mut timelines: Vec<timeline::Timeline> =
        dumps.iter().map(|_| timeline::Timeline::new()).collect();
    let mut leaks = sections::LeakSection::new();
    let config: Value = read_config(&run.join("config.json"))
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let mut oom = sections::OomSection::new(asks_for_oom(&config));
    let mut decompose = sections::DecomposeSection::new();
    // The files are merged by row ID, the writer's global numbering: each timeline sees its
    // own file's rows, and the run-wide analyses see every row once, in the order the online
    // analyses saw them (a row without a device is in every file under the same ID).
    let mut inputs = Vec::with_capacity(dumps.len());
    for (_, path) in &dumps {
        let mut rows = reader::open_rows(path)?;
        rows.next_row()?;
        inputs.push(rows);
    }
    let _bar = crate::progress::over_readers(
        format!("report {}", run.display()),
        inputs.iter().filter_map(|rows| rows.progress()).collect(),
    );
    let mut last_id = None;
    loop {
        let next = inputs
            .iter()
            .enumerate()
            .filter_map(|(i, rows)| rows.current().map(|row| (row.id, i)))
            .min();
        let Some((id, i)) = next else { break };
        let row = inputs[i].current().expect("the row was just looked at");
        timelines[i].feed(row);
        if last_id != Some(id) {
            leaks.feed(row);
            oom.feed(row);
            decompose.feed(row);
            last_id = Some(id);
        }
        inputs[i].next_row()?;
    }
    let timelines: Vec<Value> = timelines
        .iter()
        .zip(&dumps)
        .map(|(timeline, (device_dir, path))| {
            let file = path.strip_prefix(run).unwrap_or(path).to_string_lossy();
            let label = device_dir.strip_prefix("device_").unwrap_or(device_dir);
            timeline.to_json(label, &file)
        })
        .collect();
    let mut leaks = leaks.finish();
    if dumps
        .iter()
        .any(|(_, path)| msmemscope_core::events::parts::coverage(path).is_some())
    {
        // Rows of some steps are gone: the findings the run made online saw them all.
        online_findings(run, &mut leaks);
    }
    let data = json!({
        "run": run.file_name().map(|n| n.to_string_lossy().into_owned()),
        "generated_by": crate::args::version_text(),
        "config": config,
        "timelines": timelines,
        "leaks": if dumps.is_empty() { Value::Null } else { sections::leaks_json(leaks) },
        "oom": oom.finish(),
        "decompose": decompose.finish(),
        "compare": sections::compare_json(run).map_err(Failure::input)?,
        "watch": sections::watch_json(run).map_err(Failure::input)?,
        "host_leak": sections::host_leak_json(run).map_err(Failure::input)?,
    });
    let html = page::render(&data);
    let path = run.join(REPORT_FILE);
    write_file(&path, html.as_bytes())?;
    Ok(path)
}

/// The leaks analysis's findings and report text as the run wrote them online, in place of
/// those made again from a dump that kept only some steps' rows (where the files are there).
fn online_findings(run: &Path, outcome: &mut sections::LeakOutcome) {
    let read = |relative: &str| {
        let path = run.join(relative);
        let small = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.is_file() && m.len() <= MAX_ONLINE_FILE);
        small.then(|| std::fs::read_to_string(&path).ok()).flatten()
    };
    if let Some(findings) = read(msmemscope_core::analysis::leaks::findings::FINDINGS_FILE)
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
    {
        outcome.findings = findings;
    }
    if let Some(peak) = read(msmemscope_core::analysis::leaks::peak::PEAK_FILE)
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
    {
        outcome.peak = peak;
    }
    if let Some(text) = read(msmemscope_core::analysis::leaks::REPORT_FILE) {
        outcome.text = text;
    }
}

/// The largest online analysis file the page takes in place of its own.
const MAX_ONLINE_FILE: u64 = 64 << 20;

/// The run's `config.json` as text, when it is a regular file of a config's size: the page
/// shows it if it can, and a FIFO or a device in its place must neither block nor fill memory.
pub(super) fn read_config(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const MAX_CONFIG_BYTES: u64 = 1 << 20;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Rows handed from the reading thread at a time, and the bytes after which a batch goes
/// early: with rows up to the reader's cap, a count alone would not bound what waits in the
/// channel.
const BATCH: usize = 4096;
const BATCH_BYTES: usize = 4 << 20;

/// About what a row holds on the heap.
fn row_bytes(row: &EventRow) -> usize {
    128 + row.name.len()
        + row.python_stack.len()
        + row.c_stack.len()
        + row.attrs_json.as_ref().map_or(0, String::len)
}

/// A dump's rows, parsed on a thread of their own and handed over in batches, so parsing runs
/// beside the aggregation. An error is the last item; dropping the iterator stops the thread.
pub fn read_ahead(path: PathBuf) -> impl Iterator<Item = Result<EventRow, ReadError>> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Result<EventRow, ReadError>>>(8);
    std::thread::spawn(move || {
        let mut rows = match reader::open_rows(&path) {
            Ok(rows) => rows,
            Err(e) => {
                let _ = tx.send(vec![Err(e)]);
                return;
            }
        };
        let mut batch = Vec::with_capacity(BATCH);
        let mut bytes = 0;
        loop {
            let row = match rows.next_row() {
                Ok(Some(row)) => Ok(row.clone()),
                Ok(None) => break,
                Err(e) => Err(e),
            };
            let failed = row.is_err();
            bytes += row.as_ref().map_or(0, row_bytes);
            batch.push(row);
            if batch.len() == BATCH || bytes >= BATCH_BYTES || failed {
                bytes = 0;
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

/// Writes `path` (replacing an earlier report), never through a symlink.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.write_all(bytes));
    file.map_err(|e| Failure::io(format!("cannot write {}: {e}", path.display())))
}

/// `msmemscope report DIR`: prints each page's path.
pub fn run(dir: &Path) -> ExitCode {
    let runs = match runs_of(dir) {
        Ok(runs) => runs,
        Err(failure) => return failure.exit(),
    };
    for run in runs {
        match generate(&run) {
            Ok(path) => println!("{}", path.display()),
            Err(failure) => return failure.exit(),
        }
    }
    ExitCode::SUCCESS
}

/// `msmemscope export --format torch-snapshot DIR`: prints each snapshot's path.
pub fn run_export(dir: &Path) -> ExitCode {
    let runs = match runs_of(dir) {
        Ok(runs) => runs,
        Err(failure) => return failure.exit(),
    };
    for run in runs {
        match export_torch_snapshot(&run) {
            Ok(path) => println!("{}", path.display()),
            Err(failure) => return failure.exit(),
        }
    }
    ExitCode::SUCCESS
}
