//! `msmemscope export --format parquet DIR`: `memscope_dump_{ts}.parquet` beside each CSV or
//! SQLite dump of the run (or of every run in the output directory DIR), written by core's
//! `events::parquet::export` through held directory descriptors: each dump is read with every
//! dump check, the file is written under a temporary name and renamed when complete, and an
//! existing `.parquet` (an earlier export, or anything else of that name) is left alone with one
//! line saying so. The dumps themselves are kept, except the CSV journals of a `--format
//! parquet` run whose launcher was killed before it converted them: those are converted as the
//! launcher would have. One line per file written, on stdout.
//!
//! Exit status: 0 when every dump has its Parquet file (written now, or left alone); 2 when DIR
//! holds no run or no dump, or a dump is not one (one line each, the other dumps still
//! exported); 1 when writing failed.

use std::path::Path;
use std::process::ExitCode;

use msmemscope_core::events::parquet::export::{export, ExportError, Source};
use msmemscope_core::run_dir::RunDir;

/// The names of `memscope_dump_*.{ext}` in `dir`, for the given extensions, sorted.
pub fn dump_names(dir: &RunDir, extensions: &[&str]) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir.resolved())?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.starts_with("memscope_dump_")
                && extensions
                    .iter()
                    .any(|ext| n.strip_suffix(ext).is_some_and(|s| s.ends_with('.')))
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The `device_*` directories of a run, sorted.
fn device_dirs(run: &RunDir) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(run.resolved())?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("device_"))
        .collect();
    names.sort();
    Ok(names)
}

/// Why the directory `path` (reached without following symlinks) could not be opened, in
/// words: `openat(O_DIRECTORY|O_NOFOLLOW)` says ENOTDIR for a symlink too.
fn opening_error(path: &Path, e: &std::io::Error) -> String {
    let symlink = path
        .ancestors()
        .take(2)
        .any(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()));
    match e.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) if symlink => "a symlink, not followed".into(),
        Some(libc::ENOTDIR) => "not a directory".into(),
        _ => e.to_string(),
    }
}

/// Status codes by severity: a bad input (2) outranks a failed write (1).
#[derive(Default)]
struct Outcome {
    status: u8,
    dumps: usize,
}

impl Outcome {
    fn fail(&mut self, line: &str, input: bool) {
        eprintln!("msmemscope: {line}");
        self.status = self.status.max(if input { 2 } else { 1 });
    }
}

/// Whether the run was made with `--format parquet` (its `config.json` says so): its CSV dumps
/// are then journals that the launcher (or the runtime) did not get to convert, because it was
/// killed too. They are converted as the launcher would have: a last row cut off by the kill is
/// left out, and the journal goes once its Parquet file is there.
fn journals_of_a_parquet_run(run: &Path) -> bool {
    // Read as the report reads it: a FIFO or a device in its place neither blocks nor fills memory.
    super::read_config(&run.join(msmemscope_core::launch_env::CONFIG_FILE))
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .is_some_and(|config| config["format"] == "parquet")
}

fn export_run(run: &Path, outcome: &mut Outcome) {
    let held = match RunDir::open(run) {
        Ok(held) => held,
        Err(e) => return outcome.fail(&e, true),
    };
    let journals = journals_of_a_parquet_run(run);
    let devices = match device_dirs(&held) {
        Ok(devices) => devices,
        Err(e) => return outcome.fail(&format!("cannot list {}: {e}", run.display()), false),
    };
    for device in devices {
        let relative = Path::new(&device).join("dump");
        let dir = match held.open_dir(&relative) {
            Ok(dir) => dir,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => {
                let path = run.join(&relative);
                let line = format!("{}: {}", path.display(), opening_error(&path, &e));
                outcome.fail(&line, true);
                continue;
            }
        };
        let (dumps, parquet) = match (
            dump_names(&dir, &["csv", "db"]),
            dump_names(&dir, &["parquet"]),
        ) {
            (Ok(dumps), Ok(parquet)) => (dumps, parquet),
            (Err(e), _) | (_, Err(e)) => {
                let line = format!("cannot list {}: {e}", dir.path().display());
                outcome.fail(&line, false);
                continue;
            }
        };
        // A Parquet dump of a `--format parquet` run is a dump too: nothing to do for it.
        outcome.dumps += dumps.len().max(parquet.len());
        for name in dumps {
            let source = match journals && name.ends_with(".csv") {
                true => Source::Journal,
                false => Source::Dump,
            };
            match export(&dir, &name, source, true) {
                Ok(done) => {
                    if done.cut_row_left_out && source == Source::Journal {
                        eprintln!(
                            "msmemscope: {}: the journal's last row, cut off when the run was \
                             killed, is left out",
                            done.path.display()
                        );
                    } else if done.cut_row_left_out {
                        let dump = dir.path().join(&name);
                        eprintln!(
                            "msmemscope: warning: {}: the last row is cut off (the writing \
                             stopped inside it: {}); it is left out of {}",
                            dump.display(),
                            msmemscope_core::events::run_end::cut_row_cause(&dump),
                            done.path.display()
                        );
                    }
                    println!("{}", done.path.display())
                }
                Err(e @ ExportError::Exists { .. }) => eprintln!("msmemscope: {e}"),
                Err(e) => outcome.fail(&e.to_string(), e.is_input()),
            }
        }
    }
}

/// `msmemscope export --format parquet DIR`.
pub fn run(dir: &Path) -> ExitCode {
    let runs = match super::runs_of(dir) {
        Ok(runs) => runs,
        Err(failure) => return failure.exit(),
    };
    let mut outcome = Outcome::default();
    for run in &runs {
        export_run(run, &mut outcome);
    }
    if outcome.dumps == 0 && outcome.status == 0 {
        outcome.fail(
            &format!(
                "{}: no event dump to export (device_*/dump/memscope_dump_*.csv or .db)",
                dir.display()
            ),
            true,
        );
    }
    ExitCode::from(outcome.status)
}
