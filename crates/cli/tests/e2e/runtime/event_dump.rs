//! The event dump end to end: a C producer of the runtime's C ABI (tests/fixtures/
//! emit_events.c, built here with gcc) run under the real CLI, and the CSV and SQLite files it
//! leaves, checked row by row for each option that shapes the dump.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::util::{self, launch_ok, parse_csv, Scratch};

fn producer() -> PathBuf {
    util::producer("emit_events")
}

fn run(scratch: &Scratch, options: &[&str], mode: &[&str]) -> Output {
    let producer = producer();
    let mut program = vec![producer.as_os_str()];
    program.extend(mode.iter().map(OsStr::new));
    launch_ok(options, &scratch.0.join("out"), &program)
}

/// The dump file(s) of one device, e.g. `device_cpu`, in every run under `out`.
fn device_dumps(scratch: &Scratch, device: &str) -> Vec<PathBuf> {
    let out = scratch.0.join("out");
    let mut files = Vec::new();
    for run in std::fs::read_dir(&out).unwrap().flatten() {
        let dir = run.path().join(device).join("dump");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            files.extend(entries.flatten().map(|e| e.path()));
        }
    }
    files.sort();
    files
}

/// A row reduced to what the options decide: (Event, Event Type, Name, Device Id, Ptr, Attr).
type Row = (String, String, String, String, String, String);

/// The records of a CSV dump.
fn csv_rows(path: &Path) -> Vec<Vec<String>> {
    parse_csv(&std::fs::read_to_string(path).unwrap())
}

fn rows_of(path: &Path) -> Vec<Row> {
    let rows = csv_rows(path);
    assert_eq!(
        rows[0].join(","),
        "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)"
    );
    let mut last_ts = 0u64;
    let mut last_id = 0u64;
    rows[1..]
        .iter()
        .map(|r| {
            assert_eq!(r.len(), 12, "{r:?}");
            let (id, ts): (u64, u64) = (r[0].parse().unwrap(), r[4].parse().unwrap());
            assert!(id > last_id && ts >= last_ts, "rows out of order at {r:?}");
            (last_id, last_ts) = (id, ts);
            (
                r[1].clone(),
                r[2].clone(),
                r[3].clone(),
                r[7].clone(),
                r[8].clone(),
                r[9].clone(),
            )
        })
        .collect()
}

/// The rows of the first dump file of `device` in the scratch's runs.
fn dump_rows(scratch: &Scratch, device: &str) -> Vec<Row> {
    rows_of(&device_dumps(scratch, device)[0])
}

/// The Attr of every MALLOC row (`{"size":N}`), in order.
fn malloc_attrs(rows: &[Row]) -> Vec<&str> {
    rows.iter()
        .filter(|r| r.0 == "MALLOC")
        .map(|r| r.5.as_str())
        .collect()
}

fn row(e: &str, t: &str, name: &str, dev: &str, ptr: &str, attr: &str) -> Row {
    (
        e.into(),
        t.into(),
        name.into(),
        dev.into(),
        ptr.into(),
        attr.into(),
    )
}

fn system(t: &str, name: &str) -> Row {
    row("SYSTEM", t, name, "N/A", "N/A", "{}")
}

fn cpu_step(s: u64) -> Vec<Row> {
    let ptr = format!("0x{:016x}", 0x1000 * s);
    vec![
        system("STEP", &s.to_string()),
        row(
            "MALLOC",
            "PTA",
            "N/A",
            "cpu",
            &ptr,
            &format!("{{\"size\":{}}}", 1000 * s),
        ),
        row(
            "OP_LAUNCH",
            "ATEN_START",
            "aten::add.Tensor",
            "N/A",
            "N/A",
            "{}",
        ),
        row(
            "OP_LAUNCH",
            "ATEN_END",
            "aten::add.Tensor",
            "N/A",
            "N/A",
            "{}",
        ),
        row("FREE", "PTA", "N/A", "cpu", &ptr, "{}"),
    ]
}

#[test]
fn default_dump_has_allocs_frees_launches_and_steps() {
    let scratch = Scratch::new("default");
    let out = run(&scratch, &["--analysis=none"], &["steps"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "steps done\n");
    let cpu = device_dumps(&scratch, "device_cpu");
    assert_eq!(cpu.len(), 1);
    let mut want = vec![system("START_TRACE", "N/A")];
    for s in 1..=4 {
        want.extend(cpu_step(s));
    }
    want.push(system("STOP_TRACE", "N/A"));
    assert_eq!(rows_of(&cpu[0]), want);
    // The CUDA rows go to device_0, with the rows that have no device.
    let cuda = dump_rows(&scratch, "device_0");
    let mallocs: Vec<&Row> = cuda.iter().filter(|r| r.0 == "MALLOC").collect();
    assert_eq!(mallocs.len(), 4);
    assert_eq!(
        mallocs[1],
        &row(
            "MALLOC",
            "PTA",
            "N/A",
            "0",
            "0x0000000000012000",
            "{\"size\":128}"
        )
    );
    assert!(cuda.iter().all(|r| r.3 == "0" || r.3 == "N/A"));
    // device_0 opened after device_cpu, yet holds every row without a device from the start:
    // the writer replays them from the first file when a device file opens.
    let deviceless = |rows: &[Row]| {
        rows.iter()
            .filter(|r| r.3 == "N/A")
            .cloned()
            .collect::<Vec<Row>>()
    };
    let cpu_rows = rows_of(&cpu[0]);
    assert_eq!(deviceless(&cuda), deviceless(&cpu_rows));
    assert_eq!(cuda[0], system("START_TRACE", "N/A"));
}

/// Op rows through `msmemscope_emit_op` (an interned name, kept by address) are the rows
/// `msmemscope_emit` makes, in order with the rows around them; with the OOM analysis on they
/// take the whole-row path, with the same result. Another event type is refused.
#[test]
fn op_rows_by_interned_name() {
    let op = |t: &str| row("OP_LAUNCH", t, "aten::mm.default", "N/A", "N/A", "{}");
    let want = vec![
        system("START_TRACE", "N/A"),
        op("ATEN_START"),
        row(
            "MALLOC",
            "PTA",
            "N/A",
            "cpu",
            "0x0000000000000040",
            "{\"size\":64}",
        ),
        op("ATEN_END"),
        system("STOP_TRACE", "N/A"),
    ];
    for (name, analysis) in [("ops", "--analysis=none"), ("ops-oom", "--analysis=oom")] {
        let scratch = Scratch::new(name);
        let out = run(&scratch, &[analysis], &["ops"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ops done -1\n");
        let cpu = device_dumps(&scratch, "device_cpu");
        assert_eq!(cpu.len(), 1, "{analysis}");
        assert_eq!(rows_of(&cpu[0]), want, "{analysis}");
    }
}

#[test]
fn events_option_selects_rows() {
    let scratch = Scratch::new("access");
    run(
        &scratch,
        &["--analysis=none", "--events=alloc，free,launch,access"],
        &["steps"],
    );
    let rows = dump_rows(&scratch, "device_cpu");
    let access: Vec<&Row> = rows.iter().filter(|r| r.0 == "ACCESS").collect();
    assert_eq!(access.len(), 8);
    assert_eq!(
        access[0],
        &row(
            "ACCESS",
            "READ",
            "aten::add.Tensor",
            "cpu",
            "0x0000000000001000",
            "{\"dtype\":\"float32\",\"shape\":[2,3]}"
        )
    );
    assert_eq!(access[1].1, "WRITE");

    let scratch = Scratch::new("alloc-only");
    run(&scratch, &["--analysis=none", "--events=alloc"], &["steps"]);
    let rows = dump_rows(&scratch, "device_cpu");
    let kinds: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(kinds, ["MALLOC", "SYSTEM"].into_iter().collect());
    assert_eq!(rows.iter().filter(|r| r.0 == "MALLOC").count(), 4);
}

#[test]
fn device_option_keeps_one_device() {
    let scratch = Scratch::new("device");
    run(
        &scratch,
        &["--analysis=none", "--device=cuda:0"],
        &["steps"],
    );
    assert!(
        device_dumps(&scratch, "device_cpu").is_empty(),
        "no CPU rows, so no CPU file"
    );
    let rows = dump_rows(&scratch, "device_0");
    assert_eq!(rows.iter().filter(|r| r.0 == "MALLOC").count(), 4);
    assert_eq!(rows.iter().filter(|r| r.0 == "FREE").count(), 0);
    assert_eq!(rows.first(), Some(&system("START_TRACE", "N/A")));

    let scratch = Scratch::new("device-cpu");
    run(&scratch, &["--analysis=none", "--device=cpu"], &["steps"]);
    assert!(device_dumps(&scratch, "device_0").is_empty());
}

#[test]
fn steps_option_keeps_listed_steps() {
    let scratch = Scratch::new("steps");
    run(&scratch, &["--steps=2,4", "--device=cpu"], &["steps"]);
    let rows = dump_rows(&scratch, "device_cpu");
    let mut want = vec![system("START_TRACE", "N/A"), system("STEP", "1")];
    want.extend(cpu_step(2));
    want.push(system("STEP", "3"));
    want.extend(cpu_step(4));
    want.push(system("STOP_TRACE", "N/A"));
    assert_eq!(rows, want);
}

#[test]
fn deferred_mode_waits_for_start() {
    let scratch = Scratch::new("deferred");
    run(
        &scratch,
        &["--analysis=none", "--collect-mode=deferred"],
        &["deferred"],
    );
    let rows = dump_rows(&scratch, "device_cpu");
    let sizes = malloc_attrs(&rows);
    assert_eq!(sizes, ["{\"size\":30}", "{\"size\":40}", "{\"size\":50}"]);
    assert_eq!(rows.first(), Some(&system("START_TRACE", "N/A")));
    assert_eq!(rows.last(), Some(&system("STOP_TRACE", "N/A")));
    // Immediate mode records from the start (the run's own START_TRACE; start() is then a no-op).
    let scratch = Scratch::new("immediate");
    run(&scratch, &["--analysis=none"], &["deferred"]);
    let rows = dump_rows(&scratch, "device_cpu");
    assert_eq!(rows.iter().filter(|r| r.0 == "MALLOC").count(), 5);
}

#[test]
fn db_format_holds_the_same_rows() {
    let csv = Scratch::new("csv");
    run(
        &csv,
        &["--analysis=none", "--events=alloc,free,launch,access"],
        &["steps"],
    );
    let csv_rows = dump_rows(&csv, "device_cpu");
    let db = Scratch::new("db");
    run(
        &db,
        &[
            "--analysis=none",
            "--events=alloc,free,launch,access",
            "--format=db",
        ],
        &["steps"],
    );
    let files = device_dumps(&db, "device_cpu");
    assert_eq!(files.len(), 1);
    assert!(files[0].extension().is_some_and(|e| e == "db"), "{files:?}");
    let conn = rusqlite::Connection::open(&files[0]).unwrap();
    let mut stmt = conn
        .prepare("SELECT \"Event\", \"Event Type\", \"Name\", \"Device Id\", \"Ptr\", \"Attr\" FROM memscope_dump ORDER BY \"ID\"")
        .unwrap();
    let db_rows: Vec<Row> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(db_rows, csv_rows);
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('memscope_dump')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(columns.join(","), "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)");
}

#[test]
fn sigterm_leaves_a_readable_dump() {
    let scratch = Scratch::new("sigterm");
    // The launcher's stdout said "waiting": the program has emitted both rows and sleeps.
    let (mut child, target) =
        util::launch_sleeping_producer(&["--analysis=none"], &scratch.0.join("out"), Stdio::null());
    std::thread::sleep(Duration::from_millis(1200));
    // SAFETY: sending SIGTERM to our own grandchild.
    unsafe { libc::kill(target, libc::SIGTERM) };
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "the launcher dies of the target's signal"
    );
    let rows = dump_rows(&scratch, "device_cpu");
    let sizes = malloc_attrs(&rows);
    // Both rows are more than a second old when the signal arrives.
    assert_eq!(sizes, ["{\"size\":100}", "{\"size\":200}"]);
}

#[test]
fn oom_analysis_dumps_recent_and_largest_blocks() {
    let scratch = Scratch::new("oom");
    let out = run(&scratch, &["--analysis=oom:2"], &["oom"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "huge malloc failed\n");
    let rows = dump_rows(&scratch, "device_cpu");
    let oom: Vec<&Row> = rows
        .iter()
        .filter(|r| r.0 == "OOM_DETAIL" || r.0 == "SNAPSHOT")
        .collect();
    assert_eq!(oom.len(), 6, "{rows:?}");
    assert_eq!(oom[0].1, "OOM_TRIGGER");
    assert_eq!(
        oom[0].5,
        format!(
            "{{\"func\":\"malloc\",\"req_size\":{},\"error\":\"malloc returned NULL (ENOMEM)\"}}",
            1u64 << 50
        )
    );
    let detail = |r: &Row| (r.1.clone(), r.4.clone());
    assert_eq!(
        oom[1..5].iter().map(|r| detail(r)).collect::<Vec<_>>(),
        vec![
            (
                "OOM_RECENT_ALLOC".to_string(),
                "0x0000000000003000".to_string()
            ),
            (
                "OOM_RECENT_ALLOC".to_string(),
                "0x0000000000002000".to_string()
            ),
            (
                "OOM_TOP_ALLOC".to_string(),
                "0x0000000000002000".to_string()
            ),
            (
                "OOM_TOP_ALLOC".to_string(),
                "0x0000000000003000".to_string()
            ),
        ]
    );
    assert!(oom[3].5.contains("\"size\":5000"), "{:?}", oom[3]);
    assert_eq!(oom[5].1, "SNAPSHOT");
    assert!(
        oom[5]
            .5
            .starts_with("{\"allocated\":5400,\"live_blocks\":3,"),
        "{:?}",
        oom[5]
    );
}

#[test]
fn call_stack_c_depth_is_honoured_beyond_the_stack_key() {
    let c_stack_lines = |options: &[&str]| {
        let scratch = Scratch::new("deep");
        run(&scratch, options, &["deep"]);
        let records = csv_rows(&device_dumps(&scratch, "device_cpu")[0]);
        let malloc = records
            .iter()
            .find(|r| r[1] == "MALLOC")
            .expect("a MALLOC row")
            .clone();
        malloc[11].lines().map(str::to_string).collect::<Vec<_>>()
    };
    let shallow = c_stack_lines(&["--analysis=none", "--call-stack=c:5"]);
    assert_eq!(shallow.len(), 5, "{shallow:?}");
    assert!(
        shallow.iter().all(|f| f.starts_with("nested ")),
        "{shallow:?}"
    );
    let deep = c_stack_lines(&["--analysis=none", "--call-stack=c:60"]);
    // 41 frames of `nested`, then main and the C start-up: more than a stack key's 20.
    assert_eq!(
        deep.iter().filter(|f| f.starts_with("nested ")).count(),
        41,
        "{deep:?}"
    );
    assert!(deep.iter().any(|f| f.starts_with("main ")), "{deep:?}");
    let off = c_stack_lines(&["--analysis=none"]);
    assert!(off.is_empty(), "no C stack without --call-stack c: {off:?}");
}
