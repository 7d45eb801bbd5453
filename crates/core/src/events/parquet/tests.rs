use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

use super::export::{export, parquet_name, ExportError, Source};
use super::writer::{ParquetWriter, WriteError};
use super::*;
use crate::events::csv::{write_row, HEADER};
use crate::events::reader;
use crate::run_dir::RunDir;

/// A test's own directory, removed with it.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir =
        std::env::temp_dir().join(format!("msmemscope-parquet-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Rows with every shape of value the dump has.
fn sample() -> Vec<EventRow> {
    let mut rows = Vec::new();
    let mut malloc = EventRow::new(Event::Malloc, EventType::Pta, "");
    malloc.ts_ns = 1_700_000_000_000_000_000;
    malloc.pid = 42;
    malloc.tid = 43;
    malloc.device = DeviceId::Cpu;
    malloc.ptr = Some(0xabc);
    malloc.attrs_json =
        Some(r#"{"allocation_id":7,"addr":"0xabc","size":4096,"used":4096,"total":8192,"owner":"PTA@weight"}"#.into());
    malloc.python_stack = "a.py(1): f\nb.py(2): g".into();
    malloc.c_stack = "malloc (libc.so.6+0x10)\n\"quoted\", frame".into();
    rows.push(malloc);
    let mut free = EventRow::new(Event::Free, EventType::Hal, "");
    free.device = DeviceId::Cuda(3);
    free.ptr = Some(u64::MAX);
    free.attrs.insert("size".into(), 64.into());
    rows.push(free);
    let mut mark = EventRow::new(Event::Mstx, EventType::Mark, "step, \"one\"");
    mark.attrs_json = Some(r#"{"owner":"a\"b","note":{"size":"nested"}}"#.into());
    rows.push(mark);
    rows.push(EventRow::new(Event::System, EventType::Step, "1"));
    for (i, row) in rows.iter_mut().enumerate() {
        row.id = i as u64 + 1;
    }
    rows
}

fn write_parquet(path: &Path, rows: &[EventRow]) -> Result<u64, WriteError> {
    let mut out = ParquetWriter::new(std::fs::File::create(path).unwrap())?;
    for row in rows {
        out.push(row)?;
    }
    out.finish().map(|(_, n)| n)
}

/// What the CSV reader gives for `rows`: the form every reader must agree on.
fn through_csv(dir: &Path, rows: &[EventRow]) -> Vec<EventRow> {
    let mut text = format!("{HEADER}\n");
    for row in rows {
        write_row(&mut text, row);
    }
    let path = dir.join("memscope_dump_1.csv");
    std::fs::write(&path, text).unwrap();
    reader::open(&path).unwrap().map(Result::unwrap).collect()
}

#[test]
fn rows_read_back_as_the_csv_reader_gives_them() {
    let dir = scratch("roundtrip");
    let path = dir.join("memscope_dump_1.parquet");
    assert_eq!(write_parquet(&path, &sample()).unwrap(), 4);
    let back: Vec<EventRow> = reader::open(&path).unwrap().map(Result::unwrap).collect();
    assert_eq!(back, through_csv(&dir, &sample()));
}

#[test]
fn schema_and_typed_columns() {
    let dir = scratch("schema");
    let path = dir.join("d.parquet");
    write_parquet(&path, &sample()).unwrap();
    let file = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let schema = file.metadata().file_metadata().schema_descr_ptr();
    let described: Vec<String> = schema
        .columns()
        .iter()
        .map(|c| {
            format!(
                "{} {} {:?} {:?}",
                c.name(),
                c.physical_type(),
                c.self_type().get_basic_info().repetition(),
                c.converted_type()
            )
        })
        .collect();
    assert_eq!(
        described,
        [
            "ID INT64 REQUIRED NONE",
            "Event BYTE_ARRAY REQUIRED UTF8",
            "Event Type BYTE_ARRAY REQUIRED UTF8",
            "Name BYTE_ARRAY REQUIRED UTF8",
            "Timestamp(ns) INT64 REQUIRED NONE",
            "Process Id INT64 REQUIRED NONE",
            "Thread Id INT64 REQUIRED NONE",
            "Device Id BYTE_ARRAY REQUIRED UTF8",
            "Ptr BYTE_ARRAY REQUIRED UTF8",
            "Attr BYTE_ARRAY REQUIRED UTF8",
            "Call Stack(Python) BYTE_ARRAY REQUIRED UTF8",
            "Call Stack(C) BYTE_ARRAY REQUIRED UTF8",
            "size INT64 OPTIONAL NONE",
            "allocation_id INT64 OPTIONAL NONE",
            "owner BYTE_ARRAY OPTIONAL UTF8",
            "used INT64 OPTIONAL NONE",
            "total INT64 OPTIONAL NONE",
        ]
    );
    let render = |f: &Field| match f {
        Field::Null => "null".to_string(),
        Field::Long(v) => v.to_string(),
        Field::Str(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let rows: Vec<Vec<String>> = file
        .get_row_iter(None)
        .unwrap()
        .map(|r| {
            r.unwrap()
                .get_column_iter()
                .map(|(_, f)| render(f))
                .collect()
        })
        .collect();
    // The CSV's texts, then the typed values.
    assert_eq!(rows[0][..4], ["1", "MALLOC", "PTA", "N/A"]);
    assert_eq!(
        rows[0][4..9],
        [
            "1700000000000000000",
            "42",
            "43",
            "cpu",
            "0x0000000000000abc"
        ]
    );
    assert_eq!(rows[0][12..], ["4096", "7", "PTA@weight", "4096", "8192"]);
    assert_eq!(rows[1][7..10], ["3", "0xffffffffffffffff", "{\"size\":64}"]);
    assert_eq!(rows[1][12..], ["64", "null", "null", "null", "null"]);
    // An escaped owner is unescaped; a nested "size" is not the row's.
    assert_eq!(rows[2][3], "step, \"one\"");
    assert_eq!(rows[2][12..], ["null", "null", "a\"b", "null", "null"]);
    assert_eq!(rows[3][8..12], ["N/A", "{}", "", ""]);
}

#[test]
fn values_above_i64_are_refused_naming_the_row() {
    let dir = scratch("large");
    let mut rows = sample();
    rows[1]
        .attrs
        .insert("size".into(), (i64::MAX as u64 + 1).into());
    let e = write_parquet(&dir.join("a.parquet"), &rows).unwrap_err();
    assert_eq!(
        e.to_string(),
        "row ID 2: malformed row: Attr \"size\" is 9223372036854775808, above 9223372036854775807: the Parquet dump's integer columns are signed INT64"
    );
    let mut rows = sample();
    rows[3].tid = u64::MAX;
    let e = write_parquet(&dir.join("b.parquet"), &rows).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("row ID 4: malformed row: Thread Id is 18446744073709551615"),
        "{e}"
    );
    // i64::MAX itself fits.
    let mut rows = sample();
    rows[0].ts_ns = i64::MAX as u64;
    write_parquet(&dir.join("c.parquet"), &rows).unwrap();
}

#[test]
fn row_groups_split_by_rows_and_bytes() {
    let dir = scratch("groups");
    let path = dir.join("d.parquet");
    let mut out = ParquetWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let stack = "x".repeat(1 << 20);
    let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
    row.attrs_json = Some(r#"{"size":1}"#.into());
    // 100 rows of a 1 MiB stack among 200: a group closes at 64 MiB of text.
    for id in 1..=200 {
        row.id = id;
        row.c_stack = if id % 2 == 0 {
            stack.clone()
        } else {
            String::new()
        };
        out.push(&row).unwrap();
    }
    out.finish().unwrap();
    let file = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    assert!(
        file.metadata().num_row_groups() >= 2,
        "{}",
        file.metadata().num_row_groups()
    );
    let ids: Vec<u64> = reader::open(&path)
        .unwrap()
        .map(|r| r.unwrap().id)
        .collect();
    assert_eq!(ids, (1..=200).collect::<Vec<_>>());
}

fn first_error(path: &Path) -> String {
    match reader::open(path) {
        Err(e) => e.to_string(),
        Ok(rows) => rows
            .filter_map(Result::err)
            .next()
            .map(|e| e.to_string())
            .unwrap_or_default(),
    }
}

#[test]
fn what_is_not_a_dump_is_refused() {
    let dir = scratch("refused");
    let path = dir.join("text.parquet");
    std::fs::write(&path, "ID,Event\n").unwrap();
    assert!(
        first_error(&path).starts_with(&format!(
            "{}: not a memscope dump: not a Parquet file (",
            path.display()
        )),
        "{}",
        first_error(&path)
    );
    // A Parquet file of another schema.
    let other = dir.join("other.parquet");
    let schema = parquet::schema::parser::parse_message_type(
        "message m { required int64 ID; required int64 Event; }",
    )
    .unwrap();
    let props = std::sync::Arc::new(parquet::file::properties::WriterProperties::builder().build());
    let w = parquet::file::writer::SerializedFileWriter::new(
        std::fs::File::create(&other).unwrap(),
        std::sync::Arc::new(schema),
        props,
    )
    .unwrap();
    w.close().unwrap();
    assert!(first_error(&other).contains("not a memscope dump: 2 columns, expected the 12 of the CSV dump or all 17: ID, Event, Event Type"), "{}", first_error(&other));
    // IDs out of order, and a bad Attr, as in the other formats.
    let mut rows = sample();
    rows.swap(1, 2);
    let path = dir.join("order.parquet");
    write_parquet(&path, &rows).unwrap();
    assert_eq!(
        first_error(&path),
        format!(
            "{}:2: malformed row: ID 2 comes after ID 3: rows must be in ascending ID order",
            path.display()
        )
    );
    let mut rows = sample();
    rows[1].attrs_json = Some(r#"{"size":-1}"#.into());
    let path = dir.join("attr.parquet");
    write_parquet(&path, &rows).unwrap();
    assert_eq!(
        first_error(&path),
        format!("{}:2: malformed row: Attr \"size\" is not an integer from 0 to 18446744073709551615: \"-1\"", path.display())
    );
    // A FIFO is refused without opening it.
    let fifo = dir.join("fifo.parquet");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_eq!(
        first_error(&fifo),
        format!(
            "{}: not a memscope dump: a FIFO, not a regular file",
            fifo.display()
        )
    );
    // A file cut short.
    let path = dir.join("memscope_dump_1.parquet");
    write_parquet(&path, &sample()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    assert!(
        first_error(&cut).contains("not a memscope dump: not a Parquet file"),
        "{}",
        first_error(&cut)
    );
}

#[test]
fn typed_columns_must_match_attr() {
    let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
    row.attrs_json = Some(r#"{"size":5,"owner":"PTA"}"#.into());
    let int = |size: Option<i64>| move |i: usize| if i == 12 { size } else { None };
    assert_eq!(check_typed(&row, int(Some(5)), Some("PTA")), Ok(()));
    assert_eq!(
        check_typed(&row, int(Some(6)), Some("PTA")),
        Err("column size is 6 but Attr says 5".into())
    );
    assert_eq!(
        check_typed(&row, int(None), Some("PTA")),
        Err("column size is null but Attr says 5".into())
    );
    assert_eq!(
        check_typed(&row, int(Some(5)), None),
        Err("column owner is null but Attr says \"PTA\"".into())
    );
}

fn held(dir: &Path) -> RunDir {
    RunDir::open(dir).unwrap()
}

#[test]
fn export_writes_beside_and_never_over() {
    let dir = scratch("export");
    let rows = through_csv(&dir, &sample());
    let out = export(&held(&dir), "memscope_dump_1.csv", Source::Dump, true).unwrap();
    assert_eq!(out.path, dir.join("memscope_dump_1.parquet"));
    assert_eq!((out.rows, out.cut_row_left_out), (4, false));
    let back: Vec<EventRow> = reader::open(&out.path)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(back, rows);
    assert!(dir.join("memscope_dump_1.csv").is_file(), "a dump is kept");
    let e = export(&held(&dir), "memscope_dump_1.csv", Source::Dump, true).unwrap_err();
    assert!(matches!(e, ExportError::Exists { .. }));
    assert_eq!(
        e.to_string(),
        format!("{} exists: left alone", out.path.display())
    );
    // A symlink in the way is an entry too, and never followed.
    std::fs::copy(
        dir.join("memscope_dump_1.csv"),
        dir.join("memscope_dump_2.csv"),
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("memscope_dump_2.parquet")).unwrap();
    assert!(matches!(
        export(&held(&dir), "memscope_dump_2.csv", Source::Dump, true),
        Err(ExportError::Exists { .. })
    ));
    assert!(!dir.join("elsewhere").exists());
    assert_eq!(
        parquet_name("memscope_dump_3.db").as_deref(),
        Some("memscope_dump_3.parquet")
    );
    assert_eq!(parquet_name("notes.csv"), None);
}

#[test]
fn a_bad_row_leaves_no_file() {
    let dir = scratch("badrow");
    let text = format!(
        "{HEADER}\n1,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n2,BOGUS,Mark,a,5,1,1,N/A,N/A,{{}},,\n"
    );
    std::fs::write(dir.join("memscope_dump_1.csv"), text).unwrap();
    let e = export(&held(&dir), "memscope_dump_1.csv", Source::Dump, true).unwrap_err();
    assert!(e.is_input());
    assert_eq!(
        e.to_string(),
        format!(
            "{}:3: malformed row: unknown Event \"BOGUS\"",
            dir.join("memscope_dump_1.csv").display()
        )
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["memscope_dump_1.csv"]);
    // So does a value Parquet cannot hold.
    let text = format!("{HEADER}\n9223372036854775808,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n");
    std::fs::write(dir.join("memscope_dump_2.csv"), text).unwrap();
    let e = export(&held(&dir), "memscope_dump_2.csv", Source::Dump, true).unwrap_err();
    assert!(e.is_input());
    assert!(e.to_string().ends_with("memscope_dump_2.csv: row ID 9223372036854775808: malformed row: ID is 9223372036854775808, above 9223372036854775807: the Parquet dump's integer columns are signed INT64"), "{e}");
    assert!(!dir.join("memscope_dump_2.parquet").exists());
}

#[test]
fn a_journal_cut_by_a_kill_keeps_its_whole_rows() {
    let dir = scratch("journal");
    let mut text = format!("{HEADER}\n");
    for row in sample() {
        write_row(&mut text, &row);
    }
    let whole = text.len();
    // Cut inside the next row's multi-line stack, after one of its line ends.
    let mut next = sample()[0].clone();
    next.id = 5;
    let mut extra = String::new();
    write_row(&mut extra, &next);
    let cut_at = extra.find('\n').unwrap() + 4;
    text.push_str(&extra[..cut_at]);
    std::fs::write(dir.join("memscope_dump_1.csv"), &text).unwrap();
    let out = export(&held(&dir), "memscope_dump_1.csv", Source::Journal, false).unwrap();
    assert_eq!((out.rows, out.cut_row_left_out), (4, true));
    assert!(
        !dir.join("memscope_dump_1.csv").exists(),
        "the journal is removed"
    );
    let ids: Vec<u64> = reader::open(&out.path)
        .unwrap()
        .map(|r| r.unwrap().id)
        .collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    // Cut right after a line end inside the quoted stack.
    text.truncate(whole + extra.find('\n').unwrap() + 1);
    std::fs::write(dir.join("memscope_dump_2.csv"), &text).unwrap();
    let out = export(&held(&dir), "memscope_dump_2.csv", Source::Journal, false).unwrap();
    assert_eq!((out.rows, out.cut_row_left_out), (4, true));
    // A whole journal loses nothing.
    text.truncate(whole);
    std::fs::write(dir.join("memscope_dump_3.csv"), &text).unwrap();
    let out = export(&held(&dir), "memscope_dump_3.csv", Source::Journal, false).unwrap();
    assert_eq!((out.rows, out.cut_row_left_out), (4, false));
    // A dump's last row cut the same way (a killed run) is left out too, and the dump is kept.
    text.push_str("6,MSTX,Ma");
    std::fs::write(dir.join("memscope_dump_4.csv"), &text).unwrap();
    let out = export(&held(&dir), "memscope_dump_4.csv", Source::Dump, true).unwrap();
    assert_eq!((out.rows, out.cut_row_left_out), (4, true));
    assert_eq!(
        std::fs::read_to_string(dir.join("memscope_dump_4.csv")).unwrap(),
        text,
        "the dump is never rewritten"
    );
}
