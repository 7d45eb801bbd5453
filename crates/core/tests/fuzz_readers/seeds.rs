//! The real files each reader's mutations start from: the repository's dumps (ours in
//! tests/fixtures/dumps, the original tool's in tests/data/msmemscope-original), and the same
//! rows written by the project's own SQLite and Parquet writers.

use std::path::{Path, PathBuf};

use msmemscope_core::control_frame;
use msmemscope_core::events::parquet::writer::ParquetWriter;
use msmemscope_core::events::reader;
use msmemscope_core::events::EventRow;

use crate::harness::{HEADER, PART_ROWS, STEP_SUMMARY};

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

fn file(relative: &str) -> Vec<u8> {
    let path = repo(relative);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Our CSV dumps: leaks, an op-level compare, the attrs the analyses count.
const OUR_DUMPS: [&str; 3] = [
    "tests/fixtures/dumps/check_leaks.csv",
    "tests/fixtures/dumps/compare_base.csv",
    "tests/fixtures/dumps/inefficient_late.csv",
];

/// The rows of one of our CSV dumps, as the reader reads them.
fn rows_of(relative: &str) -> Vec<EventRow> {
    reader::open(&repo(relative))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The starting inputs of `target` (see `harness::TARGETS`).
pub fn of(target: &str) -> Vec<Vec<u8>> {
    match target {
        "csv" => OUR_DUMPS.iter().map(|p| file(p)).collect(),
        "original_csv" => vec![
            file("tests/data/msmemscope-original/leaks.csv"),
            file("tests/data/msmemscope-original/old_format_rank_a.csv"),
        ],
        "sqlite" => vec![sqlite(&rows_of(OUR_DUMPS[0])), original_sqlite()],
        "parquet" => OUR_DUMPS[..2]
            .iter()
            .map(|p| parquet(&rows_of(p)))
            .collect(),
        "step_summary" => vec![STEP_SUMMARY.as_bytes().to_vec()],
        "step_part" => vec![format!("{HEADER}\n{PART_ROWS}").into_bytes()],
        "control_frame" => {
            let request = br#"{"command": "display memory summary"}"#;
            let mut frame = vec![control_frame::VERSION, control_frame::TYPE_REQUEST];
            frame.extend_from_slice(&[0, 0, 7, 0, 0, 0]);
            frame.extend_from_slice(&(request.len() as u32).to_le_bytes());
            frame.extend_from_slice(request);
            let mut response = control_frame::response_frames(7, 0, "step 3: 12 MiB used");
            vec![frame, response.swap_remove(0)]
        }
        _ => panic!("no seeds for {target}"),
    }
}

/// A scratch file's bytes, written by `write`.
fn written(name: &str, write: impl FnOnce(&Path)) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("msmemscope-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    write(&path);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

fn sqlite(rows: &[EventRow]) -> Vec<u8> {
    written("seed.db", |path| {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(msmemscope_core::events::sqlite::write::CREATE_TABLE)
            .unwrap();
        for row in rows {
            msmemscope_core::events::sqlite::write::insert(&conn, row).unwrap();
        }
    })
}

/// The original tool's leaks dump as its SQLite table (`leaks_dump`, every value text).
fn original_sqlite() -> Vec<u8> {
    let text = file("tests/data/msmemscope-original/leaks.csv");
    written("original.db", |path| {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut csv = csv::Reader::from_reader(&text[..]);
        let columns: Vec<String> = csv.headers().unwrap().iter().map(str::to_owned).collect();
        let defs: Vec<String> = columns.iter().map(|c| format!("\"{c}\" TEXT")).collect();
        conn.execute(
            &format!("CREATE TABLE leaks_dump ({})", defs.join(", ")),
            [],
        )
        .unwrap();
        let marks = vec!["?"; columns.len()].join(", ");
        for record in csv.records() {
            let record = record.unwrap();
            conn.execute(
                &format!("INSERT INTO leaks_dump VALUES ({marks})"),
                rusqlite::params_from_iter(record.iter()),
            )
            .unwrap();
        }
    })
}

fn parquet(rows: &[EventRow]) -> Vec<u8> {
    written("seed.parquet", |path| {
        let mut out = ParquetWriter::new(std::fs::File::create(path).unwrap()).unwrap();
        for row in rows {
            out.push(row).unwrap();
        }
        out.finish().unwrap();
    })
}
