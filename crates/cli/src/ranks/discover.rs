//! Finding the ranks' runs: every run directory under the given directories, with the rank its
//! `config.json` recorded at launch, and its dumps.

use std::path::{Path, PathBuf};

use crate::failure::Failure;

/// How deep below a given directory run directories are looked for (`out/rank0/msmemscope_…`
/// is two levels down).
const MAX_DEPTH: usize = 4;

/// One dump of one rank's run: a line of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    /// `RANK` (or `LOCAL_RANK`) recorded in the run's `config.json`; `None` for a run made
    /// outside a distributed job.
    pub rank: Option<u64>,
    /// The run directory's name.
    pub run: String,
    /// The device, as the dump's directory names it (`cpu`, `0`, …).
    pub device: String,
    /// The dump file (`.csv`, `.db` or `.parquet`).
    pub path: PathBuf,
}

impl Dump {
    /// The dump's name without its extension: `memscope_dump_{ts}`.
    pub fn stem(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The Parquet file beside the dump (the dump itself when it is one).
    pub fn parquet(&self) -> PathBuf {
        self.path.with_extension("parquet")
    }
}

/// Every dump of every run under `dirs`, ordered by rank (runs without one last), run, device
/// and dump name.
pub fn dumps_under(dirs: &[PathBuf]) -> Result<Vec<Dump>, Failure> {
    let mut runs = Vec::new();
    for dir in dirs {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Failure::input(format!(
                    "{}: not a directory; give directories holding run directories (msmemscope_PID_TIMESTAMP), one per rank",
                    dir.display()
                )))
            }
            Err(_) => {
                return Err(Failure::input(format!(
                    "{}: no such directory",
                    dir.display()
                )))
            }
        }
        let before = runs.len();
        collect_runs(dir, MAX_DEPTH, &mut runs);
        if runs.len() == before {
            return Err(Failure::input(format!(
                "{}: holds no run directory with a dump (device_*/dump/memscope_dump_*)",
                dir.display()
            )));
        }
    }
    dumps_of(runs)
}

/// Every dump of the given run directories, ordered as [`dumps_under`] orders them.
pub fn dumps_of(mut runs: Vec<PathBuf>) -> Result<Vec<Dump>, Failure> {
    runs.sort();
    runs.dedup();
    let mut dumps = Vec::new();
    for run in runs {
        let rank = rank_of(&run)?;
        let name = run
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (device_dir, path) in dump_files(&run) {
            dumps.push(Dump {
                rank,
                run: name.clone(),
                device: device_dir
                    .strip_prefix("device_")
                    .unwrap_or(&device_dir)
                    .to_string(),
                path,
            });
        }
    }
    dumps.sort_by(|a, b| {
        (a.rank.is_none(), a.rank, &a.run, &a.device, a.stem()).cmp(&(
            b.rank.is_none(),
            b.rank,
            &b.run,
            &b.device,
            b.stem(),
        ))
    });
    Ok(dumps)
}

/// Run directories at most `depth` levels below `dir` (symlinks are not followed).
fn collect_runs(dir: &Path, depth: usize, runs: &mut Vec<PathBuf>) {
    if !dump_files(dir).is_empty() {
        runs.push(dir.to_path_buf());
        return;
    }
    if depth == 0 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_runs(&entry.path(), depth - 1, runs);
        }
    }
}

/// A run's dumps, `(device directory, file)`: one file per dump, its `.csv` or `.db` when it
/// has one (an exported `.parquet` beside it is the same rows), else its `.parquet`.
pub fn dump_files(run: &Path) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    let Ok(entries) = std::fs::read_dir(run) else {
        return files;
    };
    for entry in entries.flatten() {
        let device = entry.file_name().to_string_lossy().into_owned();
        if !device.starts_with("device_") || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(dumps) = std::fs::read_dir(entry.path().join("dump")) else {
            continue;
        };
        let mut found: Vec<PathBuf> = dumps
            .flatten()
            .map(|d| d.path())
            .filter(|p| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default();
                name.starts_with("memscope_dump_")
                    && [".csv", ".db", ".parquet"]
                        .iter()
                        .any(|e| name.ends_with(e))
            })
            .collect();
        found.sort();
        for path in &found {
            let is_parquet = path.extension().is_some_and(|e| e == "parquet");
            let has_source = found
                .iter()
                .any(|other| other != path && other.with_extension("parquet") == *path);
            if !(is_parquet && has_source) {
                files.push((device.clone(), path.clone()));
            }
        }
    }
    files.sort();
    files
}

/// The rank a run's `config.json` recorded (`distributed.rank`), if any.
fn rank_of(run: &Path) -> Result<Option<u64>, Failure> {
    let path = run.join(msmemscope_core::launch_env::CONFIG_FILE);
    match std::fs::metadata(&path) {
        Err(_) => return Ok(None),
        // A FIFO would block the read, and no config.json is megabytes long.
        Ok(m) if !m.is_file() || m.len() > 1 << 20 => {
            return Err(Failure::input(format!(
                "{}: not a run's config.json (not a regular file of at most 1 MiB)",
                path.display()
            )))
        }
        Ok(_) => {}
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Failure::io(format!("cannot read {}: {e}", path.display())))?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::input(format!("{}: not a run's config.json: {e}", path.display())))?;
    match config.get("distributed").and_then(|d| d.get("rank")) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(rank) => rank.as_u64().map(Some).ok_or_else(|| {
            Failure::input(format!(
                "{}: distributed.rank is {rank}, not a whole number",
                path.display()
            ))
        }),
    }
}
