//! The SQL engines: the package's `ranks.sql` on DuckDB or Spark, run by the Python module
//! `msmemscope.ranks_sql` over the dumps' Parquet files. The dumps go in as JSON on its stdin,
//! the rows come back as JSON on its stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use msmemscope_core::events::parquet::export::{export, Exported, Source};
use msmemscope_core::run_dir::RunDir;

use crate::install::{python_package_root, Layout};

use super::discover::Dump;
use super::table::Row;
use super::Engine;
use crate::failure::Failure;

/// The table's rows from `engine`, in the order of `dumps`.
pub fn summarize(engine: Engine, dumps: &[Dump], threshold_pct: u32) -> Result<Vec<Row>, Failure> {
    let mut inputs = Vec::with_capacity(dumps.len());
    for dump in dumps {
        inputs.push(serde_json::json!({
            "rank": dump.rank,
            "run": dump.run,
            "device": dump.device,
            "dump": dump.stem(),
            "parquet": parquet_of(dump)?,
            "parts": parts_of(dump)?,
        }));
    }
    let request = serde_json::json!({
        "engine": engine.as_str(),
        "threshold_pct": threshold_pct,
        "dumps": inputs,
    });
    let (python, pythonpath) = interpreter();
    let mut child = Command::new(&python)
        .args(["-m", "msmemscope.ranks_sql"])
        .env("PYTHONPATH", pythonpath)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Failure::io(format!(
                "--engine {} runs Python, and {} cannot be started: {e} (set MSMEMSCOPE_PYTHON to the interpreter that has msmemscope and {})",
                engine.as_str(),
                python.display(),
                engine.as_str()
            ))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A child that exits early closes its end: its stderr says why.
        let _ = stdin.write_all(request.to_string().as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Failure::io(format!("waiting for {}: {e}", python.display())))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        return Err(Failure::io(format!(
            "--engine {} failed: {line}",
            engine.as_str()
        )));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        Failure::io(format!(
            "--engine {}: unreadable answer from msmemscope.ranks_sql: {e}",
            engine.as_str()
        ))
    })
}

/// The Parquet file with `dump`'s rows: the one beside it, or else one exported now (as
/// `msmemscope export --format parquet` does, said on stderr).
fn parquet_of(dump: &Dump) -> Result<String, Failure> {
    let parquet = dump.parquet();
    if !parquet.is_file() {
        let exported = export_beside(&dump.path)?;
        eprintln!(
            "msmemscope: ranks: exported {} ({} rows) for the SQL engine",
            exported.path.display(),
            exported.rows
        );
    }
    Ok(parquet.to_string_lossy().into_owned())
}

/// The Parquet files of the step parts a bounded run kept beside the dump (exported where a
/// part has none yet), in the order of their rows.
fn parts_of(dump: &Dump) -> Result<Vec<String>, Failure> {
    let mut parquets = Vec::new();
    for part in msmemscope_core::events::parts::dump_files(&dump.path)
        .into_iter()
        .skip(1)
    {
        let parquet = part.with_extension("parquet");
        if !parquet.is_file() {
            export_beside(&part)?;
        }
        parquets.push(parquet.to_string_lossy().into_owned());
    }
    Ok(parquets)
}

/// The Parquet file of the dump (or step part) at `path`, written beside it.
fn export_beside(path: &std::path::Path) -> Result<Exported, Failure> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Failure::input(format!("{}: not a dump", path.display())));
    };
    let held = RunDir::open(dir).map_err(Failure::input)?;
    match export(&held, &name.to_string_lossy(), Source::Dump, true) {
        Ok(done) => Ok(done),
        Err(e) if e.is_input() => Err(Failure::input(e.to_string())),
        Err(e) => Err(Failure::io(e.to_string())),
    }
}

/// The Python to run and its `PYTHONPATH`: `MSMEMSCOPE_PYTHON`, else the interpreter of the
/// environment this command was installed into, else `python3` from `PATH`; the package's
/// directory goes first on the path for a source tree, last for an installed one.
fn interpreter() -> (PathBuf, std::ffi::OsString) {
    let root = python_package_root();
    let installed_python = root.as_ref().and_then(|(dir, layout)| {
        // PREFIX/lib/pythonX.Y/site-packages -> PREFIX/bin/python3
        let prefix = dir.parent()?.parent()?.parent()?;
        let python = prefix.join("bin").join("python3");
        (*layout == Layout::Installed && python.is_file()).then_some(python)
    });
    let python = std::env::var_os("MSMEMSCOPE_PYTHON")
        .map(PathBuf::from)
        .or(installed_python)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let mut path = std::ffi::OsString::new();
    let user = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty());
    match &root {
        Some((dir, Layout::SourceTree)) => {
            path.push(dir);
            if let Some(user) = &user {
                path.push(":");
                path.push(user);
            }
        }
        Some((dir, Layout::Installed)) => {
            if let Some(user) = &user {
                path.push(user);
                path.push(":");
            }
            path.push(dir);
        }
        None => {
            if let Some(user) = &user {
                path.push(user);
            }
        }
    }
    (python, path)
}
