//! The leak analyses end to end: `check_leaks` on the hand-written dumps in
//! tests/fixtures/dumps/ (CSV, and the same rows as SQLite), and the online `leaks` analysis
//! (the default) under the real CLI on a producer of the runtime's C ABI
//! (tests/fixtures/emit_leaks.c), whose report the launcher prints on stderr. When the project's
//! venv has torch, a real CPU training loop (tests/fixtures/train_steps.py) too.

use std::path::{Path, PathBuf};
use std::process::Command;

use msmemscope_core::analysis::check_leaks::{check_leaks, CheckLeaksError};
use msmemscope_core::events::reader;
use msmemscope_core::events::{DeviceId, EventType};

use crate::util::{self, dump_fixture, launch_ok, only_dump, only_run_dir, repo, to_db, Scratch};

fn producer() -> PathBuf {
    util::producer("emit_leaks")
}

/// The report of `check_leaks(check_leaks.csv, "test", 0)` (see tests/fixtures/dumps/README.md).
const EXPECTED_ABC: &str = "\
====== ERROR: Detected memory leaks between mark A (id 3) and mark B (id 10), not freed by mark C (id 13) ======
Direct PTA leak of 0.015 Mb(s) at 0x0000000000002000 on device cpu (row 5).
    train.py(12): forward
    train.py(30): <module>
Direct HAL leak of 2.000 Mb(s) at 0x00007f0000200000 on device 0 (row 6).
Direct PTA leak of 1.000 Mb(s) at 0x0000000000004000 on device cpu (row 9).
    train.py(14): forward
    train.py(30): <module>
====== SUMMARY: 3.015 Mb(s) leaked in 3 allocation(s) ======
====== By site ======
  (no Python line recorded): 2.00 MiB (2097152 bytes) in 1 block(s)
  train.py:14 (forward): 1.00 MiB (1048576 bytes) in 1 block(s)
  train.py:12 (forward): 15.4 KiB (15728 bytes) in 1 block(s)
";

fn check_abc(path: &Path) {
    let result = check_leaks(path, "test", 0).unwrap();
    assert_eq!(result.marks, [3, 10, 13]);
    assert_eq!(result.console, EXPECTED_ABC);
    let blocks: Vec<_> = result
        .leaks
        .iter()
        .map(|l| (l.row_id, l.ptr, l.size, l.device, l.pool))
        .collect();
    assert_eq!(
        blocks,
        vec![
            (5, 0x2000, 15_728, DeviceId::Cpu, EventType::Pta),
            (
                6,
                0x7f00_0020_0000,
                2 << 20,
                DeviceId::Cuda(0),
                EventType::Hal
            ),
            (9, 0x4000, 1 << 20, DeviceId::Cpu, EventType::Pta),
        ]
    );
    assert_eq!(
        result.leaks[0].python_stack,
        "train.py(12): forward\ntrain.py(30): <module>"
    );

    let shifted = check_leaks(path, "test", 1).unwrap();
    assert_eq!(shifted.marks, [10, 13, 15]);
    assert_eq!(
        shifted.console,
        "\
====== ERROR: Detected memory leaks between mark A (id 10) and mark B (id 13), not freed by mark C (id 15) ======
Direct PTA leak of 0.001 Mb(s) at 0x0000000000005000 on device cpu (row 11).
====== SUMMARY: 0.001 Mb(s) leaked in 1 allocation(s) ======
"
    );

    let err = check_leaks(path, "test", 2).unwrap_err();
    assert!(matches!(err, CheckLeaksError::TooFewMarks { .. }));
    assert_eq!(
        err.to_string(),
        "found 4 marks named \"test\", need start_index+3 = 5"
    );
    assert_eq!(
        check_leaks(path, "other", 0).unwrap_err().to_string(),
        "found 1 marks named \"other\", need start_index+3 = 3"
    );
}

#[test]
fn check_leaks_on_a_hand_written_csv_dump() {
    check_abc(&dump_fixture("check_leaks.csv"));
}

#[test]
fn check_leaks_on_the_same_rows_as_sqlite() {
    let scratch = Scratch::new("db");
    let db = scratch.0.join("memscope_dump_1.db");
    to_db(&dump_fixture("check_leaks.csv"), &db);
    check_abc(&db);
}

#[test]
fn check_leaks_errors() {
    let bad = dump_fixture("check_leaks_malformed.csv");
    assert_eq!(
        check_leaks(&bad, "test", 0).unwrap_err().to_string(),
        format!(
            "{}:9: malformed row: Timestamp(ns) is not a number",
            bad.display()
        )
    );
    assert_eq!(
        check_leaks(Path::new("tests/fixtures/dumps/check_leaks.csv"), "test", 0)
            .unwrap_err()
            .to_string(),
        "input_path must be an absolute path: tests/fixtures/dumps/check_leaks.csv"
    );
    let missing = dump_fixture("no_such_dump.csv");
    assert_eq!(
        check_leaks(&missing, "test", 0).unwrap_err().to_string(),
        format!("{}: no such file", missing.display())
    );
}

/// `msmemscope-cli OPTIONS -o SCRATCH/out PROGRAM...`, checked to succeed; the launcher's stderr.
fn run_cli(scratch: &Scratch, options: &[&str], program: &[&std::ffi::OsStr]) -> String {
    let out = launch_ok(options, &scratch.0.join("out"), program);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The run directory the CLI made under `scratch`.
fn run_dir(scratch: &Scratch) -> PathBuf {
    only_run_dir(&scratch.0.join("out"))
}

/// The `start_index` of the last three `iter` marks (the step 2, 3 and 4 marks) in a device's
/// dump. Counted rather than fixed: a device file opened after the first device-less rows were
/// written (here the cpu file, whose first row follows step 1's HAL block on device 0) does not
/// hold those rows, so it has 3 of the 4 marks.
fn last_three_marks(path: &Path) -> usize {
    let marks = reader::open(path)
        .unwrap()
        .map(|r| r.unwrap())
        .filter(|r| r.event_type == EventType::Mark && r.name == "iter")
        .count();
    assert!(marks >= 3, "{marks} marks in {}", path.display());
    marks - 3
}

/// Four steps are too few to see the kept losses grow at two step ends (step 2's loss outlived
/// step 3; step 3's only outlived the last step, the end of the program): their site is
/// resident, and the console says how many steps judging takes. The HAL block live at exit is
/// a leak whatever its step (docs/analyses.md#hal-at-exit).
const ONLINE_LEAKS: &str = "\
====== ERROR: Detected memory leaks on device 0 ======
Direct HAL leak of 2.000 Mb(s) at 0x00007f0000000000 in kernel_0 at step 1.
====== SUMMARY: 2.000 Mb(s) leaked in 1 allocation(s) ======
====== Resident on device cpu: 1 site(s) kept but not growing (not leaks) ======
  (no Python line recorded for these blocks): 8.00 KiB (8192 bytes) in 1 block(s) since step 3
";

/// The peak is the Gap table's highest MaxUsed (step 4's), its blocks without a Python line.
const ONLINE_PEAK: &str = "\
====== Peak on device cpu: 104 KiB of tensors live at step 4 ======
  [1] (no Python line recorded for these blocks): 104 KiB in 5 block(s)
";

const FEW_STEPS: &str = "msmemscope: the leaks analysis saw 4 step(s); a leak is judged by \
growth at two step ends from step 2 on, which takes 5 steps\n";

const ONLINE_GAPS: &str = "\
====== Gap Analysis on device cpu, pool PTA ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2                 4096           77824    0.0526
3                12288           90112    0.1364
4                24576          106496    0.2308
Min gap: 0.0526 at step 2
Max gap: 0.2308 at step 4
Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
";

#[test]
fn online_leak_report_on_the_launchers_stderr() {
    let scratch = Scratch::new("online");
    let stderr = run_cli(&scratch, &[], &[producer().as_os_str(), "leak".as_ref()]);
    let report = format!("{ONLINE_LEAKS}{ONLINE_PEAK}{FEW_STEPS}{ONLINE_GAPS}");
    assert!(stderr.ends_with(&report), "stderr:\n{stderr}");
    let run = run_dir(&scratch);
    assert_eq!(
        std::fs::read_to_string(run.join("leaks/leak_report.txt")).unwrap(),
        ONLINE_LEAKS
    );
    assert_eq!(
        std::fs::read_to_string(run.join("leaks/gap_analysis.txt")).unwrap(),
        ONLINE_GAPS
    );

    // The same dump offline: marks "iter" start steps 1..4; between the step-2 and step-3
    // marks, the step-2 loss is allocated and it is still live at the step-4 mark.
    let dump = only_dump(&run, "device_cpu");
    let result = check_leaks(&dump, "iter", last_three_marks(&dump)).unwrap();
    let leaked: Vec<_> = result.leaks.iter().map(|l| (l.ptr, l.size)).collect();
    assert_eq!(leaked, vec![(0x900200, 8192)]);
}

#[test]
fn online_run_without_the_leak_reports_none() {
    let scratch = Scratch::new("noleak");
    let stderr = run_cli(
        &scratch,
        &["--format", "db"],
        &[producer().as_os_str(), "noleak".as_ref()],
    );
    assert!(!stderr.contains("leak of"), "stderr:\n{stderr}");
    assert!(!stderr.contains("ERROR"), "stderr:\n{stderr}");
    // Every step allocates 65536 + 4096*s bytes and frees them all.
    assert!(
        stderr.ends_with(
            "\
====== Gap Analysis on device cpu, pool PTA ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2                    0           73728    0.0000
3                    0           77824    0.0000
4                    0           81920    0.0000
Min gap: 0.0000 at step 2
Max gap: 0.0000 at step 2
Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
"
        ),
        "stderr:\n{stderr}"
    );
    let run = run_dir(&scratch);
    assert_eq!(
        std::fs::read_to_string(run.join("leaks/leak_report.txt")).unwrap(),
        "====== No memory leaks detected ======\n"
    );
    // check_leaks on the run's SQLite dump: nothing between the marks outlives them.
    let db = only_dump(&run, "device_cpu");
    assert_eq!(db.extension().unwrap(), "db");
    let result = check_leaks(&db, "iter", last_three_marks(&db)).unwrap();
    assert!(result.leaks.is_empty(), "{result:?}");
    assert!(result
        .console
        .starts_with("====== No memory leaks between mark A"));
}

/// The project's venv Python when it has torch (scripts/setup.sh makes it); `None` skips.
fn torch_python() -> Option<PathBuf> {
    let python = repo().join(".venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "skipped: {} cannot import torch (scripts/setup.sh installs it)",
            python.display()
        );
    }
    ok.then_some(python)
}

/// Runs tests/fixtures/train_steps.py in `mode` under the CLI; (stderr, the run's cpu dump).
fn train(scratch: &Scratch, python: &Path, mode: &str) -> (String, PathBuf) {
    let script = repo().join("tests/fixtures/train_steps.py");
    let stderr = run_cli(
        scratch,
        &[],
        &[python.as_os_str(), script.as_os_str(), mode.as_ref()],
    );
    assert!(
        !stderr.contains("PyTorch tracking is off"),
        "stderr:\n{stderr}"
    );
    let dump = only_dump(&run_dir(scratch), "device_cpu");
    (stderr, dump)
}

#[test]
fn pytorch_training_loop_that_keeps_its_losses() {
    use msmemscope_core::analysis::{leaks::Leaks, run_offline};
    let Some(python) = torch_python() else { return };

    let scratch = Scratch::new("torch-leak");
    let (stderr, dump) = train(&scratch, &python, "leak");
    // The same analysis offline on the (single-device) dump finds what the run printed.
    let mut leaks = Leaks::new().with_source(msmemscope_core::source_line::read);
    let offline = run_offline(&mut leaks, reader::open(&dump).unwrap()).unwrap();
    assert!(!offline.console.is_empty(), "stderr:\n{stderr}");
    assert!(stderr.contains(&offline.console), "stderr:\n{stderr}");
    // One leak per kept loss of steps 2 and 3: the 0-dim float32 loss, 4 bytes, still live when
    // the next step ends. The last step ends with the program, after the interpreter freed the
    // history at exit (the native capture records those frees), so step 4's loss is freed by
    // then and step 5's never becomes a step old; step 1 is never checked.
    let found: Vec<_> = leaks
        .leaks()
        .iter()
        .map(|l| (l.step, l.size, l.device, l.pool))
        .collect();
    let expected: Vec<_> = (2..=3)
        .map(|s| (s, 4, DeviceId::Cpu, EventType::Pta))
        .collect();
    assert_eq!(found, expected, "stderr:\n{stderr}");
    assert!(stderr.contains(
        "====== ERROR: Detected memory leaks on device cpu ======\n\
         Direct PTA leak of 0.000 Mb(s) at 0x"
    ));
    assert!(stderr.contains("====== SUMMARY: 0.000 Mb(s) leaked in 2 allocation(s) ======\n"));
    // Each kept loss grows the pool's floor by its 4 bytes while the loop runs; the last step
    // holds the interpreter's frees at exit, so its floor is lower.
    let floors: Vec<u64> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("====== Gap Analysis on device cpu, pool PTA"))
        .skip(2)
        .take(4)
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(floors.len(), 4, "stderr:\n{stderr}");
    assert!(
        floors[..3].windows(2).all(|w| w[1] == w[0] + 4),
        "{floors:?}"
    );
    assert!(floors[3] < floors[2], "{floors:?}");

    let scratch = Scratch::new("torch-noleak");
    let (stderr, _) = train(&scratch, &python, "noleak");
    assert!(!stderr.contains("leak of"), "stderr:\n{stderr}");
    assert!(stderr.contains("====== Gap Analysis on device cpu, pool PTA ======"));
}
