//! `msmemscope --compare` end to end on hand-written dumps with known answers
//! (tests/fixtures/dumps/compare_*.csv; SQLite copies are made here with rusqlite).
//!
//! compare_base.csv is a small CPU training step as the PyTorch tracker writes it (op rows
//! without a device, MALLOC/FREE on `cpu`, marks, steps, an ACCESS row, quoted multi-line
//! stacks); compare_more.csv is the same step with `aten::addmm` allocating twice as much
//! (8192 bytes instead of 4096) and one more op, `aten::native_dropout` (4096 + 1024 bytes).
//! compare_kernel_*.csv are kernel-level dumps on device 0, the second with one more kernel.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::util::{cli_in, dump_fixture, to_db, Scratch};

const HEADER: &str = ",,,Base,Compare\n\
Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)\n";

fn fixture(name: &str) -> PathBuf {
    dump_fixture(name).canonicalize().unwrap()
}

fn run(dir: &Path, args: &[&str]) -> Output {
    cli_in(dir, args)
}

/// Runs a comparison that must succeed; returns the written file's path and text.
fn compare(scratch: &Scratch, base: &Path, other: &Path, extra: &[&str]) -> (PathBuf, String) {
    let out_dir = scratch.path().join("out");
    let input = format!("--input-path={},{}", base.display(), other.display());
    let output_arg = format!("--output-path={}", out_dir.display());
    let mut args = vec!["--compare", input.as_str(), output_arg.as_str()];
    args.extend_from_slice(extra);
    let out = run(scratch.path(), &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: stderr {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let path = PathBuf::from(stdout.trim_end());
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    assert_eq!(path.parent().unwrap(), out_dir.join("compare"));
    let name = path.file_name().unwrap().to_str().unwrap();
    let stamp = name
        .strip_prefix("memory_compare_")
        .and_then(|s| s.strip_suffix(".csv"))
        .unwrap_or_else(|| panic!("bad name {name}"));
    let stamp = stamp.split('_').next().unwrap();
    assert!(
        stamp.len() == 14 && stamp.bytes().all(|b| b.is_ascii_digit()),
        "{name}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

/// The rows after the two header lines, which must be the original msMemScope's
/// (docs/output-files.md#compare-csv).
fn body(text: &str) -> &str {
    text.strip_prefix(HEADER)
        .unwrap_or_else(|| panic!("header lines differ: {text}"))
}

const OP_EXPECTED: &str = "\
OP_LAUNCH,aten::empty.memory_format,cpu,4096,4096,0
OP_LAUNCH,aten::addmm.default,cpu,4096,8192,4096
OP_LAUNCH,aten::relu.default,cpu,4096,4096,0
OP_LAUNCH,aten::native_dropout.default,cpu,N/A,5120,5120
OP_LAUNCH,aten::sum.default,cpu,4,4,0
OP_LAUNCH,aten::ones_like.default,cpu,4,4,0
OP_LAUNCH,aten::mul.Tensor,cpu,4,4,0
OP_LAUNCH,aten::sum.default,cpu,4,4,0
";

#[test]
fn added_op_and_doubled_allocation() {
    let scratch = Scratch::new("ops");
    let (base, more) = (fixture("compare_base.csv"), fixture("compare_more.csv"));
    let (_, text) = compare(&scratch, &base, &more, &["--level=op"]);
    assert_eq!(body(&text), OP_EXPECTED);
    // The other way round, the dropout is a base-only row with a negative diff.
    let (_, text) = compare(&scratch, &more, &base, &[]);
    let lines: Vec<&str> = body(&text).lines().collect();
    assert_eq!(
        lines[1],
        "OP_LAUNCH,aten::addmm.default,cpu,8192,4096,-4096"
    );
    assert_eq!(
        lines[3],
        "OP_LAUNCH,aten::native_dropout.default,cpu,5120,N/A,-5120"
    );
    assert_eq!(lines.len(), 8);
}

#[test]
fn a_dump_against_itself_has_zero_diffs() {
    let scratch = Scratch::new("self");
    for name in [
        "compare_base.csv",
        "compare_more.csv",
        "compare_kernel_more.csv",
    ] {
        let dump = fixture(name);
        let level = if name.contains("kernel") {
            "--level=kernel"
        } else {
            "--level=op"
        };
        let (_, text) = compare(&scratch, &dump, &dump, &[level]);
        let rows = body(&text);
        assert!(rows.lines().count() >= 4, "{name}: {rows}");
        for line in rows.lines() {
            assert!(line.ends_with(",0"), "{name}: {line}");
            assert!(!line.contains("N/A"), "{name}: {line}");
        }
    }
}

#[test]
fn kernel_level() {
    let scratch = Scratch::new("kernel");
    let (_, text) = compare(
        &scratch,
        &fixture("compare_kernel_base.csv"),
        &fixture("compare_kernel_more.csv"),
        &["--level=kernel"],
    );
    assert_eq!(
        body(&text),
        "KERNEL_LAUNCH,\"void gemm_kernel<float, 128>(float*, float const*)\",0,1048576,1048576,0\n\
         KERNEL_LAUNCH,elementwise_relu,0,0,0,0\n\
         KERNEL_LAUNCH,dropout_kernel,0,N/A,524288,524288\n\
         KERNEL_LAUNCH,reduce_sum,0,512,512,0\n"
    );
    // The op-level dumps have no kernels: headers only, and a warning per input.
    let base = fixture("compare_base.csv");
    let out_dir = scratch.path().join("out");
    let out = run(
        scratch.path(),
        &[
            "--compare",
            &format!("--input-path={},{}", base.display(), base.display()),
            "--level=kernel",
            &format!("--output-path={}", out_dir.display()),
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("has no KERNEL_LAUNCH rows"), "{stderr}");
    let path = String::from_utf8(out.stdout).unwrap();
    assert_eq!(std::fs::read_to_string(path.trim_end()).unwrap(), HEADER);
}

#[test]
fn csv_and_db_inputs_give_the_same_file() {
    let scratch = Scratch::new("db");
    let (base, more) = (fixture("compare_base.csv"), fixture("compare_more.csv"));
    let (base_db, more_db) = (
        scratch.path().join("base.db"),
        scratch.path().join("more.db"),
    );
    to_db(&base, &base_db);
    to_db(&more, &more_db);
    let (_, from_csv) = compare(&scratch, &base, &more, &[]);
    let (_, from_db) = compare(&scratch, &base_db, &more_db, &[]);
    let (_, mixed) = compare(&scratch, &base, &more_db, &[]);
    assert_eq!(body(&from_db), OP_EXPECTED);
    assert_eq!(from_db, from_csv);
    assert_eq!(mixed, from_csv);
}

#[test]
fn full_width_comma_and_relative_paths() {
    let scratch = Scratch::new("comma");
    std::fs::copy(fixture("compare_base.csv"), scratch.path().join("a.csv")).unwrap();
    std::fs::copy(fixture("compare_more.csv"), scratch.path().join("b.csv")).unwrap();
    let out = run(
        scratch.path(),
        &["--compare", "--input-path=a.csv，b.csv", "-o", "results"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim_end());
    let path = if path.is_absolute() {
        path
    } else {
        scratch.path().join(path)
    };
    assert!(
        path.to_string_lossy().contains("results/compare/"),
        "{path:?}"
    );
    assert_eq!(body(&std::fs::read_to_string(&path).unwrap()), OP_EXPECTED);
    // Two comparisons in the same second get two files.
    let again = run(
        scratch.path(),
        &["--compare", "--input-path=a.csv,b.csv", "-o", "results"],
    );
    assert_eq!(again.status.code(), Some(0));
    let entries = std::fs::read_dir(scratch.path().join("results/compare"))
        .unwrap()
        .count();
    assert_eq!(entries, 2);
}

/// Runs a comparison that must fail with `code` and one line on stderr; returns the line.
fn refused(scratch: &Scratch, args: &[&str], code: i32) -> String {
    let out = run(scratch.path(), args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr:?}");
    stderr
        .trim_end()
        .strip_prefix("msmemscope: ")
        .unwrap()
        .to_owned()
}

#[test]
fn bad_inputs_are_one_line_each() {
    let scratch = Scratch::new("errors");
    let dir = scratch.path();
    let good = fixture("compare_base.csv");
    let good = good.to_str().unwrap();
    let input = |a: &str, b: &str| format!("--input-path={a},{b}");

    // A missing file is a usage error.
    let msg = refused(&scratch, &["--compare", &input(good, "nope.csv")], 2);
    assert_eq!(msg, "nope.csv: no such file");

    // Not a dump.
    std::fs::write(dir.join("other.csv"), "a,b,c\n1,2,3\n").unwrap();
    let msg = refused(&scratch, &["--compare", &input("other.csv", good)], 2);
    assert!(
        msg.starts_with("other.csv: not a memscope dump: the header is not ID,Event"),
        "{msg}"
    );
    std::fs::write(dir.join("empty.csv"), "").unwrap();
    let msg = refused(&scratch, &["--compare", &input(good, "empty.csv")], 2);
    assert_eq!(msg, "empty.csv: not a memscope dump: the file is empty");
    std::fs::write(dir.join("plain.db"), "not sqlite at all, just text").unwrap();
    let msg = refused(&scratch, &["--compare", &input(good, "plain.db")], 2);
    assert!(msg.starts_with("plain.db: "), "{msg}");

    // A malformed row, with its line number (line 1 is the header; a quoted stack spans two).
    let text = std::fs::read_to_string(good).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(lines[6].starts_with("5,OP_LAUNCH,ATEN_END"));
    lines[6] = lines[6].replace("OP_LAUNCH", "OP_LUNCH");
    std::fs::write(dir.join("bad.csv"), lines.join("\n") + "\n").unwrap();
    let msg = refused(&scratch, &["--compare", &input(good, "bad.csv")], 2);
    assert_eq!(msg, "bad.csv:7: malformed row: unknown Event \"OP_LUNCH\"");

    // A MALLOC without a size.
    let header = text.lines().next().unwrap();
    std::fs::write(
        dir.join("nosize.csv"),
        format!("{header}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n"),
    )
    .unwrap();
    let msg = refused(&scratch, &["--compare", &input("nosize.csv", good)], 2);
    assert_eq!(
        msg,
        "nosize.csv: row ID 1: MALLOC without a numeric \"size\" in Attr"
    );

    // A directory.
    let msg = refused(&scratch, &["--compare", &input(good, ".")], 2);
    assert!(msg.starts_with("--input-path: . is a directory"), "{msg}");

    // An output path under a file cannot hold a directory: a usage error naming the option.
    std::fs::write(dir.join("file"), "").unwrap();
    let msg = refused(
        &scratch,
        &["--compare", &input(good, good), "-o", "file/sub"],
        2,
    );
    assert!(
        msg.starts_with("invalid --output-path \"file/sub\": file is not a directory"),
        "{msg}"
    );
    // The output cannot be written: an I/O failure, status 1; a symlink is not followed.
    std::fs::create_dir(dir.join("out")).unwrap();
    std::fs::create_dir(dir.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("out/compare")).unwrap();
    let msg = refused(&scratch, &["--compare", &input(good, good), "-o", "out"], 1);
    assert_eq!(msg, "out/compare exists and is not a directory");
    assert_eq!(std::fs::read_dir(dir.join("elsewhere")).unwrap().count(), 0);
}
