//! Helpers the test modules share: the proptest configuration, scratch files, reading a dump
//! to its end with the checks that hold for every input, and a dump's CSV text.

use std::path::{Path, PathBuf};

use msmemscope_core::events::csv::{write_row, HEADER};
use msmemscope_core::events::reader::{self, ReadError, MAX_ROW_BYTES};
use msmemscope_core::events::EventRow;
use proptest::test_runner::Config;

/// `cases` cases (`PROPTEST_CASES` sets another number for each test, for a longer hunt), and
/// no regression files written into the source tree.
pub fn config(cases: u32) -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..Config::default()
    }
}

/// A file path of its own for one case, removed with it.
pub struct Scratch(PathBuf);

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
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A scratch file ending in `name` (its extension picks the reader), in a directory of this
/// process's own; a number in front keeps every one apart.
pub fn scratch(name: &str) -> Scratch {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("msmemscope-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir.join(format!("{n}-{name}")))
}

/// Reads `path` to the end: the rows, then the error that ended them, if any. Checks what
/// holds for every input: every error is one line, no row comes after the error, no row is
/// longer than the cap.
pub fn read_all(path: &Path) -> (Vec<EventRow>, Option<ReadError>) {
    let rows = match reader::open(path) {
        Ok(rows) => rows,
        Err(e) => {
            assert_one_line(&e);
            return (Vec::new(), Some(e));
        }
    };
    let mut good = Vec::new();
    let mut error = None;
    for row in rows {
        assert!(error.is_none(), "a row after the error {error:?}");
        match row {
            Ok(row) => {
                let len = row.name.len()
                    + row.python_stack.len()
                    + row.c_stack.len()
                    + row.attrs_json.as_ref().map_or(0, String::len);
                assert!(len <= MAX_ROW_BYTES, "a row of {len} bytes");
                good.push(row);
            }
            Err(e) => {
                assert_one_line(&e);
                error = Some(e);
            }
        }
    }
    (good, error)
}

fn assert_one_line(e: &ReadError) {
    let text = e.to_string();
    assert!(!text.contains('\n') && !text.contains('\r'), "{text:?}");
}

/// Our CSV text of `rows`, header first, as the writer writes it.
pub fn csv_of(rows: &[EventRow]) -> String {
    let mut text = format!("{HEADER}\n");
    for row in rows {
        write_row(&mut text, row);
    }
    text
}
