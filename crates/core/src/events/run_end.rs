//! How the run that wrote a dump ended, when it ended early: a write of the dump failed (a full
//! disk, the file size limit: the runtime logs it with its cause), or the program was killed
//! (the launcher logs its exit). Every reader of a dump says it once, with what is missing: the
//! rows past the failure, the files the runtime writes at exit. A dump outside a run directory
//! (a copied file, a hand-written fixture) says nothing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::launch_env::{ANALYSIS_REPORT, CONFIG_FILE, LOG_DIR};

/// The runtime's log line prefix of a failed dump write (`crates/runtime/src/pipeline`).
pub const DUMP_FAILED: &str = " [ERROR] event dump incomplete: ";

/// What follows the cause in that line (`crates/runtime/src/pipeline/writer.rs`).
const STOPS_THERE: &str = "; the dump stops there";

/// The launcher's log line of the program's end (`target exited: {ExitStatus}`).
const EXITED: &str = " target exited: ";

/// Log files are small; a damaged one is read only so far.
const LOG_READ_LIMIT: u64 = 1 << 20;

/// A failed write of the event dump, as the runtime logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpFailure {
    /// The log line's time (`2026-12-07 20:10:41.599 UTC`).
    pub when: String,
    /// The cause and where the dump stops.
    pub what: String,
}

/// The run directory holding `dump` (a head, a part or a segment below `device_*/dump/`): the
/// nearest directory above it with a `config.json` and a log folder.
pub fn run_dir_of(dump: &Path) -> Option<PathBuf> {
    dump.ancestors()
        .skip(1)
        .take(4)
        .find(|dir| dir.join(CONFIG_FILE).is_file() && dir.join(LOG_DIR).is_dir())
        .map(Path::to_path_buf)
}

/// The log files of a run, `launcher.log` and every `runtime_{pid}.log`, sorted.
fn logs(run: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(run.join(LOG_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

fn read_log(path: &Path) -> String {
    use std::io::Read;
    let mut text = Vec::new();
    let _ = std::fs::File::open(path).and_then(|f| f.take(LOG_READ_LIMIT).read_to_end(&mut text));
    String::from_utf8_lossy(&text).into_owned()
}

/// The first failed dump write the runtime logged in the run directory `run`.
pub fn dump_failure(run: &Path) -> Option<DumpFailure> {
    logs(run).iter().find_map(|log| {
        read_log(log).lines().find_map(|line| {
            let (when, what) = line.split_once(DUMP_FAILED)?;
            Some(DumpFailure {
                when: when.to_string(),
                what: what.to_string(),
            })
        })
    })
}

/// How the launched program ended, as the launcher logged it (`signal: 9 (SIGKILL)`), when a
/// signal ended it.
fn killed_by(run: &Path) -> Option<String> {
    let text = read_log(&run.join(LOG_DIR).join("launcher.log"));
    text.lines()
        .filter_map(|l| l.split_once(EXITED).map(|(_, s)| s.to_string()))
        .next_back()
        .filter(|s| s.starts_with("signal: "))
}

/// The files the runtime writes at exit for the run's analyses that are not there.
pub fn missing_exit_files(run: &Path) -> Vec<&'static str> {
    let Ok(config) = std::fs::read_to_string(run.join(CONFIG_FILE)) else {
        return Vec::new();
    };
    let Ok(config) = serde_json::from_str::<serde_json::Value>(&config) else {
        return Vec::new();
    };
    let analyses: Vec<&str> = config["analysis"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let mut expected = Vec::new();
    if analyses.contains(&"leaks") {
        expected.extend(["leaks/findings.json", "leaks/peak.json"]);
    }
    if analyses.contains(&"inefficient") {
        expected.push("inefficient/inefficient_blocks.csv");
    }
    if analyses
        .iter()
        .any(|a| ["leaks", "inefficient", "decompose"].contains(a))
    {
        expected.push(ANALYSIS_REPORT);
    }
    // A file the runtime made but could not fill (a full disk) is missing too.
    expected.retain(|f| std::fs::metadata(run.join(f)).map_or(true, |m| m.len() == 0));
    expected
}

/// One line on how the run holding `dump` ended early and what is missing, or `None` when it
/// ended as it should (or `dump` is in no run directory).
pub fn note(dump: &Path) -> Option<String> {
    let run = run_dir_of(dump)?;
    let missing = missing_exit_files(&run);
    let missing = if missing.is_empty() {
        String::new()
    } else {
        format!(
            "; missing: {} (written when the program exits)",
            missing.join(", ")
        )
    };
    if let Some(failure) = dump_failure(&run) {
        return Some(format!(
            "{}: the event dump stops early, at {}: {}{missing}",
            run.display(),
            failure.when,
            failure.what
        ));
    }
    let signal = killed_by(&run)?;
    Some(format!(
        "{}: the program was killed ({signal}) before the run ended: the event dump holds the \
         rows written until then{missing}",
        run.display()
    ))
}

/// [`note`] on stderr, once per run directory in this process.
pub fn say_once(dump: &Path) {
    static SAID: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let Some(run) = run_dir_of(dump) else {
        return;
    };
    let Ok(mut said) = SAID.lock() else {
        return;
    };
    if !said.get_or_insert_with(HashSet::new).insert(run) {
        return;
    }
    drop(said);
    if let Some(note) = note(dump) {
        eprintln!("msmemscope: note: {note}");
    }
}

/// Why a CSV dump's last row is cut off, for the reader's warning: the run's own reason when
/// it logged one, else the two that cut a file mid-row.
pub fn cut_row_cause(dump: &Path) -> String {
    let run = run_dir_of(dump);
    if let Some(failure) = run.as_deref().and_then(dump_failure) {
        // The cause alone: where the dump stops is the reader's own line.
        let cause = failure.what.split(STOPS_THERE).next().unwrap_or_default();
        return cause.to_string();
    }
    if let Some(signal) = run.as_deref().and_then(killed_by) {
        return format!("the program was killed ({signal})");
    }
    "a full disk, or the process killed".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_dir(tag: &str, launcher_log: &str, runtime_log: &str, analysis: &str) -> PathBuf {
        let run = std::env::temp_dir().join(format!("run-end-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(run.join("msmemscope_logs")).unwrap();
        std::fs::create_dir_all(run.join("device_cpu/dump")).unwrap();
        std::fs::write(
            run.join("config.json"),
            format!("{{\"analysis\": {analysis}}}"),
        )
        .unwrap();
        std::fs::write(run.join("msmemscope_logs/launcher.log"), launcher_log).unwrap();
        std::fs::write(run.join("msmemscope_logs/runtime_7.log"), runtime_log).unwrap();
        run
    }

    #[test]
    fn a_killed_run_names_its_signal_and_the_missing_exit_files() {
        let run = run_dir(
            "killed",
            "2026-01-02 03:04:05.000 UTC launching [\"./p\"]\n\
             2026-01-02 03:04:06.000 UTC target exited: signal: 9 (SIGKILL)\n",
            "",
            "[\"leaks\", \"inefficient\"]",
        );
        std::fs::create_dir(run.join("leaks")).unwrap();
        std::fs::write(run.join("leaks/peak.json"), "{}").unwrap();
        let dump = run.join("device_cpu/dump/memscope_dump_1.csv");
        assert_eq!(
            note(&dump).unwrap(),
            format!(
                "{}: the program was killed (signal: 9 (SIGKILL)) before the run ended: the \
                 event dump holds the rows written until then; missing: leaks/findings.json, \
                 inefficient/inefficient_blocks.csv, analysis_report.txt (written when the \
                 program exits)",
                run.display()
            )
        );
        assert_eq!(
            cut_row_cause(&dump),
            "the program was killed (signal: 9 (SIGKILL))"
        );
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn a_failed_write_is_said_with_its_time_before_a_normal_exit() {
        let run = run_dir(
            "failed",
            "2026-01-02 03:04:06.000 UTC target exited: exit status: 0\n",
            "2026-01-02 03:04:05.250 UTC [ERROR] event dump incomplete: the disk is full; the \
             dump stops there: the rows from ID 9 on are not all in the file\n",
            "[]",
        );
        let dump = run.join("device_cpu/dump/memscope_dump_1.steps/step_3_0.csv");
        assert_eq!(
            note(&dump).unwrap(),
            format!(
                "{}: the event dump stops early, at 2026-01-02 03:04:05.250 UTC: the disk is \
                 full; the dump stops there: the rows from ID 9 on are not all in the file",
                run.display()
            )
        );
        assert_eq!(cut_row_cause(&dump), "the disk is full");
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn a_run_that_ended_well_or_no_run_says_nothing() {
        let run = run_dir(
            "fine",
            "2026-01-02 03:04:06.000 UTC target exited: exit status: 3\n",
            "",
            "[]",
        );
        assert_eq!(note(&run.join("device_cpu/dump/d.csv")), None);
        assert_eq!(note(Path::new("/nonexistent/d.csv")), None);
        assert_eq!(
            cut_row_cause(Path::new("/nonexistent/d.csv")),
            "a full disk, or the process killed"
        );
        let _ = std::fs::remove_dir_all(&run);
    }
}
