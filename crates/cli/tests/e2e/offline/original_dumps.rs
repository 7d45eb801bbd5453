//! The original msMemScope's own dumps (tests/data/msmemscope-original/, from its public
//! repository: two current-format op-level files and two older "msleaks" files with two
//! processes each) read by every offline command, end to end through the CLI.

use std::path::{Path, PathBuf};
use std::process::Output;

use msmemscope_core::events::{reader, Event, EventRow};

use crate::util::{cli_in, repo, stderr, Scratch};

fn data(name: &str) -> PathBuf {
    repo().join("tests/data/msmemscope-original").join(name)
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    cli_in(dir, args)
}

/// The compare file the command printed, and its text.
fn compare(dir: &Path, level: &str, base: &Path, other: &Path) -> (String, String) {
    let out = cli(
        dir,
        &[
            "--compare",
            &format!("--level={level}"),
            &format!("--input-path={},{}", base.display(), other.display()),
            "-o",
            dir.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = std::fs::read_to_string(path.trim()).unwrap();
    (text, stderr(&out))
}

const COMPARE_HEADER: &str = ",,,Base,Compare\n\
Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)\n";

#[test]
fn op_compare_of_the_original_examples_finds_the_two_unfreed_blocks() {
    let scratch = Scratch::new("original-op");
    let (base, other) = (data("baseline.csv"), data("leaks.csv"));
    let before = std::fs::read(&other).unwrap();
    let (text, err) = compare(scratch.path(), "op", &base, &other);
    assert!(text.starts_with(COMPARE_HEADER), "{text}");
    let rows: Vec<&str> = text.lines().skip(2).collect();
    assert_eq!(rows.len(), 44);
    // Every op allocates as much in both runs, but for the two copies leaks.csv makes and never
    // frees (the original's own example).
    let changed: Vec<&str> = rows
        .iter()
        .copied()
        .filter(|r| !r.ends_with(",0"))
        .collect();
    assert_eq!(
        changed,
        [
            "OP_LAUNCH,aten::_to_copy,0,N/A,4000256,4000256",
            "OP_LAUNCH,aten::_to_copy,0,N/A,4000256,4000256"
        ]
    );
    assert!(rows.contains(&"OP_LAUNCH,aten::mse_loss,0,37750272,37750272,0"));
    // One note per file, saying what was read and changed.
    let notes: Vec<&str> = err.lines().collect();
    assert_eq!(notes.len(), 2, "{err}");
    assert!(notes.contains(&format!(
        "msmemscope: note: {}: read as a dump of the original msMemScope (current format): 130 rows; \
         Attr {{key:value}} read as JSON; 88 op names torch._ops.NS.OP.OVERLOAD read as NS::OP; \
         20 rows out of time order put in place",
        other.display()
    ).as_str()), "{err}");
    assert_eq!(
        std::fs::read(&other).unwrap(),
        before,
        "the input is never written"
    );
}

const OLD_KERNEL_ROWS: [&str; 12] = [
    "KERNEL_LAUNCH,N/A,0,68096,68096,0",
    "KERNEL_LAUNCH,N/A,0,0,0,0",
    "KERNEL_LAUNCH,N/A,0,42496,42496,0",
    "KERNEL_LAUNCH,N/A,0,1024,1536,512",
    "KERNEL_LAUNCH,N/A,0,512,18936320,18935808",
    "KERNEL_LAUNCH,N/A,0,18936320,N/A,-18936320",
    "KERNEL_LAUNCH,N/A,1,68096,68096,0",
    "KERNEL_LAUNCH,N/A,1,0,0,0",
    "KERNEL_LAUNCH,N/A,1,42496,42496,0",
    "KERNEL_LAUNCH,N/A,1,1024,1024,0",
    "KERNEL_LAUNCH,N/A,1,0,18936832,18936832",
    "KERNEL_LAUNCH,N/A,1,18936832,N/A,-18936832",
];

#[test]
fn kernel_compare_of_the_old_format_files_has_twelve_rows() {
    let scratch = Scratch::new("original-kernel");
    let (a, b) = (data("old_format_rank_a.csv"), data("old_format_rank_b.csv"));
    let (text, err) = compare(scratch.path(), "kernel", &a, &b);
    assert_eq!(
        text,
        format!("{COMPARE_HEADER}{}\n", OLD_KERNEL_ROWS.join("\n"))
    );
    assert!(
        err.contains(&format!(
            "msmemscope: note: {}: read as a dump of the original msMemScope (older, msleaks \
             format): 328 rows; Attr {{key:value}} read as JSON; 312 empty Attr values left out; \
             14 negative FREE sizes read as their magnitude; 2 `acl init` rows left out; \
             Timestamp(ns) read as microseconds; 312 decimal Ptr values; 10 rows of device host \
             read as cpu; 40 rows out of time order put in place; 2 processes (2523740, \
             2523738), one after the other; devices cpu, 0 have rows of more than one \
             process: analysed per device, their blocks are matched across those processes; \
             rows numbered anew in that order\n",
            a.display()
        )),
        "{err}"
    );
}

/// `csv` as an SQLite file with the original's older table name, every value as text.
fn to_leaks_dump_db(csv_path: &Path, db: &Path) {
    let mut reader = csv::Reader::from_path(csv_path).unwrap();
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    let conn = rusqlite::Connection::open(db).unwrap();
    let columns: Vec<String> = header.iter().map(|h| format!("\"{h}\" TEXT")).collect();
    conn.execute(
        &format!("CREATE TABLE leaks_dump ({})", columns.join(", ")),
        [],
    )
    .unwrap();
    let marks = vec!["?"; header.len()].join(", ");
    let mut insert = conn
        .prepare(&format!("INSERT INTO leaks_dump VALUES ({marks})"))
        .unwrap();
    for record in reader.records() {
        let record = record.unwrap();
        insert
            .execute(rusqlite::params_from_iter(record.iter()))
            .unwrap();
    }
}

#[test]
fn an_original_sqlite_dump_reads_as_its_csv() {
    let scratch = Scratch::new("original-db");
    let db = scratch.path().join("memscope_dump_20250428113810.db");
    to_leaks_dump_db(&data("old_format_rank_a.csv"), &db);
    let (text, err) = compare(
        scratch.path(),
        "kernel",
        &db,
        &data("old_format_rank_b.csv"),
    );
    assert_eq!(
        text,
        format!("{COMPARE_HEADER}{}\n", OLD_KERNEL_ROWS.join("\n"))
    );
    assert!(
        err.contains(&format!("{}: read as a dump of the original", db.display())),
        "{err}"
    );
}

#[test]
fn rows_it_cannot_read_are_left_out_one_warning_each_up_to_twenty() {
    let scratch = Scratch::new("original-bad-rows");
    let (clean, _) = compare(
        scratch.path(),
        "op",
        &data("baseline.csv"),
        &data("leaks.csv"),
    );
    let mut text = std::fs::read_to_string(data("leaks.csv")).unwrap();
    for n in 0..25 {
        text.push_str(&format!(
            "x{n},MALLOC,PTA,N/A,1764753366322637860,3290097,3290097,0,0x10,\"{{size:8}}\",,\n"
        ));
    }
    let bad = scratch.path().join("leaks_bad.csv");
    std::fs::write(&bad, text).unwrap();
    let (rows, err) = compare(scratch.path(), "op", &data("baseline.csv"), &bad);
    assert_eq!(rows, clean, "the rows it can read give the same answer");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 21, "{err}");
    assert_eq!(
        warnings[0],
        format!(
            "msmemscope: warning: {}:132: row left out: ID \"x0\" is not an integer",
            bad.display()
        )
    );
    assert_eq!(
        warnings[20],
        format!(
            "msmemscope: warning: {}: 5 more rows left out (not told one by one)",
            bad.display()
        )
    );
}

#[test]
fn a_header_without_a_column_the_analyses_read_is_named() {
    let scratch = Scratch::new("original-header");
    let text = std::fs::read_to_string(data("leaks.csv")).unwrap();
    let text = text.replacen(",Ptr,", ",Pointer,", 1);
    let bad = scratch.path().join("no_ptr.csv");
    std::fs::write(&bad, text).unwrap();
    let out = cli(
        scratch.path(),
        &[
            "--compare",
            &format!(
                "--input-path={},{}",
                data("baseline.csv").display(),
                bad.display()
            ),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).lines().last().unwrap(),
        format!(
            "msmemscope: {}: not a memscope dump: the header has no column \"Ptr\" (a dump's \
             header is ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,\
             Ptr,Attr,Call Stack(Python),Call Stack(C))",
            bad.display()
        )
    );
}

#[test]
fn report_and_parquet_export_read_an_original_run_directory() {
    let scratch = Scratch::new("original-report");
    // The original's layout: {output}/msmemscope_{pid}_{ts}_ascend/device_{id}/dump/.
    let run = scratch
        .path()
        .join("msmemscope_3290097_20251203164900_ascend");
    let dump_dir = run.join("device_0/dump");
    std::fs::create_dir_all(&dump_dir).unwrap();
    let dump = dump_dir.join("memscope_dump_20251203164900.csv");
    std::fs::copy(data("leaks.csv"), &dump).unwrap();

    let out = cli(scratch.path(), &["report", run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(run.join("msmemscope_report.html")).unwrap();
    // The two copies of 4,000,256 bytes are live at the end of the run.
    assert_eq!(
        page.matches(r#"[4000256,"aten::_to_copy","PTA","#).count(),
        2,
        "the page lists the two blocks"
    );
    assert!(page.contains(r#""live_at_end":{"count":10,"bytes":33887924}"#));

    let out = cli(
        scratch.path(),
        &[
            "export",
            "--format",
            "parquet",
            scratch.path().to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parquet = dump.with_extension("parquet");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", parquet.display())
    );
    assert!(
        stderr(&out).contains(&format!("note: {}: read as a dump", dump.display())),
        "the note names the user's file: {}",
        stderr(&out)
    );
    let rows: Vec<EventRow> = reader::open(&parquet)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 130);
    let ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        (1..=130).collect::<Vec<u64>>(),
        "its own IDs, in time order"
    );
    let big: Vec<u64> = rows
        .iter()
        .filter(|r| r.event == Event::Malloc && r.attr_u64("size") == Some(4_000_256))
        .filter_map(|r| r.ptr)
        .collect();
    assert_eq!(big, [0x12c041400000, 0x12c0417d0a00]);
    let freed_after = |ptr: u64, id: u64| {
        rows.iter()
            .any(|r| r.event == Event::Free && r.ptr == Some(ptr) && r.id > id)
    };
    let unfreed = rows
        .iter()
        .filter(|r| r.event == Event::Malloc && r.attr_u64("size") == Some(4_000_256))
        .filter(|r| !freed_after(r.ptr.unwrap(), r.id))
        .count();
    assert_eq!(unfreed, 2);
    assert_eq!(
        rows.iter().filter(|r| r.name == "aten::addmm").count(),
        4,
        "op names in our spelling"
    );
}
