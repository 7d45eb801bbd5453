//! Property tests of the dump readers, a bounded number of cases in the normal test run: any
//! CSV bytes, any Attr JSON and any SQLite file are read to the end without a panic, every
//! error is one line, no row handed out is longer than the cap, and what a valid dump holds
//! comes back exactly (the Attr numbers that the analyses read included).

use msmemscope_core::events::csv::HEADER;
use msmemscope_core::events::reader::{MAX_ROW_BYTES, NUMERIC_ATTRS};
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};
use proptest::prelude::*;

use crate::util::{config, csv_of, read_all, scratch};

// --- valid rows ---------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    // The characters that matter to CSV, and any others.
    prop_oneof![
        proptest::collection::vec(
            prop_oneof![
                Just(','),
                Just('"'),
                Just('\n'),
                Just('\r'),
                Just(' '),
                Just('x'),
                any::<char>()
            ],
            0..12
        )
        .prop_map(|c| c.into_iter().collect()),
        any::<String>(),
    ]
}

fn device() -> impl Strategy<Value = DeviceId> {
    prop_oneof![
        Just(DeviceId::None),
        Just(DeviceId::Cpu),
        any::<u32>().prop_map(DeviceId::Cuda)
    ]
}

/// A row as the writer makes it, with `id`.
fn row() -> impl Strategy<Value = EventRow> {
    (
        proptest::sample::select(Event::ALL.to_vec()),
        proptest::sample::select(EventType::ALL.to_vec()),
        text().prop_filter("N/A stands for no name", |n| n != "N/A"),
        // The SQLite form stores integers as i64, so what it can hold.
        (0..=i64::MAX as u64, any::<u32>(), 0..=i64::MAX as u64),
        device(),
        any::<Option<u64>>(),
        proptest::option::of(attrs()),
        (text(), text()),
    )
        .prop_map(
            |(event, event_type, name, (ts, pid, tid), device, ptr, attrs, (py, c))| {
                let mut row = EventRow::new(event, event_type, name);
                row.ts_ns = ts;
                row.pid = pid;
                row.tid = tid;
                row.device = device;
                row.ptr = ptr;
                row.attrs_json = attrs
                    .map(|a| serde_json::Value::Object(a).to_string())
                    .filter(|a| a != "{}");
                row.python_stack = py;
                row.c_stack = c;
                row
            },
        )
}

fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter_map("JSON has no NaN", serde_json::Number::from_f64)
            .prop_map(Value::Number),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(NUMERIC_ATTRS.to_vec()).prop_map(str::to_owned),
        Just("owner".to_owned()),
        text(),
    ]
}

/// An Attr object: numbers of every kind under the counted keys, and anything else.
fn attrs() -> impl Strategy<Value = serde_json::Map<String, serde_json::Value>> {
    let numeric = prop_oneof![
        3 => any::<u64>().prop_map(serde_json::Value::from),
        1 => json(),
    ];
    proptest::collection::vec(
        prop_oneof![
            (
                proptest::sample::select(NUMERIC_ATTRS.to_vec()).prop_map(str::to_owned),
                numeric
            ),
            (key(), json()),
        ],
        0..6,
    )
    .prop_map(|kv| kv.into_iter().collect())
}

proptest! {
    #![proptest_config(config(128))]

    /// What the writer writes, the reader reads back, in CSV and in SQLite; a counted Attr
    /// value that is no u64 is refused by both, naming the key.
    #[test]
    fn written_rows_read_back(mut rows in proptest::collection::vec(row(), 1..6)) {
        for (i, row) in rows.iter_mut().enumerate() {
            row.id = i as u64 * 3 + 1;
        }
        let refused = rows.iter().position(|row| {
            let attrs: serde_json::Map<String, serde_json::Value> = row
                .attrs_json
                .as_deref()
                .map(|a| serde_json::from_str(a).unwrap())
                .unwrap_or_default();
            NUMERIC_ATTRS
                .iter()
                .any(|k| attrs.get(*k).is_some_and(|v| v.as_u64().is_none()))
        });
        let csv = scratch("rows.csv");
        std::fs::write(&csv, csv_of(&rows)).unwrap();
        let db = scratch("rows.db");
        {
            let conn = rusqlite::Connection::open(&db).unwrap();
            conn.execute_batch(msmemscope_core::events::sqlite::write::CREATE_TABLE).unwrap();
            for row in &rows {
                msmemscope_core::events::sqlite::write::insert(&conn, row).unwrap();
            }
        }
        for path in [&*csv, &*db] {
            let (read, error) = read_all(path);
            match refused {
                None => {
                    prop_assert!(error.is_none(), "{error:?}");
                    prop_assert_eq!(&read, &rows);
                    for row in &read {
                        let attrs: serde_json::Map<String, serde_json::Value> = row
                            .attrs_json
                            .as_deref()
                            .map(|a| serde_json::from_str(a).unwrap())
                            .unwrap_or_default();
                        for key in NUMERIC_ATTRS {
                            prop_assert_eq!(
                                row.attr_u64(key),
                                attrs.get(key).and_then(|v| v.as_u64()),
                                "{} in {:?}", key, row.attrs_json
                            );
                        }
                    }
                }
                Some(at) => {
                    prop_assert_eq!(read.len(), at);
                    let message = error.map(|e| e.to_string()).unwrap_or_default();
                    prop_assert!(message.contains("malformed row: Attr \""), "{}", message);
                }
            }
        }
    }

    /// Any Attr text: refused or read, never a panic, and what is read is a JSON object.
    #[test]
    fn any_attr_text_is_safe(attr in prop_oneof![
        json().prop_map(|v| v.to_string()),
        text(),
        "\\{[\"a-z0-9:,.\\-\\[\\]{} ]{0,40}\\}",
    ]) {
        let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
        row.id = 1;
        row.attrs_json = Some(attr.clone());
        let path = scratch("attr.csv");
        std::fs::write(&path, csv_of(&[row])).unwrap();
        let (read, _) = read_all(&path);
        for row in read {
            if let Some(raw) = &row.attrs_json {
                prop_assert!(serde_json::from_str::<serde_json::Map<_, _>>(raw).is_ok(), "{raw}");
                for key in NUMERIC_ATTRS {
                    let _ = row.attr_u64(key);
                    let _ = row.attr_str(key);
                }
            }
        }
    }
}

// --- damaged CSV --------------------------------------------------------------------------

/// Edits of a valid dump's bytes: `(where, what)`, where as a fraction of the length.
fn edits() -> impl Strategy<Value = Vec<(f64, Option<u8>, bool)>> {
    let byte = prop_oneof![
        proptest::sample::select(b",\"\n\r{}:0x-9 \0".to_vec()),
        any::<u8>(),
    ];
    proptest::collection::vec(
        (0.0..1.0f64, proptest::option::of(byte), any::<bool>()),
        0..8,
    )
}

proptest! {
    #![proptest_config(config(256))]

    /// A valid dump with bytes inserted, replaced or deleted, or bytes of any kind after the
    /// header or instead of it.
    #[test]
    fn damaged_csv_is_safe(
        mut rows in proptest::collection::vec(row(), 0..5),
        edits in edits(),
        junk in proptest::collection::vec(any::<u8>(), 0..64),
        keep_header in any::<bool>(),
    ) {
        for (i, row) in rows.iter_mut().enumerate() {
            row.id = i as u64 + 1;
        }
        let mut bytes = csv_of(&rows).into_bytes();
        for (at, byte, insert) in edits {
            let at = (at * bytes.len() as f64) as usize;
            match byte {
                Some(b) if insert || at >= bytes.len() => bytes.insert(at.min(bytes.len()), b),
                Some(b) => bytes[at] = b,
                None if at < bytes.len() => {
                    bytes.remove(at);
                }
                None => {}
            }
        }
        bytes.extend_from_slice(&junk);
        let path = scratch("damaged.csv");
        std::fs::write(&path, &bytes).unwrap();
        read_all(&path);
        let raw = if keep_header { [format!("{HEADER}\n").as_bytes(), &junk].concat() } else { junk };
        std::fs::write(&path, raw).unwrap();
        read_all(&path);
    }
}

proptest! {
    #![proptest_config(config(4))]

    /// A dump grown into a hole of any size past the cap is refused after the cap, whatever
    /// its size.
    #[test]
    fn sparse_tails_stop_at_the_cap(
        rows in 0usize..3,
        size in (MAX_ROW_BYTES as u64 + 64)..(8u64 << 30),
    ) {
        let mut text = format!("{HEADER}\n");
        for id in 1..=rows {
            text.push_str(&format!("{id},MSTX,Mark,m,5,1,1,N/A,N/A,{{}},,\n"));
        }
        let path = scratch("sparse.csv");
        std::fs::write(&path, &text).unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_len(size).unwrap();
        let (read, error) = read_all(&path);
        prop_assert_eq!(read.len(), rows);
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        prop_assert!(
            message.ends_with(&format!(
                ":{}: row {} is longer than {MAX_ROW_BYTES} bytes: not a memscope dump",
                rows + 2,
                rows + 1
            )),
            "{}",
            message
        );
    }
}

// --- SQLite files -------------------------------------------------------------------------

fn sql_value() -> impl Strategy<Value = rusqlite::types::Value> {
    use rusqlite::types::Value;
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::Integer),
        (0i64..10).prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Real),
        text().prop_map(Value::Text),
        proptest::sample::select(vec![
            "MALLOC",
            "FREE",
            "PTA",
            "HAL",
            "cpu",
            "0",
            "N/A",
            "0x10",
            "{}",
            "{\"size\":1}",
            "{\"size\":-1}",
            "{\"size\":1e30}",
        ])
        .prop_map(|s| Value::Text(s.into())),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(Value::Blob),
    ]
}

/// A `memscope_dump` table of some of the dump's columns (and others), in any order, with any
/// declared types and any values; some BLOBs cast to (possibly invalid UTF-8) text.
fn sqlite_table() -> impl Strategy<
    Value = (
        Vec<(String, String)>,
        Vec<Vec<rusqlite::types::Value>>,
        bool,
    ),
> {
    let columns = proptest::sample::subsequence(
        HEADER
            .split(',')
            .map(str::to_owned)
            .chain(["Extra".to_owned()])
            .collect::<Vec<_>>(),
        0..=13,
    )
    .prop_shuffle();
    let typed = columns.prop_flat_map(|names| {
        let n = names.len();
        (
            Just(names),
            proptest::collection::vec(
                proptest::sample::select(vec!["", "INTEGER", "TEXT", "REAL", "BLOB"]),
                n,
            ),
        )
    });
    typed.prop_flat_map(|(names, types)| {
        let n = names.len().max(1);
        let columns: Vec<(String, String)> = names
            .into_iter()
            .zip(types)
            .map(|(n, t)| (n, t.to_owned()))
            .collect();
        (
            Just(columns),
            proptest::collection::vec(proptest::collection::vec(sql_value(), n), 0..6),
            any::<bool>(),
        )
    })
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn any_sqlite_table_is_safe((columns, rows, cast) in sqlite_table()) {
        let path = scratch("table.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            let defs: Vec<String> = if columns.is_empty() {
                vec!["\"Other\"".to_owned()]
            } else {
                columns.iter().map(|(n, t)| format!("\"{n}\" {t}")).collect()
            };
            conn.execute(&format!("CREATE TABLE memscope_dump ({})", defs.join(", ")), [])
                .unwrap();
            let marks = vec!["?"; defs.len()].join(", ");
            for row in &rows {
                conn.execute(
                    &format!("INSERT INTO memscope_dump VALUES ({marks})"),
                    rusqlite::params_from_iter(row.iter().take(defs.len())),
                )
                .unwrap();
            }
            if cast {
                for (name, _) in &columns {
                    conn.execute(
                        &format!("UPDATE memscope_dump SET \"{name}\" = CAST(\"{name}\" AS TEXT) WHERE typeof(\"{name}\") = 'blob'"),
                        [],
                    )
                    .unwrap();
                }
            }
        }
        let has = |c: &str| columns.iter().any(|(n, _)| n == c);
        let complete = HEADER.split(',').all(has);
        // The original tool's dumps may lack the call-stack columns: such a table is read in
        // its dialect (events::original), which needs every other column.
        let originals = HEADER
            .split(',')
            .filter(|c| !c.starts_with("Call Stack"))
            .all(has);
        let (_, error) = read_all(&path);
        if !complete && !originals {
            let message = error.map(|e| e.to_string()).unwrap_or_default();
            prop_assert!(message.contains("lacks column"), "{}", message);
        }
    }

    /// A valid SQLite dump with bytes overwritten anywhere, or cut short.
    #[test]
    fn damaged_sqlite_is_safe(
        mut rows in proptest::collection::vec(row(), 1..4),
        edits in proptest::collection::vec((0.0..1.0f64, any::<u8>()), 1..16),
        cut in proptest::option::of(0.0..1.0f64),
    ) {
        for (i, row) in rows.iter_mut().enumerate() {
            row.id = i as u64 + 1;
        }
        let path = scratch("damaged.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(msmemscope_core::events::sqlite::write::CREATE_TABLE).unwrap();
            for row in &rows {
                msmemscope_core::events::sqlite::write::insert(&conn, row).unwrap();
            }
        }
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, b) in edits {
            let at = (at * bytes.len() as f64) as usize;
            let last = bytes.len() - 1;
            bytes[at.min(last)] = b;
        }
        if let Some(cut) = cut {
            bytes.truncate((cut * bytes.len() as f64) as usize);
        }
        std::fs::write(&path, &bytes).unwrap();
        read_all(&path);
    }

    /// Bytes of any kind named `.db`.
    #[test]
    fn any_bytes_as_sqlite_are_safe(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        magic in any::<bool>(),
    ) {
        let path = scratch("bytes.db");
        let bytes = if magic { [b"SQLite format 3\0".as_slice(), &bytes].concat() } else { bytes };
        std::fs::write(&path, &bytes).unwrap();
        read_all(&path);
    }
}
