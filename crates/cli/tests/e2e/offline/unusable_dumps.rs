//! Inputs that are not usable dumps, through every offline command that reads one
//! (`--compare`, `report DIR`, `export --format torch-snapshot|parquet DIR`): a sparse
//! multi-GB file (a line that never ends), a FIFO, a symlink to /dev/zero, an Attr `size`
//! beyond 64 bits, rows out of ID order or repeated, and a SQLite dump of another schema. Each
//! is refused with one line and exit status 2, writes nothing and leaves every input as it was.
//!
//! The commands run under a 4 GiB address-space limit and a deadline, so that a regression
//! fails the test instead of exhausting the machine or hanging it.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use msmemscope_core::events::csv::HEADER;
use msmemscope_core::events::reader;

use crate::util::{dump_fixture, to_db, Scratch, BIN};

const LIMIT_BYTES: u64 = 4 << 30;
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs the CLI with `args` under the memory limit; killed at the deadline.
pub(super) fn cli(args: &[&std::ffi::OsStr]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LIMIT_BYTES,
                rlim_max: LIMIT_BYTES,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("the CLI runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > DEADLINE {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still ran after {DEADLINE:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Asserts that the command failed with exactly `line` on stderr, exit status 2.
pub(super) fn refused(out: &Output, line: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr, format!("msmemscope: {line}\n"));
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// What a file is now, to show it unchanged: its bytes, or for a sparse file its size, blocks,
/// modification time and first MiB (reading gigabytes of holes would be the slow part).
#[derive(Debug, PartialEq)]
struct Content {
    len: u64,
    blocks: u64,
    mtime_ns: i128,
    head: Vec<u8>,
}

fn content(path: &Path) -> Content {
    let meta = std::fs::metadata(path).unwrap();
    let head = if meta.is_file() {
        use std::io::Read;
        let mut head = Vec::new();
        std::fs::File::open(path)
            .unwrap()
            .take(1 << 20)
            .read_to_end(&mut head)
            .unwrap();
        head
    } else {
        Vec::new()
    };
    Content {
        len: meta.len(),
        blocks: meta.blocks(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        head,
    }
}

/// A run directory holding `dump` (copied, linked or made by `make`) as its only dump.
fn run_dir(scratch: &Scratch, name: &str, make: impl FnOnce(&Path)) -> (PathBuf, PathBuf) {
    let run = scratch.path().join("msmemscope_1_20260101000000");
    let dumps = run.join("device_cpu/dump");
    std::fs::create_dir_all(&dumps).unwrap();
    let dump = dumps.join(name);
    make(&dump);
    (run, dump)
}

/// Runs `--compare` with `bad` as the base and a good dump as the other, then `report` and
/// `export` on a run holding `bad`: each must print `line(path)` and exit 2, and change nothing.
fn refused_everywhere(tag: &str, name: &str, make: impl Fn(&Path), line: impl Fn(&Path) -> String) {
    let scratch = Scratch::new(tag);
    let bad = scratch.path().join(name);
    make(&bad);
    let good = dump_fixture("compare_base.csv");
    let (before_bad, before_good) = (content(&bad), content(&good));
    let out_dir = scratch.path().join("out");
    let out = cli(&[
        "--compare".as_ref(),
        format!("--input-path={},{}", bad.display(), good.display()).as_ref(),
        format!("--output-path={}", out_dir.display()).as_ref(),
    ]);
    refused(&out, &line(&bad));
    assert!(
        !out_dir.exists(),
        "--compare wrote into {}",
        out_dir.display()
    );
    assert_eq!(content(&bad), before_bad);
    assert_eq!(content(&good), before_good);

    let (run, dump) = run_dir(
        &scratch,
        &format!("memscope_dump_1.{}", name.rsplit('.').next().unwrap()),
        &make,
    );
    let before = content(&dump);
    refused(&cli(&["report".as_ref(), run.as_os_str()]), &line(&dump));
    assert!(!run.join("msmemscope_report.html").exists());
    refused(
        &cli(&[
            "export".as_ref(),
            "--format".as_ref(),
            "torch-snapshot".as_ref(),
            run.as_os_str(),
        ]),
        &line(&dump),
    );
    refused(
        &cli(&[
            "export".as_ref(),
            "--format=parquet".as_ref(),
            run.as_os_str(),
        ]),
        &line(&dump),
    );
    let dumps: Vec<_> = std::fs::read_dir(run.join("device_cpu/dump"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        dumps,
        [dump.file_name().unwrap()],
        "the dump directory gained files"
    );
    assert_eq!(content(&dump), before);
    let left: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, ["device_cpu"], "the run directory gained files");
}

/// A valid dump grown to 3 GiB with `truncate -s 3G`: its last line never ends.
fn sparse_copy(path: &Path) {
    std::fs::copy(dump_fixture("compare_base.csv"), path).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(3 << 30).unwrap();
}

#[test]
fn a_sparse_multi_gigabyte_file_is_refused_at_the_row_cap() {
    let fixture = dump_fixture("compare_base.csv");
    let text = std::fs::read_to_string(&fixture).unwrap();
    // The holes start right after the fixture's last line: its rows, then one more.
    let rows = reader::open(&fixture).unwrap().count();
    let line = text.matches('\n').count() + 1;
    refused_everywhere("sparse", "sparse.csv", sparse_copy, |path| {
        format!(
            "{}:{line}: row {} is longer than 16777216 bytes: not a memscope dump",
            path.display(),
            rows + 1
        )
    });
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let mkfifo = |path: &Path| {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo {}", path.display());
    };
    for name in ["fifo.csv", "fifo.db"] {
        refused_everywhere("fifo", name, mkfifo, |path| {
            format!(
                "{}: not a memscope dump: a FIFO, not a regular file",
                path.display()
            )
        });
    }
}

#[test]
fn a_symlink_to_dev_zero_is_refused() {
    let link = |path: &Path| std::os::unix::fs::symlink("/dev/zero", path).unwrap();
    refused_everywhere("zero", "zero.csv", link, |path| {
        format!(
            "{}: not a memscope dump: a character device, not a regular file",
            path.display()
        )
    });
}

fn write_dump<'a>(rows: &'a [&'a str]) -> impl Fn(&Path) + 'a {
    move |path: &Path| {
        let mut text = format!("{HEADER}\n");
        for row in rows {
            text.push_str(row);
            text.push('\n');
        }
        std::fs::write(path, text).unwrap();
    }
}

const START: &str = "1,SYSTEM,START_TRACE,N/A,1000,42,42,N/A,N/A,{},,";
const MARK: &str = "3,MSTX,Mark,test,1200,42,42,N/A,N/A,{},,";

#[test]
fn a_size_beyond_64_bits_is_refused_by_every_reader() {
    let malloc = "2,MALLOC,PTA,N/A,1100,42,42,cpu,0x0000000000001000,\"{\"\"allocation_id\"\":1,\"\"size\"\":18446744073709551616,\"\"owner\"\":\"\"PTA\"\"}\",,";
    refused_everywhere(
        "overflow",
        "overflow.csv",
        write_dump(&[START, malloc, MARK]),
        |path| {
            format!(
            "{}:3: malformed row: Attr \"size\" is not an integer from 0 to 18446744073709551615: \"18446744073709551616\"",
            path.display()
        )
        },
    );
}

#[test]
fn rows_out_of_id_order_or_repeated_are_refused() {
    let malloc = "2,MALLOC,PTA,N/A,1100,42,42,cpu,0x0000000000001000,\"{\"\"allocation_id\"\":1,\"\"size\"\":64}\",,";
    refused_everywhere(
        "repeat",
        "repeat.csv",
        write_dump(&[START, malloc, malloc, MARK]),
        |path| {
            format!(
                "{}:4: malformed row: ID 2 repeats the previous row's ID",
                path.display()
            )
        },
    );
    refused_everywhere(
        "order",
        "order.csv",
        write_dump(&[START, MARK, malloc]),
        |path| {
            format!(
                "{}:4: malformed row: ID 2 comes after ID 3: rows must be in ascending ID order",
                path.display()
            )
        },
    );
}

#[test]
fn a_sqlite_dump_of_another_schema_is_refused() {
    let wrong = |path: &Path| {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE memscope_dump (\"ID\" INTEGER PRIMARY KEY, \"Event\" TEXT);
             INSERT INTO memscope_dump VALUES (1, 'MALLOC');",
        )
        .unwrap();
    };
    refused_everywhere("schema", "wrong.db", wrong, |path| {
        format!(
            "{}: not a memscope dump: table memscope_dump lacks column \"Event Type\"",
            path.display()
        )
    });
    // The right schema with a bad value: the row's ID, the field and why.
    let overflow = |path: &Path| {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(msmemscope_core::events::sqlite::write::CREATE_TABLE)
            .unwrap();
        for (id, event, kind, attr) in [
            (1, "SYSTEM", "START_TRACE", "{}"),
            (2, "MALLOC", "PTA", "{\"size\":99999999999999999999}"),
        ] {
            conn.execute(
                "INSERT INTO memscope_dump VALUES (?1, ?2, ?3, 'N/A', 5, 1, 1, 'cpu', '0x10', ?4, '', '')",
                rusqlite::params![id, event, kind, attr],
            )
            .unwrap();
        }
    };
    refused_everywhere("db-overflow", "overflow.db", overflow, |path| {
        format!(
            "{}:2: malformed row: Attr \"size\" is not an integer from 0 to 18446744073709551615: \"99999999999999999999\"",
            path.display()
        )
    });
}

#[test]
fn a_good_sqlite_dump_still_reads() {
    // The checks above refuse only what is wrong: the fixture as SQLite compares with itself.
    let scratch = Scratch::new("good-db");
    let db = scratch.path().join("base.db");
    to_db(&dump_fixture("compare_base.csv"), &db);
    let out_dir = scratch.path().join("out");
    let out = cli(&[
        "--compare".as_ref(),
        format!(
            "--input-path={},{}",
            db.display(),
            dump_fixture("compare_base.csv").display()
        )
        .as_ref(),
        format!("--output-path={}", out_dir.display()).as_ref(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
