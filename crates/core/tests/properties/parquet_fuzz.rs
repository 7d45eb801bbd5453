//! Property tests of the Parquet dump, a bounded number of cases in the normal test run: any
//! rows written by the Parquet writer read back as the CSV reader reads the same rows (refused
//! where it refuses them), and any damage to a Parquet file (bytes changed, the file cut) is
//! read to an error of one line, never a panic or a row over the cap.

use std::path::Path;

use msmemscope_core::events::parquet::writer::{ParquetWriter, WriteError};
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};
use proptest::prelude::*;

use crate::util::{config, csv_of, read_all, scratch};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(
            prop_oneof![
                Just(','),
                Just('"'),
                Just('\n'),
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

/// An Attr: the typed keys with numbers that fit or not, strings, or other JSON.
fn attrs() -> impl Strategy<Value = Option<String>> {
    use serde_json::Value;
    let value = prop_oneof![
        3 => (0..=i64::MAX as u64).prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => text().prop_map(Value::String),
        1 => Just(Value::Null),
    ];
    let key = prop_oneof![
        proptest::sample::select(vec![
            "size",
            "allocation_id",
            "used",
            "total",
            "owner",
            "addr"
        ])
        .prop_map(str::to_owned),
        text(),
    ];
    proptest::option::of(proptest::collection::vec((key, value), 0..6)).prop_map(|kv| {
        kv.map(|kv| Value::Object(kv.into_iter().collect()).to_string())
            .filter(|a| a != "{}")
    })
}

fn rows() -> impl Strategy<Value = Vec<EventRow>> {
    let row = (
        proptest::sample::select(Event::ALL.to_vec()),
        proptest::sample::select(EventType::ALL.to_vec()),
        text().prop_filter("N/A stands for no name", |n| n != "N/A"),
        (0..=i64::MAX as u64, any::<u32>(), 0..=i64::MAX as u64),
        prop_oneof![
            Just(DeviceId::None),
            Just(DeviceId::Cpu),
            any::<u32>().prop_map(DeviceId::Cuda)
        ],
        any::<Option<u64>>(),
        attrs(),
        (text(), text()),
    )
        .prop_map(
            |(event, event_type, name, (ts, pid, tid), device, ptr, attrs, (py, c))| {
                let mut row = EventRow::new(event, event_type, name);
                (row.ts_ns, row.pid, row.tid) = (ts, pid, tid);
                row.device = device;
                row.ptr = ptr;
                row.attrs_json = attrs;
                row.python_stack = py;
                row.c_stack = c;
                row
            },
        );
    proptest::collection::vec(row, 1..20).prop_map(|mut rows| {
        for (i, row) in rows.iter_mut().enumerate() {
            row.id = i as u64 + 1;
        }
        rows
    })
}

/// Writes `rows` as Parquet; false when the writer refuses one (a value above i64::MAX).
fn write_parquet(path: &Path, rows: &[EventRow]) -> bool {
    let mut out = ParquetWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for row in rows {
        match out.push(row) {
            Ok(_) => {}
            Err(WriteError::TooLarge { .. }) => return false,
            Err(e) => panic!("{e}"),
        }
    }
    out.finish().unwrap();
    true
}

fn write_csv(path: &Path, rows: &[EventRow]) {
    std::fs::write(path, csv_of(rows)).unwrap();
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn parquet_reads_back_what_csv_reads(rows in rows()) {
        let parquet = scratch("rows.parquet");
        prop_assume!(write_parquet(&parquet, &rows));
        let csv = scratch("rows.csv");
        write_csv(&csv, &rows);
        let (want, want_error) = read_all(&csv);
        let (got, got_error) = read_all(&parquet);
        prop_assert_eq!(got, want);
        prop_assert_eq!(
            got_error.is_some(),
            want_error.is_some(),
            "{:?} / {:?}",
            got_error,
            want_error
        );
    }

    #[test]
    fn damaged_files_end_in_one_line(
        rows in rows(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let parquet = scratch("rows.parquet");
        prop_assume!(write_parquet(&parquet, &rows));
        let mut bytes = std::fs::read(&parquet).unwrap();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        std::fs::write(&parquet, &bytes).unwrap();
        // No panic, one-line errors, no row over the cap (checked by read_all).
        let (_, _) = read_all(&parquet);
    }
}
