//! The Parquet dump end to end: `--format parquet` launches of the C producers (the writer's
//! segments, complete Parquet files, read as one dump, also after a SIGKILL of the target),
//! `msmemscope export --format parquet DIR` on CSV runs, and the offline analyses
//! (`check_leaks`, `check_inefficient`, `report`) on Parquet dumps, each compared with the same
//! run's CSV. Reading the files with pyarrow and DuckDB is tests/python/test_parquet.py's.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use msmemscope_core::analysis::{check_leaks::check_leaks, inefficient};
use msmemscope_core::events::{reader, EventRow};

use crate::util::{
    self, cli, dump_files, dump_fixture, launch_ok, launch_sleeping_producer, only_run_dir, stderr,
    stdout, Scratch, BIN,
};

/// Launches `producer mode` with `options`; returns the run directory and the launcher's output.
fn launch(scratch: &Scratch, options: &[&str], producer: &str, mode: &str) -> (PathBuf, Output) {
    let out_dir = scratch.path().join("out");
    let out = launch_ok(
        options,
        &out_dir,
        &[util::producer(producer).as_os_str(), mode.as_ref()],
    );
    (only_run_dir(&out_dir), out)
}

/// Every file under `device_*/dump/` of a run, relative to it.
fn dump_dir_files(run: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for device in std::fs::read_dir(run).unwrap().flatten() {
        let name = device.file_name().to_string_lossy().into_owned();
        if !name.starts_with("device_") {
            continue;
        }
        for f in std::fs::read_dir(device.path().join("dump"))
            .unwrap()
            .flatten()
        {
            files.push(format!("{name}/dump/{}", f.file_name().to_string_lossy()));
        }
    }
    files.sort();
    files
}

fn rows(path: &Path) -> Vec<EventRow> {
    reader::open(path).unwrap().map(|r| r.unwrap()).collect()
}

/// A row without what differs between two runs of the same program (time, process, thread).
fn comparable(mut row: EventRow) -> EventRow {
    row.ts_ns = 0;
    row.pid = 0;
    row.tid = 0;
    row
}

/// The dump of `device` in a run (one file), by extension.
fn dump(run: &Path, device: &str, ext: &str) -> PathBuf {
    let found: Vec<PathBuf> = dump_files(run, device)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

#[test]
fn a_parquet_launch_holds_the_rows_of_a_csv_launch() {
    let csv = Scratch::new("pq-launch-csv");
    let (csv_run, _) = launch(&csv, &["--analysis=none"], "emit_events", "steps");
    let pq = Scratch::new("pq-launch");
    let (run, out) = launch(
        &pq,
        &["--format=parquet", "--analysis=none"],
        "emit_events",
        "steps",
    );
    // A Parquet head per device (its later segments beside the parts, in `.steps/`), none
    // left open, and the launcher names the heads.
    let (files, later): (Vec<String>, Vec<String>) = dump_dir_files(&run)
        .into_iter()
        .partition(|f| !f.ends_with(".steps"));
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.iter().all(|f| f.ends_with(".parquet")), "{files:?}");
    for dir in later {
        for segment in std::fs::read_dir(run.join(dir)).unwrap().flatten() {
            let name = segment.file_name().to_string_lossy().into_owned();
            assert!(
                name.starts_with("head_") && name.ends_with(".parquet"),
                "{name}"
            );
        }
    }
    for f in &files {
        let line = format!("msmemscope: event dump: {}\n", run.join(f).display());
        assert!(stderr(&out).contains(&line), "{}", stderr(&out));
    }
    for device in ["device_cpu", "device_0"] {
        let want: Vec<EventRow> = rows(&dump(&csv_run, device, "csv"))
            .into_iter()
            .map(comparable)
            .collect();
        let got: Vec<EventRow> = rows(&dump(&run, device, "parquet"))
            .into_iter()
            .map(comparable)
            .collect();
        assert!(want.len() > 10, "{device}: {}", want.len());
        assert_eq!(got, want, "{device}");
    }
}

#[test]
fn a_sigkilled_target_leaves_its_closed_segments_in_parquet() {
    let scratch = Scratch::new("pq-sigkill");
    let out_dir = scratch.path().join("out");
    let (child, target) = launch_sleeping_producer(
        &["--format=parquet", "--analysis=none"],
        &out_dir,
        Stdio::piped(),
    );
    // The first row's segment closed at the writer's first drain, the second row's (written
    // 1.5 s later) a second after it: both complete when the target dies without a word.
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: sending SIGKILL to our own grandchild.
    unsafe { libc::kill(target, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", stderr(&out));
    let run = only_run_dir(&out_dir);
    let files = dump_dir_files(&run);
    assert_eq!(files.len(), 2, "{files:?}");
    let head = files[0].clone();
    assert!(head.ends_with(".parquet"), "{files:?}");
    assert_eq!(files[1], head.replace(".parquet", ".steps"));
    let later: Vec<String> = std::fs::read_dir(run.join(&files[1]))
        .unwrap()
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(later, ["head_000001.parquet"]);
    assert!(!stderr(&out).contains("the run ended while this segment"));
    let sizes: Vec<Option<u64>> = rows(&dump(&run, "device_cpu", "parquet"))
        .iter()
        .filter(|r| r.event == msmemscope_core::events::Event::Malloc)
        .map(|r| r.attr_u64("size"))
        .collect();
    assert_eq!(sizes, [Some(100), Some(200)]);
}

#[test]
fn export_writes_beside_each_dump_then_leaves_them_alone() {
    let scratch = Scratch::new("pq-export");
    let (run, _) = launch(&scratch, &["--analysis=none"], "emit_events", "steps");
    let out_dir = scratch.path().join("out");
    // DIR may be the output directory holding runs.
    let out = cli(&[
        "export".as_ref(),
        "--format".as_ref(),
        "parquet".as_ref(),
        out_dir.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    let written: Vec<PathBuf> = stdout(&out).lines().map(PathBuf::from).collect();
    assert_eq!(
        written,
        [
            dump(&run, "device_0", "parquet"),
            dump(&run, "device_cpu", "parquet")
        ]
    );
    for device in ["device_cpu", "device_0"] {
        assert_eq!(
            rows(&dump(&run, device, "parquet")),
            rows(&dump(&run, device, "csv")),
            "{device}: the same rows, values and order"
        );
    }
    let before = std::fs::metadata(&written[0]).unwrap().modified().unwrap();
    // Again on the run directory: nothing is replaced, one line per file says so.
    let out = cli(&[
        "export".as_ref(),
        "--format=parquet".as_ref(),
        run.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        written
            .iter()
            .map(|p| format!("msmemscope: {} exists: left alone\n", p.display()))
            .collect::<String>()
    );
    assert_eq!(
        std::fs::metadata(&written[0]).unwrap().modified().unwrap(),
        before
    );
    // The report reads the CSV, not both: every row once.
    let out = cli(&["report".as_ref(), run.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn export_refuses_bad_input_in_one_line() {
    let scratch = Scratch::new("pq-bad");
    let dir = scratch.path();
    let export = |target: &Path| {
        cli(&[
            "export".as_ref(),
            "--format=parquet".as_ref(),
            target.as_os_str(),
        ])
    };
    let refused = |out: &Output, line: &str| {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
        assert_eq!(stderr(out), format!("msmemscope: {line}\n"));
        assert_eq!(stdout(out), "");
    };
    let missing = dir.join("missing");
    refused(
        &export(&missing),
        &format!("{}: no such directory; give a run directory (msmemscope_PID_TIMESTAMP) or the output directory holding runs", missing.display()),
    );
    // A run without a dump.
    let run = dir.join("msmemscope_1_20260101000000");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("config.json"), "{}").unwrap();
    refused(
        &export(&run),
        &format!(
            "{}: no event dump to export (device_*/dump/memscope_dump_*.csv or .db)",
            run.display()
        ),
    );
    // A dump that is not one: its file and line; nothing is left behind.
    let dumps = run.join("device_cpu/dump");
    std::fs::create_dir_all(&dumps).unwrap();
    let bad = dumps.join("memscope_dump_1.csv");
    std::fs::write(
        &bad,
        format!(
            "{}\n1,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n2,MSTX,Mark,a,5,1,1,N/A,0xZZ,{{}},,\n",
            msmemscope_core::events::csv::HEADER
        ),
    )
    .unwrap();
    refused(
        &export(&run),
        &format!("{}:3: malformed row: bad Ptr \"0xZZ\"", bad.display()),
    );
    assert_eq!(
        dump_dir_files(&run),
        ["device_cpu/dump/memscope_dump_1.csv"]
    );
    // A value Parquet's INT64 cannot hold.
    std::fs::write(
        &bad,
        format!(
            "{}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{{\"\"size\"\":9223372036854775808}}\",,\n",
            msmemscope_core::events::csv::HEADER
        ),
    )
    .unwrap();
    refused(
        &export(&run),
        &format!("{}: row ID 1: malformed row: Attr \"size\" is 9223372036854775808, above 9223372036854775807: the Parquet dump's integer columns are signed INT64", bad.display()),
    );
    assert_eq!(
        dump_dir_files(&run),
        ["device_cpu/dump/memscope_dump_1.csv"]
    );
    // A device directory that is a symlink is never followed.
    std::fs::remove_dir_all(run.join("device_cpu")).unwrap();
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("dump")).unwrap();
    std::fs::copy(
        dump_fixture("check_leaks.csv"),
        elsewhere.join("dump/memscope_dump_1.csv"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&elsewhere, run.join("device_cpu")).unwrap();
    refused(
        &export(&run),
        &format!(
            "{}: a symlink, not followed",
            run.join("device_cpu/dump").display()
        ),
    );
    assert_eq!(
        std::fs::read_dir(elsewhere.join("dump")).unwrap().count(),
        1
    );
    // Usage.
    let out = cli(&["export".as_ref(), "--format=parquet".as_ref()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "msmemscope: export needs a directory; usage: msmemscope export --format torch-snapshot|parquet DIR\n"
    );
    let out = cli(&["export".as_ref(), "--format=orc".as_ref(), dir.as_os_str()]);
    assert_eq!(
        stderr(&out),
        "msmemscope: invalid export --format \"orc\": accepted values are torch-snapshot, parquet\n"
    );
}

/// A hand-written dump in a run directory's layout, exported; returns (csv, parquet).
fn exported_fixture(scratch: &Scratch, fixture: &str) -> (PathBuf, PathBuf) {
    let run = scratch.path().join("msmemscope_1_20260101000000");
    let dumps = run.join("device_cpu/dump");
    std::fs::create_dir_all(&dumps).unwrap();
    let csv = dumps.join(format!(
        "memscope_dump_{}.csv",
        fixture.trim_end_matches(".csv")
    ));
    std::fs::copy(dump_fixture(fixture), &csv).unwrap();
    let out = cli(&[
        "export".as_ref(),
        "--format=parquet".as_ref(),
        run.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (csv.clone(), csv.with_extension("parquet"))
}

#[test]
fn check_leaks_and_check_inefficient_read_parquet() {
    let scratch = Scratch::new("pq-leaks");
    let (csv, parquet) = exported_fixture(&scratch, "check_leaks.csv");
    let on_csv = check_leaks(&csv, "test", 0).unwrap();
    assert_eq!(on_csv.leaks.len(), 3);
    assert_eq!(check_leaks(&parquet, "test", 0).unwrap(), on_csv);
    for fixture in [
        "inefficient_early.csv",
        "inefficient_late.csv",
        "inefficient_idle.csv",
    ] {
        let scratch = Scratch::new("pq-inefficient");
        let (csv, parquet) = exported_fixture(&scratch, fixture);
        let options = inefficient::Options::default();
        let on_csv = inefficient::check_inefficient(&csv, &options).unwrap();
        assert!(!on_csv.is_empty(), "{fixture}");
        assert_eq!(
            inefficient::check_inefficient(&parquet, &options).unwrap(),
            on_csv
        );
    }
}

#[test]
fn report_and_compare_read_parquet() {
    let page_data = |run: &Path| -> serde_json::Value {
        let html = std::fs::read_to_string(run.join("msmemscope_report.html")).unwrap();
        let island = html
            .split("<script id=\"report-data\" type=\"application/json\">")
            .nth(1)
            .unwrap();
        let mut data: serde_json::Value = serde_json::from_str(
            &island
                .split("</script>")
                .next()
                .unwrap()
                .replace("<\\/", "</"),
        )
        .unwrap();
        for t in data["timelines"].as_array_mut().unwrap() {
            t["file"] = serde_json::Value::Null;
        }
        data["run"] = serde_json::Value::Null;
        data["config"] = serde_json::Value::Null;
        data
    };
    // The page of a CSV run, then of the same rows as Parquet (the CSV removed).
    let scratch = Scratch::new("pq-report");
    let (run, _) = launch(&scratch, &["--report"], "emit_leaks", "leak");
    let from_csv = page_data(&run);
    let out = cli(&[
        "export".as_ref(),
        "--format=parquet".as_ref(),
        run.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for device in ["device_cpu", "device_0"] {
        std::fs::remove_file(dump(&run, device, "csv")).unwrap();
    }
    let out = cli(&["report".as_ref(), run.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let from_parquet = page_data(&run);
    assert_eq!(from_parquet["timelines"].as_array().unwrap().len(), 2);
    assert_eq!(from_parquet, from_csv);
    // `--report` of a `--format parquet` launch: its page finds the same leaks.
    let pq = Scratch::new("pq-report-launch");
    let (pq_run, out) = launch(
        &pq,
        &["--report", "--format", "parquet"],
        "emit_leaks",
        "leak",
    );
    assert!(
        stderr(&out).contains("msmemscope: report: "),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        page_data(&pq_run)["leaks"]["rows"],
        from_csv["leaks"]["rows"]
    );
    // --compare of two Parquet dumps.
    let cpu = dump(&pq_run, "device_cpu", "parquet");
    let out = Command::new(BIN)
        .arg("--compare")
        .arg(format!("--input-path={},{}", cpu.display(), cpu.display()))
        .arg("-o")
        .arg(pq.path().join("compare"))
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn export_finishes_the_journals_of_a_killed_launcher() {
    // A `--format parquet` run whose launcher died with its target: a journal cut mid-row.
    let scratch = Scratch::new("pq-orphan");
    let run = scratch.path().join("msmemscope_1_20260101000000");
    let dumps = run.join("device_cpu/dump");
    std::fs::create_dir_all(&dumps).unwrap();
    std::fs::write(run.join("config.json"), "{\"format\": \"parquet\"}").unwrap();
    let journal = dumps.join("memscope_dump_1.csv");
    std::fs::write(
        &journal,
        format!(
            "{}\n1,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n2,MSTX,Mark,b,6,1,1,N/A,N/A,{{}},,\n3,MSTX,Ma",
            msmemscope_core::events::csv::HEADER
        ),
    )
    .unwrap();
    let out = cli(&[
        "export".as_ref(),
        "--format=parquet".as_ref(),
        run.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parquet = dumps.join("memscope_dump_1.parquet");
    assert_eq!(stdout(&out), format!("{}\n", parquet.display()));
    assert_eq!(
        stderr(&out),
        format!(
            "msmemscope: {}: the journal's last row, cut off when the run was killed, is left out\n",
            parquet.display()
        )
    );
    assert_eq!(
        dump_dir_files(&run),
        ["device_cpu/dump/memscope_dump_1.parquet"]
    );
    let names: Vec<String> = rows(&parquet).into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["a", "b"]);
}
