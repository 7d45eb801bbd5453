//! The stream-race sanitizer end to end (the `sanitizer-op:` marks of docs/analyses.md#sanitizer):
//! tests/fixtures/sanitizer_streams.c emits `sanitizer-op:` marks through `mstxMarkA` on two
//! streams, run under the real `msmemscope-cli` with default options. Without synchronization the
//! race is reported with both operators, on the console and in `sanitizer/race_report_*.txt`; with
//! an event record/wait between them nothing is; a malformed mark gets one warning line and is
//! skipped.
//!
//! Needs `cargo build --release` first and gcc on PATH.

use std::path::{Path, PathBuf};

use crate::util::{launch_ok, only_run_dir, producer, stderr, stdout, Scratch};

struct Run {
    stdout: String,
    stderr: String,
    dir: PathBuf,
}

fn run(scratch: &Scratch, mode: &str) -> Run {
    let out_dir = scratch.path().join("out");
    let out = launch_ok(
        &[],
        &out_dir,
        &[producer("sanitizer_streams").as_os_str(), mode.as_ref()],
    );
    Run {
        stdout: stdout(&out),
        stderr: stderr(&out),
        dir: only_run_dir(&out_dir),
    }
}

/// `buf=0x... a=0x... b=0x...` from the program's stdout.
fn handles(stdout: &str) -> (u64, u64, u64) {
    let values: Vec<u64> = stdout
        .lines()
        .next()
        .expect("a first line")
        .split_whitespace()
        .map(|kv| {
            let hex = kv.split_once("=0x").expect("key=0x...").1;
            u64::from_str_radix(hex, 16).unwrap()
        })
        .collect();
    (values[0], values[1], values[2])
}

/// The one report file of the run.
fn report_file(run_dir: &Path) -> (PathBuf, String) {
    let dir = run_dir.join("sanitizer");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.starts_with("race_report_") && name.ends_with(".txt") && name.len() == 12 + 14 + 4,
        "{name}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    (files[0].clone(), text)
}

/// The report without its stack lines (their addresses depend on the build).
fn without_stacks(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with("      at "))
        .collect()
}

#[test]
fn unsynchronized_writes_on_two_streams_are_reported_with_both_operators() {
    let scratch = Scratch::new("sanitizer-race");
    let run = run(&scratch, "race");
    let (buf, a, b) = handles(&run.stdout);
    let (view, end) = (buf + 1024, buf + 4096);
    let (path, text) = report_file(&run.dir);
    assert_eq!(
        without_stacks(&text),
        vec![
            "====== msmemscope sanitizer: 1 possible data race between streams (1 occurrence) ======".to_owned(),
            format!("Race 1 (1 occurrence) on memory [{view:#x}, {end:#x}) (3072 bytes):"),
            format!("  write by stream {b:#x} in operator demo.overwrite, argument dst ([{view:#x}, {end:#x}), 3072 bytes)"),
            "  not ordered after the earlier".to_owned(),
            format!("  write by stream {a:#x} in operator demo.produce, argument out ([{buf:#x}, {end:#x}), 4096 bytes)"),
            "====== SUMMARY: 1 race, 2 sanitizer-op marks checked, 0 malformed marks skipped ======".to_owned(),
        ]
    );
    // Each access carries the C stack of its mark, main's frame included.
    let stacks: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("      at "))
        .collect();
    assert!(
        stacks.iter().filter(|l| l.contains("main")).count() >= 2,
        "{text}"
    );
    // The console shows the same report, and where the file is.
    assert!(run.stderr.contains(&text), "stderr: {}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "msmemscope: sanitizer report: {}\n",
            path.display()
        )),
        "stderr: {}",
        run.stderr
    );
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    // The report the program read before exiting is the same, without the stacks.
    let (_, so_far) = run.stdout.split_once('\n').unwrap();
    assert_eq!(so_far.lines().collect::<Vec<_>>(), without_stacks(&text));
    // The marks stay MSTX rows of the dump.
    let dump = std::fs::read_dir(run.dir.join("device_cpu/dump"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let rows = std::fs::read_to_string(dump).unwrap();
    let marks = rows
        .lines()
        .filter(|l| l.contains(",MSTX,Mark,sanitizer-op: name=demo."))
        .count();
    assert_eq!(marks, 2, "{rows}");
}

#[test]
fn an_event_record_and_wait_between_them_is_no_race() {
    let scratch = Scratch::new("sanitizer-sync");
    let run = run(&scratch, "sync");
    let (_, text) = report_file(&run.dir);
    assert_eq!(
        text,
        "====== msmemscope sanitizer: no data race between streams in 2 sanitizer-op marks ======\n"
    );
    assert!(run.stdout.ends_with(&format!("\n{text}")), "{}", run.stdout);
    assert!(run.stderr.contains(&text), "stderr: {}", run.stderr);
    assert!(!run.stderr.contains("possible data race"));
}

#[test]
fn a_malformed_mark_is_one_warning_and_skipped() {
    let scratch = Scratch::new("sanitizer-malformed");
    let run = run(&scratch, "malformed");
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("warning"))
        .collect();
    assert_eq!(
        warnings,
        vec![
            "msmemscope: warning: skipped a malformed sanitizer-op mark: column 38: item \
             `out:0x1000` of `write` has 2 `:`-separated parts; expected alias:addr:size \
             (format: sanitizer-op: name=<operator>;read=<alias:addr:size>,...;\
             write=<alias:addr:size>,...)"
        ]
    );
    let (_, text) = report_file(&run.dir);
    assert_eq!(
        text,
        "====== msmemscope sanitizer: no data race between streams in 2 sanitizer-op marks ======\n\
         ====== SUMMARY: 0 races, 2 sanitizer-op marks checked, 1 malformed mark skipped ======\n"
    );
}
