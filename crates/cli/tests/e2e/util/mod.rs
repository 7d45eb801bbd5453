//! Helpers shared by the end-to-end tests: where things are, scratch directories, and C
//! producers of the runtime's C ABI built with gcc from tests/fixtures/. The rest by subject:
//! `fixtures` (the runtime library, fixture sources, building them), `run` (running the CLI,
//! finding and reading what a run wrote), `host_leak` (the host-leak harness: runs and the parsed
//! overview), `attach_target` (the target the attach tests step through its phases).
//!
//! All tests run as threads of one process: every scratch directory has a name of its own (the
//! process id and a counter), and every program built from tests/fixtures/ goes to a
//! directory of its own in [`build_dir`].

pub mod attach_target;
pub mod host_leak;

mod fixtures;
mod run;

pub use fixtures::*;
pub use run::*;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

// ------------------------------------------------------------------------------------------
// Where things are

/// The CLI under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_msmemscope-cli");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `target/release`: the CLI and the runtime library beside it.
pub fn release_dir() -> PathBuf {
    Path::new(BIN).parent().unwrap().to_path_buf()
}

/// A hand-written dump in tests/fixtures/dumps/.
pub fn dump_fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/dumps").join(name)
}

// ------------------------------------------------------------------------------------------
// Directories

/// A fresh temporary directory, removed on drop. Its name holds the process id and a counter
/// of the whole process, so no two tests share one.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("msmemscope-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ------------------------------------------------------------------------------------------
// Producers

/// Builds `tests/fixtures/{name}.c`, a producer linked against the runtime library next to the
/// CLI (once per test process).
pub fn producer(name: &str) -> PathBuf {
    let include = repo().join("crates/runtime/include");
    let libs = format!("-L{}", release_dir().display());
    let rpath = format!("-Wl,-rpath,{}", release_dir().display());
    built_once(
        "producers",
        &format!("{name}.c"),
        name,
        &["-O2", "-I", include.to_str().unwrap()],
        &[&libs, "-lmsmemscope_runtime", &rpath],
    )
}

/// Copies a CSV dump's rows into a new SQLite dump, as `--format db` writes them.
pub fn to_db(csv: &Path, db: &Path) {
    use msmemscope_core::events::reader;
    use msmemscope_core::events::sqlite::write as dump_db;
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(dump_db::CREATE_TABLE).unwrap();
    for row in reader::open(csv).unwrap() {
        dump_db::insert(&conn, &row.unwrap()).unwrap();
    }
}
