//! `msmemscope --compare --input-path=BASE,COMPARE [--level=op|kernel] [-o DIR]`: reads the two
//! dumps (CSV or SQLite, one thread each), aligns their op or kernel sequences
//! (`msmemscope_core::analysis::compare`) and writes `{output}/compare/memory_compare_{ts}.csv`,
//! whose path it prints on stdout.
//!
//! Exit status: 0 written; 2 when an input is unusable (missing, a directory, not a regular
//! file, not a dump, a row longer than the reader's cap, a malformed or out-of-order row: one
//! line naming the file, and the line or row); 1 when reading or writing fails (permissions, a
//! full disk).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use msmemscope_core::analysis::compare::{self, OpCollector, OpSequence};
use msmemscope_core::config::{Level, RunConfig};
use msmemscope_core::events::reader::{self, ReadError};
use msmemscope_core::run_dir;

use crate::failure::Failure;
use crate::progress::Unit;

pub fn run(config: &RunConfig, inputs: &[PathBuf; 2]) -> ExitCode {
    match compare_files(config, inputs) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(failure) => failure.exit(),
    }
}

fn compare_files(config: &RunConfig, inputs: &[PathBuf; 2]) -> Result<PathBuf, Failure> {
    for path in inputs {
        if path.is_dir() {
            return Err(Failure {
                message: format!(
                    "--input-path: {} is a directory; give the dump file (memscope_dump_*.csv or .db)",
                    path.display()
                ),
                usage: true,
            });
        }
    }
    let progress = Arc::new(AtomicU64::new(0));
    let total = inputs
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let read = Arc::clone(&progress);
    let bar = crate::progress::Bar::start("compare", total, Unit::Bytes, move || {
        read.load(Ordering::Relaxed)
    });
    let (base, other) = std::thread::scope(|scope| {
        let base = scope.spawn(|| collect(&inputs[0], config.level, &progress));
        let other = scope.spawn(|| collect(&inputs[1], config.level, &progress));
        (
            base.join().expect("the reader thread does not panic"),
            other.join().expect("the reader thread does not panic"),
        )
    });
    drop(bar);
    let (base, other) = (base?, other?);
    let what = match config.level {
        Level::Op => "OP_LAUNCH ATEN_END rows (record with --level=op and launch events)",
        Level::Kernel => "KERNEL_LAUNCH rows (record with --level=kernel and launch events)",
    };
    for (path, sequence) in inputs.iter().zip([&base, &other]) {
        if sequence.is_empty() {
            eprintln!("msmemscope: warning: {} has no {what}", path.display());
        }
    }
    write(config, &base, &other)
}

/// Reads one dump into its op sequence.
fn collect(path: &Path, level: Level, progress: &AtomicU64) -> Result<OpSequence, Failure> {
    let read_failure = |e: ReadError| Failure {
        usage: !matches!(e, ReadError::Io { .. }),
        message: e.to_string(),
    };
    let mut rows = reader::open_rows(path).map_err(read_failure)?;
    let reader_progress = rows.progress();
    let mut collector = OpCollector::new(level);
    let (mut counted, mut pending) = (0u64, 0u32);
    while let Some(row) = rows.next_row().map_err(read_failure)? {
        collector.feed(row).map_err(|e| Failure {
            message: format!("{}: {e}", path.display()),
            usage: true,
        })?;
        pending += 1;
        if pending == 1 << 16 {
            pending = 0;
            // Bytes where the reader tells them (CSV), else none until the end.
            if let Some(done) = reader_progress.as_ref().map(|p| p.done_bytes()) {
                progress.fetch_add(done.saturating_sub(counted), Ordering::Relaxed);
                counted = done;
            }
        }
    }
    let size = std::fs::metadata(path).map_or(counted, |m| m.len());
    progress.fetch_add(size.saturating_sub(counted), Ordering::Relaxed);
    Ok(collector.finish())
}

/// Writes `{output}/compare/memory_compare_{ts}.csv`; never through a symlink.
fn write(config: &RunConfig, base: &OpSequence, other: &OpSequence) -> Result<PathBuf, Failure> {
    let io_failure = |message: String| Failure {
        message,
        usage: false,
    };
    let output = &config.output_path;
    std::fs::create_dir_all(output).map_err(|e| {
        io_failure(format!(
            "cannot create output path {}: {e}",
            output.display()
        ))
    })?;
    let dir = output.join("compare");
    run_dir::ensure_dir(&dir).map_err(io_failure)?;
    let stamp = run_dir::local_timestamp();
    let mut attempt = 1;
    let (path, file) = loop {
        let name = if attempt == 1 {
            format!("memory_compare_{stamp}.csv")
        } else {
            format!("memory_compare_{stamp}_{attempt}.csv")
        };
        let path = dir.join(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(file) => break (path, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(io_failure(format!("cannot create {}: {e}", path.display()))),
        }
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = compare::write_csv(base, other, &mut out).and_then(|_| out.flush());
    if let Err(e) = written {
        return Err(io_failure(format!("cannot write {}: {e}", path.display())));
    }
    Ok(path)
}
