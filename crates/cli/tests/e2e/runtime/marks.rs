//! Marks and ranges end to end (the MSTX rows of docs/output-files.md#event-types): the real
//! `msmemscope-cli` launches programs with `--analysis=none` (the event dump without analyses) and
//! the tests read the MSTX rows back from `msmemscope_*/device_*/dump/memscope_dump_*.csv`.
//!
//! - the MSTX C API through the header, from tests/fixtures/mstx_marks.c (built here with gcc,
//!   `-DMSMEMSCOPE_MSTX_WEAK`, so it also runs without the tool);
//! - NVTX injection, from the `nvtx` PyPI package (domain API, registered strings) and from
//!   `torch.cuda.nvtx` (CORE A calls), run with the project's `.venv` (made by scripts/setup.sh).
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary),
//! gcc on PATH, and for the NVTX tests `.venv` with `nvtx` and `torch`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::util::{
    built_once, msmemscope_runs, output_within, parse_csv, repo, runtime_lib, venv_python, Scratch,
    BIN,
};

const HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";
/// Every run is killed (and the test fails) after this long.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

// ------------------------------------------------------------------------------------------
// Fixtures, runs

/// tests/fixtures/mstx_marks.c, built once per test process.
fn mstx_program() -> PathBuf {
    let include = repo().join("crates/runtime/include");
    built_once(
        "marks",
        "mstx_marks.c",
        "mstx_marks",
        &[
            "-O1",
            "-Wall",
            "-Werror",
            "-DMSMEMSCOPE_MSTX_WEAK",
            "-I",
            include.to_str().unwrap(),
        ],
        &["-pthread"],
    )
}

/// Runs `cmd` to completion, killing it after [`RUN_TIMEOUT`].
fn run_with_timeout(cmd: Command) -> Output {
    output_within(cmd, RUN_TIMEOUT)
}

/// `msmemscope-cli --analysis=none -o OUT program...`, checked to succeed.
fn run_cli(out: &Path, program: &[&OsStr]) -> Output {
    runtime_lib();
    let mut cmd = Command::new(BIN);
    cmd.arg("--analysis=none")
        .arg("-o")
        .arg(out)
        .args(program)
        .current_dir(out)
        .env_remove("LD_PRELOAD")
        .env_remove("NVTX_INJECTION64_PATH");
    let output = run_with_timeout(cmd);
    assert!(
        output.status.success(),
        "msmemscope-cli --analysis=none {:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        program,
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

// ------------------------------------------------------------------------------------------
// The dump

/// One CSV row, by column name.
#[derive(Debug, Clone)]
struct Row {
    id: u64,
    event: String,
    event_type: String,
    name: String,
    tid: String,
    attrs: serde_json::Map<String, serde_json::Value>,
}

impl Row {
    fn range_id(&self) -> Option<u64> {
        self.attrs.get("range_id").and_then(|v| v.as_u64())
    }

    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).and_then(|v| v.as_str())
    }
}

/// Every row of every `memscope_dump_*.csv` of the single run directory under `out`, by ID.
fn dump_rows(out: &Path) -> Vec<Row> {
    let runs: Vec<PathBuf> = msmemscope_runs(out).expect("read output dir");
    assert_eq!(
        runs.len(),
        1,
        "one run directory expected under {out:?}: {runs:?}"
    );
    let mut files = Vec::new();
    for dev in std::fs::read_dir(&runs[0]).expect("read run dir").flatten() {
        if !dev.file_name().to_string_lossy().starts_with("device_") {
            continue;
        }
        let Ok(dump) = std::fs::read_dir(dev.path().join("dump")) else {
            continue;
        };
        for f in dump.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.starts_with("memscope_dump_") && name.ends_with(".csv") {
                files.push(f.path());
            }
        }
    }
    assert!(
        !files.is_empty(),
        "no device_*/dump/memscope_dump_*.csv under {:?}; the run directory holds: {:?}",
        runs[0],
        list_tree(&runs[0])
    );
    let mut rows = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read dump");
        let mut records = parse_csv(&text).into_iter();
        let header = records.next().map(|r| r.join(",")).unwrap_or_default();
        assert_eq!(header, HEADER, "header of {file:?}");
        for r in records {
            assert_eq!(
                r.len(),
                12,
                "row of {file:?} with {} fields: {r:?}",
                r.len()
            );
            let attrs = match serde_json::from_str::<serde_json::Value>(&r[9]) {
                Ok(serde_json::Value::Object(m)) => m,
                _ => panic!("Attr of {file:?} is not a JSON object: {r:?}"),
            };
            rows.push(Row {
                id: r[0].parse().unwrap_or_else(|_| panic!("ID of {r:?}")),
                event: r[1].clone(),
                event_type: r[2].clone(),
                name: r[3].clone(),
                tid: r[6].clone(),
                attrs,
            });
        }
    }
    rows.sort_by_key(|r| r.id);
    rows
}

fn list_tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn mstx(rows: &[Row]) -> Vec<Row> {
    rows.iter().filter(|r| r.event == "MSTX").cloned().collect()
}

fn kinds(rows: &[Row]) -> Vec<(String, String)> {
    rows.iter()
        .map(|r| (r.event_type.clone(), r.name.clone()))
        .collect()
}

fn expect_kinds(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(t, n)| (t.to_string(), n.to_string()))
        .collect()
}

/// Every Range_end's range_id names an earlier Range_start with the same message, and every
/// range id is started once and ended once.
fn check_range_pairs(rows: &[Row]) {
    let mut open: BTreeMap<u64, String> = BTreeMap::new();
    let mut ended = Vec::new();
    for r in rows {
        match r.event_type.as_str() {
            "Range_start" => {
                let id = r.range_id().unwrap_or_else(|| panic!("no range_id: {r:?}"));
                assert_ne!(id, 0);
                assert!(open.insert(id, r.name.clone()).is_none(), "id {id} reused");
                assert!(!ended.contains(&id), "id {id} reused after its end");
            }
            "Range_end" => {
                let id = r.range_id().unwrap_or_else(|| panic!("no range_id: {r:?}"));
                let start = open
                    .remove(&id)
                    .unwrap_or_else(|| panic!("end without start: {r:?}"));
                assert_eq!(start, r.name, "Range_end {id} carries its start's message");
                ended.push(id);
            }
            "Mark" => assert_eq!(r.range_id(), None, "{r:?}"),
            other => panic!("unexpected MSTX event type {other}: {r:?}"),
        }
    }
    assert!(open.is_empty(), "ranges never ended: {open:?}");
}

// ------------------------------------------------------------------------------------------
// MSTX C API

#[test]
fn c_api_marks_and_ranges_become_mstx_rows() {
    let scratch = Scratch::new("c");
    let prog = mstx_program();
    let output = run_cli(scratch.path(), &[prog.as_os_str()]);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(stdout.starts_with("present=1\n"), "stdout:\n{stdout}");
    assert!(stdout.contains("null range id 0\n"), "stdout:\n{stdout}");
    // The ids the program was given.
    let mut given: BTreeMap<String, u64> = BTreeMap::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("range ") {
            let (message, id) = rest.rsplit_once(' ').unwrap();
            given.insert(message.to_string(), id.parse().unwrap());
        }
    }
    assert_eq!(given.len(), 5, "stdout:\n{stdout}");

    let rows = dump_rows(scratch.path());
    let marks = mstx(&rows);
    assert_eq!(
        kinds(&marks),
        expect_kinds(&[
            ("Mark", "epoch begin"),
            ("Range_start", "load data"),
            ("Range_start", "outer"),
            ("Range_start", "inner"),
            ("Range_end", "inner"),
            ("Range_end", "outer"),
            ("Range_end", "load data"),
            ("Mark", "bad \u{fffd} byte"),
            ("Range_start", "step start"),
            ("Range_end", "step start"),
            ("Range_start", "threaded"),
            ("Range_end", "threaded"),
            ("Mark", "epoch end"),
        ])
    );
    check_range_pairs(&marks);
    for r in marks.iter().filter(|r| r.event_type == "Range_start") {
        assert_eq!(r.range_id(), Some(given[&r.name]), "{r:?}");
    }
    // The stream of "load data", and no stream where the program passed NULL.
    assert_eq!(marks[1].attr("stream"), Some("0x00000000c0ffee00"));
    for (i, r) in marks.iter().enumerate() {
        if i != 1 {
            assert_eq!(r.attr("stream"), None, "{r:?}");
        }
    }
    // The range ended on another thread: its end row is that thread's.
    assert_ne!(
        marks[10].tid, marks[11].tid,
        "{:?} / {:?}",
        marks[10], marks[11]
    );
    assert_eq!(marks[10].tid, marks[0].tid);

    // A range named "step start" is a step boundary: a SYSTEM STEP row follows its start.
    let start_at = rows
        .iter()
        .position(|r| r.event == "MSTX" && r.name == "step start")
        .unwrap();
    let next_system = rows[start_at..]
        .iter()
        .find(|r| r.event == "SYSTEM")
        .unwrap_or_else(|| panic!("no SYSTEM row after the 'step start' range: {rows:?}"));
    assert_eq!(next_system.event_type, "STEP", "{next_system:?}");
}

#[test]
fn c_program_built_with_weak_symbols_runs_without_the_tool() {
    let output = run_with_timeout({
        let mut c = Command::new(mstx_program());
        c.env_remove("LD_PRELOAD");
        c
    });
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("present=0\n"), "stdout:\n{stdout}");
    assert!(stdout.contains("range load data 0\n"), "stdout:\n{stdout}");
    assert!(stdout.ends_with("done\n"), "stdout:\n{stdout}");
}

// ------------------------------------------------------------------------------------------
// NVTX injection

#[test]
fn launcher_points_nvtx_at_the_runtime_library() {
    let scratch = Scratch::new("env");
    let output = run_cli(
        scratch.path(),
        &["sh", "-c", "printf '%s' \"$NVTX_INJECTION64_PATH\""].map(OsStr::new),
    );
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).into_owned());
    assert!(
        path.is_file()
            && std::fs::canonicalize(&path).ok() == std::fs::canonicalize(runtime_lib()).ok(),
        "NVTX_INJECTION64_PATH in the target is {path:?}, not the runtime library"
    );
}

/// Runs `script` with the project's Python under the CLI; returns the dump's MSTX rows.
fn python_marks(tag: &str, script: &str) -> Vec<Row> {
    let python = venv_python();
    let scratch = Scratch::new(tag);
    let output = run_cli(
        scratch.path(),
        &[python.as_os_str(), OsStr::new("-c"), OsStr::new(script)],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("script done"), "stdout:\n{stdout}");
    mstx(&dump_rows(scratch.path()))
}

#[test]
fn nvtx_package_marks_and_ranges_become_mstx_rows() {
    let marks = python_marks(
        "nvtx",
        "import nvtx\n\
         nvtx.mark('hello')\n\
         with nvtx.annotate('region'):\n\
         \x20   nvtx.mark('inside', domain='mydomain')\n\
         rng = nvtx.start_range('r2')\n\
         nvtx.end_range(rng)\n\
         @nvtx.annotate('decorated', color='blue')\n\
         def f():\n\
         \x20   return 1\n\
         f()\n\
         f()\n\
         print('script done')\n",
    );
    assert_eq!(
        kinds(&marks),
        expect_kinds(&[
            ("Mark", "hello"),
            ("Range_start", "region"),
            ("Mark", "inside"),
            ("Range_end", "region"),
            ("Range_start", "r2"),
            ("Range_end", "r2"),
            ("Range_start", "decorated"),
            ("Range_end", "decorated"),
            ("Range_start", "decorated"),
            ("Range_end", "decorated"),
        ]),
        "{marks:#?}"
    );
    check_range_pairs(&marks);
    assert_eq!(marks[2].attr("domain"), Some("mydomain"), "{:?}", marks[2]);
}

#[test]
fn torch_cuda_nvtx_marks_and_ranges_become_mstx_rows() {
    let marks = python_marks(
        "torch",
        "import torch\n\
         torch.cuda.nvtx.mark('tmark')\n\
         torch.cuda.nvtx.range_push('tpush')\n\
         torch.cuda.nvtx.range_push('tnested')\n\
         torch.cuda.nvtx.range_pop()\n\
         torch.cuda.nvtx.range_pop()\n\
         r = torch.cuda.nvtx.range_start('tstart')\n\
         with torch.cuda.nvtx.range('tctx'):\n\
         \x20   pass\n\
         torch.cuda.nvtx.range_end(r)\n\
         print('script done')\n",
    );
    assert_eq!(
        kinds(&marks),
        expect_kinds(&[
            ("Mark", "tmark"),
            ("Range_start", "tpush"),
            ("Range_start", "tnested"),
            ("Range_end", "tnested"),
            ("Range_end", "tpush"),
            ("Range_start", "tstart"),
            ("Range_start", "tctx"),
            ("Range_end", "tctx"),
            ("Range_end", "tstart"),
        ]),
        "{marks:#?}"
    );
    check_range_pairs(&marks);
}
