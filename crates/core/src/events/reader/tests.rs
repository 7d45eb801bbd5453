use super::*;
use crate::events::attrs::{decimal, hexadecimal, numeric_attr_index};
use crate::events::csv::{write_row, HEADER};
use crate::events::fields::parse_fields_into;
use crate::events::{DeviceId, Event, EventType};

fn temp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("msmemscope-reader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn numbers_known_from_the_check_answer_only_for_their_text() {
    let fields = |attrs: &'static str| {
        [
            "7", "MALLOC", "PTA", "N/A", "5", "1", "1", "cpu", "0x10", attrs, "", "",
        ]
        .into_iter()
    };
    let mut row = EventRow::new(Event::Free, EventType::Pta, "");
    parse_fields_into(&mut row, fields(r#"{"size":5,"used":70}"#), &mut Vec::new()).unwrap();
    assert_eq!(row.attr_u64("size"), Some(5));
    assert_eq!(row.attr_u64("used"), Some(70));
    assert_eq!(row.attr_u64("total"), None);
    // The row's memory is reused for the next: same length, other values.
    parse_fields_into(&mut row, fields(r#"{"size":6,"used":71}"#), &mut Vec::new()).unwrap();
    assert_eq!(
        (row.attr_u64("size"), row.attr_u64("used")),
        (Some(6), Some(71))
    );
    // Escapes are the full check's: nothing known, the text is read.
    let escaped = r#"{"size":8,"owner":"a\"b"}"#;
    parse_fields_into(&mut row, fields(escaped), &mut Vec::new()).unwrap();
    assert_eq!(row.attr_u64("size"), Some(8));
    // A text put in place of the one read is read, not answered from what was known.
    row.attrs_json = Some(r#"{"size":9,"used":72}"#.into());
    assert_eq!(row.attr_u64("size"), Some(9));
}

#[test]
fn numeric_attr_indices_follow_the_list() {
    for (i, key) in NUMERIC_ATTRS.iter().enumerate() {
        assert_eq!(numeric_attr_index(key), Some(i));
    }
    assert_eq!(numeric_attr_index("owner"), None);
}

#[test]
fn numbers_read_as_the_standard_parsers_read_them() {
    for text in [
        "",
        "0",
        "+7",
        "-1",
        "++1",
        "12a",
        "18446744073709551615",
        "18446744073709551616",
        "00042",
        " 1",
        "+",
        "1700000000000000137",
        "9999999999999999999",
        "99999999999999999999",
        "+9999999999999999999",
        "000000000000000000000000001",
        "999999999999999999a",
    ] {
        assert_eq!(decimal(text), text.parse::<u64>().ok(), "{text:?}");
    }
    for text in [
        "",
        "0",
        "ff",
        "FF",
        "+1",
        "-1",
        "g",
        "ffffffffffffffff",
        "10000000000000000",
        "000000000000000001",
    ] {
        let standard = (!text.starts_with(['+', '-']))
            .then(|| u64::from_str_radix(text, 16).ok())
            .flatten();
        assert_eq!(hexadecimal(text), standard, "{text:?}");
    }
}

proptest::proptest! {
    #[test]
    fn any_numbers_read_as_the_standard_parsers_read_them(
        text in "[+0-9a-fA-F:/ ]{0,24}",
        n in proptest::prelude::any::<u64>(),
        width in 0usize..24,
    ) {
        proptest::prop_assert_eq!(decimal(&text), text.parse::<u64>().ok(), "{:?}", text);
        let written = format!("{n:0width$}");
        proptest::prop_assert_eq!(decimal(&written), Some(n));
        let hex_standard = (!text.starts_with(['+', '-']))
            .then(|| u64::from_str_radix(&text, 16).ok())
            .flatten();
        proptest::prop_assert_eq!(hexadecimal(&text), hex_standard, "{:?}", text);
        proptest::prop_assert_eq!(hexadecimal(&format!("{n:0width$x}")), Some(n));
        proptest::prop_assert_eq!(hexadecimal(&format!("{n:016X}")), Some(n));
    }

    /// Sixteen digits, a Ptr's width, are read a word at a time: mostly hex digits, some
    /// bytes next to the digit and letter ranges, and non-ASCII.
    #[test]
    fn sixteen_hex_digits_read_as_the_standard_parser_reads_them(
        text in "([0-9a-fA-F]{1,4}|[/:@G`g\x7f é+]){1,16}",
    ) {
        let sixteen: String = text.chars().take(16).collect();
        let standard = (!sixteen.starts_with(['+', '-']))
            .then(|| u64::from_str_radix(&sixteen, 16).ok())
            .flatten();
        proptest::prop_assert_eq!(hexadecimal(&sixteen), standard, "{:?}", sixteen);
    }
}

#[test]
fn round_trips_written_rows() {
    let mut a = EventRow::new(Event::Malloc, EventType::Pta, "");
    a.id = 1;
    a.ts_ns = 5;
    a.device = DeviceId::Cpu;
    a.ptr = Some(0x1000);
    a.attrs.insert("size".into(), 64.into());
    a.python_stack = "a.py(1): f\nb.py(2): \"g\"".into();
    let mut b = EventRow::new(Event::OpLaunch, EventType::AtenStart, "aten::add.Tensor");
    b.id = 2;
    let mut text = format!("{HEADER}\n");
    write_row(&mut text, &a);
    write_row(&mut text, &b);
    let mut rows: Vec<EventRow> = open(&temp("ok.csv", &text))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    rows[0].parse_attrs();
    assert_eq!(rows, vec![a, b]);
}

#[test]
fn errors_name_file_and_line() {
    let missing = open(Path::new("/nonexistent/x.csv"))
        .err()
        .unwrap()
        .to_string();
    assert_eq!(missing, "/nonexistent/x.csv: no such file");
    let path = temp("bad.csv", &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n2,BOGUS,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n"));
    let results: Vec<_> = open(&path).unwrap().collect();
    assert!(results[0].is_ok());
    let err = results[1].as_ref().unwrap_err().to_string();
    assert!(
        err.ends_with("bad.csv:3: malformed row: unknown Event \"BOGUS\""),
        "{err}"
    );
    let path = temp("nohdr.csv", "a,b\n");
    assert!(open(&path)
        .err()
        .unwrap()
        .to_string()
        .contains("not a memscope dump"));
}

/// Removes the test's large files, which would otherwise pile up in the temporary directory.
fn remove(paths: &[&Path]) {
    for path in paths {
        let _ = std::fs::remove_file(path);
    }
}

/// The first error of a dump, as its message.
fn first_error(path: &Path) -> String {
    match open(path) {
        Err(e) => e.to_string(),
        Ok(rows) => rows
            .filter_map(Result::err)
            .next()
            .map(|e| e.to_string())
            .unwrap_or_default(),
    }
}

const MALLOC: &str = "2,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{\"\"size\"\":64}\",,";

#[test]
fn a_line_without_end_is_refused_at_the_cap() {
    let path = temp(
        "sparse.csv",
        &format!("{HEADER}\n1,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n"),
    );
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(3 << 30).unwrap();
    drop(file);
    let err = first_error(&path);
    assert_eq!(
        err,
        format!(
            "{}:3: row 2 is longer than 16777216 bytes: not a memscope dump",
            path.display()
        )
    );
    remove(&[&path]);
    // A header that long is no header.
    let path = temp("sparse_header.csv", "");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    assert_eq!(
        first_error(&path),
        format!(
            "{}: not a memscope dump: its first line is longer than 16777216 bytes",
            path.display()
        )
    );
    remove(&[&path]);
    // A quoted field that never closes is capped the same way, across lines.
    let mut text = format!("{HEADER}\n1,MSTX,Mark,\"a");
    text.push_str(&"\n".repeat(MAX_ROW_BYTES));
    let path = temp("open_quote.csv", &text);
    assert!(
        first_error(&path)
            .ends_with(":2: row 1 is longer than 16777216 bytes: not a memscope dump"),
        "{}",
        first_error(&path)
    );
    remove(&[&path]);
    // A row of exactly the cap, its line end included, is read; one byte more is not.
    let stack = MAX_ROW_BYTES - MALLOC.len() - 1;
    let long = format!("{MALLOC}{}\n", "x".repeat(stack));
    let path = temp("at_cap.csv", &format!("{HEADER}\n{long}"));
    let row = open(&path).unwrap().next().unwrap().unwrap();
    assert_eq!(row.c_stack.len(), stack);
    remove(&[&path]);
    let long = format!("{MALLOC}{}\n", "x".repeat(stack + 1));
    let path = temp("over_cap.csv", &format!("{HEADER}\n{long}"));
    assert!(first_error(&path)
        .ends_with(":2: row 1 is longer than 16777216 bytes: not a memscope dump"));
    remove(&[&path]);
}

#[test]
fn non_regular_files_are_refused() {
    let dir = temp("x", "").parent().unwrap().to_path_buf();
    let fifo = dir.join("fifo.csv");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for name in ["fifo.csv", "fifo.db"] {
        let path = dir.join(name);
        if name.ends_with(".db") {
            let _ = std::fs::remove_file(&path);
            std::os::unix::fs::symlink(&fifo, &path).unwrap();
        }
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: a FIFO, not a regular file",
                path.display()
            )
        );
    }
    let zero = dir.join("zero.csv");
    let _ = std::fs::remove_file(&zero);
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    assert_eq!(
        first_error(&zero),
        format!(
            "{}: not a memscope dump: a character device, not a regular file",
            zero.display()
        )
    );
    assert_eq!(
        first_error(&dir),
        format!(
            "{}: not a memscope dump: a directory, not a regular file",
            dir.display()
        )
    );
}

#[test]
fn values_that_do_not_fit_are_refused() {
    let cases = [
        (
            r#"{""size"":18446744073709551616}"#,
            r#"Attr "size" is not an integer from 0 to 18446744073709551615: "18446744073709551616""#,
        ),
        (
            r#"{""size"":-1}"#,
            r#"Attr "size" is not an integer from 0 to 18446744073709551615: "-1""#,
        ),
        (
            r#"{""used"":1.5}"#,
            r#"Attr "used" is not an integer from 0 to 18446744073709551615: "1.5""#,
        ),
        (
            r#"{""total"":""7""}"#,
            r#"Attr "total" is not an integer from 0 to 18446744073709551615: "\"7\"""#,
        ),
        (
            r#"{""size"":1,""size"":2}"#,
            r#"Attr "size" is given twice"#,
        ),
        (
            r#"{""si\u007ae"":1}"#,
            r#"Attr "size" is written with escapes"#,
        ),
        (
            r#"{""size"":1"#,
            r#"Attr is not a JSON object (EOF while parsing an object at line 1 column 9): "{\"size\":1""#,
        ),
        (
            r#"{""size"":1}x"#,
            r#"Attr is not a JSON object (trailing characters at line 1 column 11): "{\"size\":1}x""#,
        ),
    ];
    for (attr, reason) in cases {
        let path = temp(
            "overflow.csv",
            &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{attr}\",,\n"),
        );
        assert_eq!(
            first_error(&path),
            format!("{}:2: malformed row: {reason}", path.display())
        );
    }
    // The largest value, and keys that are not counted, are fine.
    let path = temp("max.csv", &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{{\"\"size\"\":18446744073709551615,\"\"owner\"\":-1.5}}\",,\n"));
    let row = open(&path).unwrap().next().unwrap().unwrap();
    assert_eq!(row.attr_u64("size"), Some(u64::MAX));
    for (ptr, reason) in [
        ("0x", "bad Ptr \"0x\""),
        ("0x+1", "bad Ptr \"0x+1\""),
        ("0x10000000000000000", "bad Ptr \"0x10000000000000000\""),
    ] {
        let path = temp(
            "ptr.csv",
            &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,{ptr},{{}},,\n"),
        );
        assert_eq!(
            first_error(&path),
            format!("{}:2: malformed row: {reason}", path.display())
        );
    }
}

#[test]
fn ids_must_ascend() {
    let row = |id: u64| format!("{id},MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n");
    let path = temp(
        "dup.csv",
        &format!("{HEADER}\n{}{}{}", row(1), row(2), row(2)),
    );
    assert_eq!(
        first_error(&path),
        format!(
            "{}:4: malformed row: ID 2 repeats the previous row's ID",
            path.display()
        )
    );
    let path = temp(
        "order.csv",
        &format!("{HEADER}\n{}{}{}", row(1), row(3), row(2)),
    );
    assert_eq!(
        first_error(&path),
        format!(
            "{}:4: malformed row: ID 2 comes after ID 3: rows must be in ascending ID order",
            path.display()
        )
    );
    // The iterator stops at its first error.
    let path = temp(
        "stop.csv",
        &format!("{HEADER}\n{}{}{}", row(2), row(1), row(3)),
    );
    assert_eq!(open(&path).unwrap().count(), 2);
}

fn db(name: &str, schema: &str, rows: &[&[rusqlite::types::Value]]) -> PathBuf {
    let path = temp(name, "");
    std::fs::remove_file(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(schema).unwrap();
    for row in rows {
        let marks = vec!["?"; row.len()].join(",");
        conn.execute(
            &format!("INSERT INTO memscope_dump VALUES ({marks})"),
            rusqlite::params_from_iter(row.iter()),
        )
        .unwrap();
    }
    path
}

fn db_row(id: i64, attr: &str, stack: rusqlite::types::Value) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    let t = |s: &str| Value::Text(s.into());
    vec![
        Value::Integer(id),
        t("MALLOC"),
        t("PTA"),
        t("N/A"),
        Value::Integer(5),
        Value::Integer(1),
        Value::Integer(1),
        t("cpu"),
        t("0x10"),
        t(attr),
        stack,
        t(""),
    ]
}

const LOOSE: &str = "CREATE TABLE memscope_dump (\"ID\", \"Event\", \"Event Type\", \"Name\", \"Timestamp(ns)\", \"Process Id\", \"Thread Id\", \"Device Id\", \"Ptr\", \"Attr\", \"Call Stack(Python)\", \"Call Stack(C)\")";

#[test]
fn sqlite_dumps_are_checked_like_csv() {
    use rusqlite::types::Value;
    let path = db(
        "schema.db",
        "CREATE TABLE memscope_dump (\"ID\" INTEGER, \"Event\" TEXT)",
        &[],
    );
    assert_eq!(
        first_error(&path),
        format!(
            "{}: not a memscope dump: table memscope_dump lacks column \"Event Type\"",
            path.display()
        )
    );
    let path = db("none.db", "CREATE TABLE other (a)", &[]);
    assert_eq!(
        first_error(&path),
        format!(
            "{}: not a memscope dump: no table memscope_dump",
            path.display()
        )
    );
    let path = temp("text.db", &format!("{HEADER}\n"));
    assert_eq!(
        first_error(&path),
        format!(
            "{}: not a memscope dump: not an SQLite database",
            path.display()
        )
    );

    let big = "{\"size\":18446744073709551616}";
    let path = db(
        "overflow.db",
        crate::events::sqlite::write::CREATE_TABLE,
        &[&db_row(1, big, Value::Null)],
    );
    assert_eq!(
        first_error(&path),
        format!("{}:1: malformed row: Attr \"size\" is not an integer from 0 to 18446744073709551615: \"18446744073709551616\"", path.display())
    );
    let path = db(
        "utf8.db",
        LOOSE,
        &[
            &db_row(1, "{}", Value::Null),
            &db_row(2, "{}", Value::Text(String::new())),
        ],
    );
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE memscope_dump SET \"Name\" = CAST(x'ff00' AS TEXT) WHERE \"ID\" = 2",
            [],
        )
        .unwrap();
    }
    assert_eq!(
        first_error(&path),
        format!("{}:2: malformed row: Name is not UTF-8", path.display())
    );
    let path = db(
        "blob.db",
        LOOSE,
        &[&db_row(7, "{}", Value::Blob(vec![1, 2]))],
    );
    assert_eq!(
        first_error(&path),
        format!(
            "{}:7: malformed row: Call Stack(Python) is a BLOB, not text",
            path.display()
        )
    );

    // A value over the cap is refused by SQLite before it is loaded.
    let huge = Value::Text("x".repeat(MAX_ROW_BYTES + 1));
    let path = db(
        "long.db",
        crate::events::sqlite::write::CREATE_TABLE,
        &[&db_row(1, "{}", Value::Null), &db_row(2, "{}", huge)],
    );
    assert_eq!(
        first_error(&path),
        format!(
            "{}: row 2 is longer than 16777216 bytes: not a memscope dump",
            path.display()
        )
    );
    remove(&[&path]);
    // So is a row whose values add up past it.
    let half = || Value::Text("x".repeat(MAX_ROW_BYTES / 2 + 1));
    let mut row = db_row(1, "{}", half());
    row[11] = half();
    let path = db(
        "sum.db",
        crate::events::sqlite::write::CREATE_TABLE,
        &[&row],
    );
    assert_eq!(
        first_error(&path),
        format!(
            "{}: row 1 is longer than 16777216 bytes: not a memscope dump",
            path.display()
        )
    );
    remove(&[&path]);
}

#[test]
fn sqlite_repeats_are_found_across_pages() {
    use rusqlite::types::Value;
    // Two 5 MiB rows end a page (PAGE_BYTES); the repeat of the second starts the next.
    let stack = || Value::Text("x".repeat(5 << 20));
    let rows = [
        db_row(1, "{}", stack()),
        db_row(2, "{}", stack()),
        db_row(2, "{}", Value::Null),
        db_row(3, "{}", Value::Null),
    ];
    let refs: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
    let path = db("repeat.db", LOOSE, &refs);
    assert_eq!(
        first_error(&path),
        format!(
            "{}:2: malformed row: ID 2 repeats the previous row's ID",
            path.display()
        )
    );
    remove(&[&path]);
    // Without the repeat every row is read once, in ID order.
    let rows = [
        db_row(3, "{}", stack()),
        db_row(1, "{}", stack()),
        db_row(2, "{}", stack()),
        db_row(4, "{}", Value::Null),
    ];
    let refs: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
    let path = db("pages.db", LOOSE, &refs);
    let ids: Vec<u64> = open(&path).unwrap().map(|r| r.unwrap().id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    remove(&[&path]);
}
