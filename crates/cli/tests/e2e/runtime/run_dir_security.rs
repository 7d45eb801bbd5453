//! The run directory against a user who shares the output directory (docs/output-files.md):
//! the real `msmemscope-cli` refuses a symlink as `--output-path`, keeps writing into its run
//! directory through the descriptor it holds when that directory is renamed away and replaced
//! by a symlink while the program runs, and makes every directory in it with the run
//! directory's mode (0750). The program (tests/fixtures/run_dir/wait_then_leak.c) waits for a
//! signal file, so the swap happens while it runs.
//!
//! Needs `cargo build --release` first and gcc on PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{built_once, launch_ok, msmemscope_runs, producer, Scratch, BIN};

fn waiter() -> PathBuf {
    built_once(
        "run-dir",
        "run_dir/wait_then_leak.c",
        "wait_then_leak",
        &["-O1", "-g"],
        &[],
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every entry under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The one `msmemscope_*` entry in `out`.
fn only_msmemscope_run(out: &Path) -> PathBuf {
    let runs = msmemscope_runs(out).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

#[test]
fn a_symlink_as_output_path_is_refused_in_one_line() {
    let scratch = Scratch::new("rundir-link");
    let target = scratch.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), "keep").unwrap();
    let link = scratch.path().join("out");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for given in [link.display().to_string(), format!("{}/", link.display())] {
        let run = Command::new(BIN)
            .arg(format!("--output-path={given}"))
            .arg("true")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!("msmemscope: invalid --output-path \"{given}\"")),
            "{stderr}"
        );
        assert!(stderr.contains("symlink"), "{stderr}");
    }
    assert_eq!(tree(&target), ["keep"]);
    assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"keep");
}

#[test]
fn a_run_directory_swapped_for_a_symlink_keeps_receiving_the_report() {
    let scratch = Scratch::new("rundir-swap");
    let out = scratch.path().join("out");
    let elsewhere = scratch.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let go = scratch.path().join("go");
    let child = Command::new(BIN)
        .arg("--analysis=host-leaks")
        .arg("-o")
        .arg(&out)
        .arg(waiter())
        .arg(&go)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run directory exists once the program runs (the launcher makes it before the spawn);
    // its runtime log shows the runtime has begun.
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        let found: Vec<PathBuf> = std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        if let [run] = found.as_slice() {
            let started = std::fs::read_dir(run.join("msmemscope_logs"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("runtime_"));
            if started {
                break run.clone();
            }
        }
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let moved = out.join("moved");
    std::fs::rename(&run, &moved).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &run).unwrap();
    std::fs::write(&go, "").unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(tree(&elsewhere), Vec::<String>::new(), "{stderr}");
    let files = tree(&moved);
    for expected in [
        "config.json",
        "host_leak/leak_overview_1.txt",
        "host_leak/leak_sites_1.json",
    ] {
        assert!(
            files.iter().any(|f| f == expected),
            "{expected} not in {files:?}"
        );
    }
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("msmemscope_logs/launcher.log")),
        "{files:?}"
    );
    // The launcher read the report back through its descriptor, too.
    let overview = std::fs::read_to_string(moved.join("host_leak/leak_overview_1.txt")).unwrap();
    let first_line = overview.lines().next().unwrap();
    assert!(stderr.contains(first_line), "{stderr}");
    let log = std::fs::read_to_string(moved.join("msmemscope_logs/launcher.log")).unwrap();
    assert!(log.contains("target exited"), "{log}");
}

#[test]
fn directories_in_the_run_directory_have_its_mode() {
    let scratch = Scratch::new("rundir-modes");
    let out = scratch.path().join("out");
    let go = scratch.path().join("go");
    std::fs::write(&go, "").unwrap();
    launch_ok(
        &["--analysis=host-leaks"],
        &out,
        &[waiter().as_os_str(), go.as_os_str()],
    );
    let dir = only_msmemscope_run(&out);
    assert_eq!(mode(&dir), 0o750);
    assert_eq!(mode(&dir.join("host_leak")), 0o750);
    assert_eq!(mode(&dir.join("msmemscope_logs")), 0o750);
    assert_eq!(mode(&dir.join("host_leak/leak_overview_1.txt")), 0o640);

    // The event dump with the default analysis: device_cpu/, its dump/ and leaks/.
    let out = scratch.path().join("events");
    launch_ok(
        &[],
        &out,
        &[producer("emit_leaks").as_os_str(), "leak".as_ref()],
    );
    let dir = only_msmemscope_run(&out);
    for sub in [
        "",
        "device_cpu",
        "device_cpu/dump",
        "leaks",
        "msmemscope_logs",
    ] {
        assert_eq!(mode(&dir.join(sub)), 0o750, "{sub}");
    }
    assert_eq!(mode(&dir.join("leaks/leak_report.txt")), 0o640);
    assert_eq!(mode(&dir.join("analysis_report.txt")), 0o640);
}
