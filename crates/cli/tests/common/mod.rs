//! Helpers shared by the end-to-end tests: where things are, scratch directories, and C
//! producers of the runtime's C ABI built with gcc from tests/fixtures/. Each test file is its
//! own crate and uses a part of this.
#![allow(dead_code)]

pub mod attach_target;
pub mod host_leak;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

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

/// A fresh temporary directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// Builds `tests/fixtures/{name}.c`, a producer linked against the runtime library next to the
/// CLI (once per test process).
pub fn producer(name: &str) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(prog) = built.get(name) {
        return prog.clone();
    }
    let lib = release_dir().join("libmsmemscope_runtime.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build --release` first",
        lib.display()
    );
    let dir = std::env::temp_dir().join(format!("msmemscope-producers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prog = dir.join(name);
    let out = Command::new("gcc")
        .arg("-O2")
        .arg("-I")
        .arg(repo().join("crates/runtime/include"))
        .arg(repo().join("tests/fixtures").join(format!("{name}.c")))
        .arg("-o")
        .arg(&prog)
        .arg(format!("-L{}", release_dir().display()))
        .arg("-lmsmemscope_runtime")
        .arg(format!("-Wl,-rpath,{}", release_dir().display()))
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(name.to_string(), prog.clone());
    prog
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
