//! `msmemscope report DIR` on a run directory whose other files (host-leak sites and
//! overviews, compare and watch CSVs) are damaged, hostile or not files at all: each is refused
//! with one line naming it and exit status 2, or left out of the page, within the memory limit
//! and the deadline of `unusable_dumps::cli`; never a panic or a hang. Mutated host-leak
//! documents (cut, bytes changed) end the same way.

use std::path::{Path, PathBuf};

use super::unusable_dumps::{cli, refused};
use crate::util::{dump_fixture, Scratch};

/// A run directory with a valid dump; `plant` then puts `relative` in it.
fn run_with(scratch: &Scratch, relative: &str, plant: impl FnOnce(&Path)) -> (PathBuf, PathBuf) {
    let run = scratch.path().join("run");
    let dump = run.join("device_cpu/dump");
    std::fs::create_dir_all(&dump).unwrap();
    std::fs::copy(
        dump_fixture("check_leaks.csv"),
        dump.join("memscope_dump_1.csv"),
    )
    .unwrap();
    let path = run.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    plant(&path);
    (run, path)
}

fn report(run: &Path) -> std::process::Output {
    cli(&["report".as_ref(), run.as_os_str()])
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

const SITES: &str = "host_leak/leak_sites_1.json";

#[test]
fn damaged_host_leak_sites_are_refused_in_one_line() {
    let cases: [(&str, &[u8], String); 3] = [
        (
            "cut",
            b"{\"schema\": \"msmemscope.host_leak.sites/1\", \"sites\": [",
            "not valid JSON: EOF while parsing a list at line 1 column 53".into(),
        ),
        (
            "utf8",
            b"{\"a\xff\": 1}",
            "not UTF-8 text (at byte 3)".into(),
        ),
        (
            "deep",
            &[b'['; 4096],
            "not valid JSON: recursion limit exceeded at line 1 column 128".into(),
        ),
    ];
    for (tag, bytes, why) in cases {
        let scratch = Scratch::new(&format!("hostile-sites-{tag}"));
        let (run, path) = run_with(&scratch, SITES, |p| std::fs::write(p, bytes).unwrap());
        refused(&report(&run), &format!("{}: {why}", path.display()));
        assert!(!run.join("msmemscope_report.html").exists());
    }
}

/// A compare CSV grown into a 6 GiB hole is refused by its size, not read.
#[test]
fn a_huge_compare_file_is_refused_by_its_size() {
    let scratch = Scratch::new("hostile-compare");
    let (run, path) = run_with(&scratch, "compare/memory_compare_1.csv", |p| {
        let file = std::fs::File::create(p).unwrap();
        file.set_len(6 << 30).unwrap();
    });
    refused(
        &report(&run),
        &format!(
            "{}: {} bytes, more than the {} read of one run file: not a run's",
            path.display(),
            6u64 << 30,
            1u64 << 30
        ),
    );
}

/// A FIFO or a directory where an overview, a sites document or a watch file would be is
/// not one: the page is written without it.
#[test]
fn fifos_and_directories_are_left_out() {
    for (relative, fifo) in [
        (SITES, true),
        ("host_leak/leak_overview_1.txt", true),
        ("watch_dump/watch_summary.txt", true),
        ("watch_dump/w.csv", false),
    ] {
        let scratch = Scratch::new("hostile-special");
        let (run, _) = run_with(&scratch, relative, |p| {
            if fifo {
                mkfifo(p)
            } else {
                std::fs::create_dir(p).unwrap()
            }
        });
        let out = report(&run);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{relative}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(run.join("msmemscope_report.html").is_file(), "{relative}");
    }
}

/// A valid sites document cut at positions spread over it, or with bytes changed: exit 0
/// (still JSON) or 2 with one line naming the file, never anything else.
#[test]
fn mutated_host_leak_sites_end_in_status_0_or_one_line() {
    let valid = serde_json::json!({
        "schema": "msmemscope.host_leak.sites/1",
        "window": {"stage": 1, "bytes": 4096, "blocks": 2},
        "sites": [
            {"site": "train.py:30", "bytes": 4096, "blocks": 2, "frames": ["main", "leak"]},
            {"site": "a\"b\\\\c", "bytes": 18446744073709551615u64, "blocks": 0, "frames": []}
        ]
    })
    .to_string()
    .into_bytes();
    let mut inputs: Vec<Vec<u8>> = (1..valid.len())
        .step_by(valid.len() / 8)
        .map(|cut| valid[..cut].to_vec())
        .collect();
    for (i, byte) in [(9, b'}'), (40, 0), (60, b'"'), (100, 0xff)] {
        let mut changed = valid.clone();
        changed[i] = byte;
        inputs.push(changed);
    }
    for input in inputs {
        let scratch = Scratch::new("hostile-mutated");
        let (run, path) = run_with(&scratch, SITES, |p| std::fs::write(p, &input).unwrap());
        let out = report(&run);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {}
            Some(2) => assert!(
                stderr.starts_with(&format!("msmemscope: {}: ", path.display()))
                    && stderr.lines().count() == 1,
                "{stderr}"
            ),
            other => panic!(
                "exit {other:?} on {:?}: {stderr}",
                String::from_utf8_lossy(&input)
            ),
        }
    }
}

/// A bounded run (a step in its summary only) whose page takes the online `leaks/peak.json` and
/// `leaks/findings.json` in place of its own: a valid one is taken; a cut one, a FIFO, or one
/// of more than 64 MiB is passed over and the page's own findings stay, exit 0.
#[test]
fn online_leak_files_are_taken_only_when_whole() {
    const MARK: &str = "planted-online-document";
    let whole = format!("{{\"schema\": \"{MARK}\", \"devices\": []}}");
    let cut = whole[..whole.len() - 3].to_owned();
    for relative in ["leaks/peak.json", "leaks/findings.json"] {
        for (tag, taken) in [
            ("whole", true),
            ("cut", false),
            ("fifo", false),
            ("huge", false),
        ] {
            let scratch = Scratch::new(&format!("hostile-online-{tag}"));
            let (run, _) = run_with(&scratch, relative, |p| match tag {
                "whole" => std::fs::write(p, &whole).unwrap(),
                "cut" => std::fs::write(p, &cut).unwrap(),
                "fifo" => mkfifo(p),
                // Valid JSON (spaces after it) of a size no run writes.
                _ => std::fs::write(p, whole.clone() + &" ".repeat(65 << 20)).unwrap(),
            });
            let steps = run.join("device_cpu/dump/memscope_dump_1.steps");
            std::fs::create_dir_all(&steps).unwrap();
            std::fs::write(
                steps.join("steps.csv"),
                "Step,Rows,First ID,Last ID,Detail\n0,9,1,9,head\n1,1,10,10,summary\n",
            )
            .unwrap();
            let out = report(&run);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{relative} {tag}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let html = std::fs::read_to_string(run.join("msmemscope_report.html")).unwrap();
            assert_eq!(html.contains(MARK), taken, "{relative} {tag}");
        }
    }
}
