//! The usage-error contract of the real `msmemscope` binary: every bad option value, unknown
//! option and not-yet-available mode exits with status 2, prints exactly one line
//! `msmemscope: …` on stderr and nothing on stdout, and launches nothing. "Launches nothing" is
//! proved by a target that would create a marker file: `sh -c 'touch MARKER'`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::util::{cli_in, Scratch};

const MARKER: &str = "MARKER";

/// Runs `msmemscope ARGS sh -c 'touch MARKER'` and checks the usage-error contract; returns the
/// message after `msmemscope: `.
fn refused(args: &[&str]) -> String {
    let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    all.extend(["sh", "-c", "touch MARKER"].map(OsStr::new));
    refused_exactly(&all)
}

/// Like [`refused`] with the full argument list given (and no target appended).
fn refused_exactly(args: &[&OsStr]) -> String {
    let scratch = Scratch::new("cli-usage");
    let output = cli_in(scratch.path(), args);
    let stderr = String::from_utf8(output.stderr).expect("stderr is UTF-8");
    assert_eq!(output.status.code(), Some(2), "{args:?}: stderr {stderr:?}");
    assert!(output.stdout.is_empty(), "{args:?}: stdout not empty");
    assert!(
        stderr.ends_with('\n') && stderr.lines().count() == 1,
        "{args:?}: stderr is not one line: {stderr:?}"
    );
    assert!(
        !scratch.path().join(MARKER).exists(),
        "{args:?}: the target was launched"
    );
    stderr
        .trim_end()
        .strip_prefix("msmemscope: ")
        .unwrap_or_else(|| panic!("{args:?}: no `msmemscope: ` prefix in {stderr:?}"))
        .to_owned()
}

#[test]
fn bad_values_are_one_line_and_launch_nothing() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--log-level=loud"],
            "invalid --log-level \"loud\": accepted values are debug, info, warning, error",
        ),
        (
            &["--events=alloc,malloc"],
            "invalid --events \"alloc,malloc\"",
        ),
        (&["--events=none,alloc"], "none cannot be combined"),
        (&["--events=alloc,,free"], "empty item"),
        (
            &["--level", "foo"],
            "invalid --level \"foo\": accepted values are op, kernel",
        ),
        (&["--steps=0"], "invalid --steps \"0\""),
        (&["--steps=-1"], "invalid --steps \"-1\""),
        (&["--steps=1，2，3，4，5，6"], "at most 5 allowed"),
        (&["--call-stack=c:1001"], "invalid --call-stack \"c:1001\""),
        (&["--call-stack=java"], "invalid --call-stack \"java\""),
        (
            &["--collect-mode=later"],
            "invalid --collect-mode \"later\"",
        ),
        (&["--device=gpu"], "invalid --device \"gpu\""),
        (&["--device=cuda:x"], "invalid --device \"cuda:x\""),
        (&["--analysis=leak"], "invalid --analysis \"leak\""),
        (&["--analysis=oom:0"], "invalid --analysis \"oom:0\""),
        (&["--analysis=oom:1001"], "invalid --analysis \"oom:1001\""),
        (
            &["--analysis=host-leaks,leaks"],
            "host-leaks cannot be combined with other analyses",
        ),
        (&["--analysis=none,leaks"], "none cannot be combined"),
        (&["--watch=aten::add"], "the end op is missing"),
        (&["--watch=op:x,end"], "outid \"x\""),
        (
            &["--watch=a,b,full"],
            "the third field must be full-content",
        ),
        (&["--output-path="], "invalid --output-path \"\""),
        (&["-o", ""], "invalid --output-path \"\""),
        (
            &["--format=xml"],
            "invalid --format \"xml\": accepted values are csv, db, parquet",
        ),
        (&["--data-format=xml"], "invalid --data-format \"xml\""),
        (
            &["--host-leak-mode=full"],
            "invalid --host-leak-mode \"full\"",
        ),
        (
            &["--block-size-threshold=-1"],
            "invalid --block-size-threshold \"-1\"",
        ),
        (
            &["--block-size-threshold=1k"],
            "invalid --block-size-threshold \"1k\"",
        ),
        (&["--sample-rate=0"], "invalid --sample-rate \"0\""),
        (&["--sample-rate=abc"], "invalid --sample-rate \"abc\""),
        (&["--sample-bytes=512k"], "invalid --sample-bytes \"512k\""),
        (
            &["--sample-bytes=4096", "--sample-rate=8"],
            "--sample-bytes=4096 samples by bytes and cannot be combined with --sample-rate=8",
        ),
        (&["--load-api-env=gpu"], "invalid --load-api-env \"gpu\""),
        (&["--pid=-1"], "invalid --pid \"-1\""),
        (
            &["--compare", "--input-path=only-one"],
            "invalid --input-path \"only-one\"",
        ),
        // Cross-option rules.
        (
            &["--steps=1", "--analysis=leaks"],
            "--steps=1 switches the analyses off and cannot be combined with --analysis=leaks",
        ),
        (
            &["--events=launch"],
            "--analysis=leaks needs alloc and free events, which are missing from --events=launch",
        ),
        (
            &["--events=alloc", "--analysis=decompose"],
            "--analysis=decompose needs alloc and free events",
        ),
        (
            &["--analysis=host-leaks", "--watch=a,b"],
            "--analysis=host-leaks cannot be combined with --watch=a,b",
        ),
        (&["--command=start"], "--command needs --pid"),
        (&["--pid=1"], "--pid attaches to a running process"),
        (&["--input-path=a,b"], "--input-path needs --compare"),
        (&["--compare"], "--compare needs --input-path"),
        (&["--load-api-env"], "--load-api-env takes no program"),
        (&["--help=1"], "--help takes no value"),
    ];
    for (args, expected) in cases {
        let message = refused(args);
        assert!(
            message.contains(expected),
            "{args:?}: {message:?} lacks {expected:?}"
        );
    }
}

#[test]
fn unknown_options_are_one_line() {
    assert_eq!(
        refused(&["--foo"]),
        "unknown option --foo; run msmemscope --help for the accepted options"
    );
    assert_eq!(
        refused(&["--analysis=host-leaks", "--foo=bar"]),
        "unknown option --foo; run msmemscope --help for the accepted options"
    );
    assert_eq!(
        refused(&["-x"]),
        "unknown option -x; run msmemscope --help for the accepted options"
    );
}

#[test]
fn missing_values_and_missing_program() {
    let level = refused_exactly(&[OsStr::new("--level")]);
    assert_eq!(
        level,
        "--level needs a value: accepted values are op, kernel"
    );
    let nothing = refused_exactly(&[]);
    assert!(nothing.starts_with("no program to launch"), "{nothing:?}");
    let bytes = OsStr::from_bytes(b"--output-path=\xff");
    let non_utf8 = refused_exactly(&[OsStr::new("--analysis=host-leaks"), bytes]);
    assert_eq!(
        non_utf8,
        "invalid --output-path: the value is not valid UTF-8"
    );
}

#[test]
fn unavailable_modes_are_refused_in_one_line() {
    let cases: &[(&[&str], &str)] = &[
        // Not "not available": host-leaks never takes the dump's options.
        (&["--analysis=host-leaks", "--format=db"], "--analysis=host-leaks records host heap blocks, not the event dump, and does not take --format"),
        (&["--analysis=host-leaks", "--events=alloc,free"], "does not take --events"),
        (&["--analysis=host-leaks", "--level=op"], "does not take --level"),
        (&["--analysis=host-leaks", "--collect-mode=deferred"], "does not take --collect-mode"),
        (&["--analysis=host-leaks", "--device=npu:0"], "does not take --device"),
    ];
    for (args, expected) in cases {
        let message = refused(args);
        assert!(
            message.contains(expected),
            "{args:?}: {message:?} lacks {expected:?}"
        );
    }
    // --compare runs: the full-width comma splits the paths, and a missing dump is a usage error.
    let compare = refused_exactly(&["--compare", "--input-path=a.csv，b.csv"].map(OsStr::new));
    assert_eq!(compare, "a.csv: no such file");
    // --pid is available: a pid without a process is a one-line failure (status 1), not a
    // usage error.
    let scratch = Scratch::new("cli-usage");
    let attach = cli_in(
        scratch.path(),
        &["--pid", "2147483646", "--command", "start"].map(OsStr::new),
    );
    assert_eq!(attach.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&attach.stderr),
        "msmemscope: no process with pid 2147483646\n"
    );
}

#[test]
fn help_and_version_go_to_stdout() {
    let scratch = Scratch::new("cli-usage");
    let help = cli_in(scratch.path(), &[OsStr::new("--help")]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8(help.stdout).expect("help is UTF-8");
    for needle in [
        "--analysis",
        "--host-leak-mode",
        "--sample-rate",
        "--sample-bytes",
        "--load-api-env",
        "op, kernel",
        "watched blocks before and after every op",
    ] {
        assert!(text.contains(needle), "help lacks {needle:?}");
    }
    let version = cli_in(scratch.path(), &[OsStr::new("-V")]);
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(version.stdout, b"msmemscope 0.1.0\n");
}

/// The control for every "launches nothing" check above: a valid launch of the same target does
/// create the marker, and its exit status comes back.
#[test]
fn a_valid_launch_creates_the_marker() {
    let scratch = Scratch::new("cli-usage");
    let args = [
        "--analysis=host-leaks",
        "-o",
        "out",
        "sh",
        "-c",
        "touch MARKER; exit 3",
    ]
    .map(OsStr::new);
    let output = cli_in(scratch.path(), &args);
    assert!(scratch.path().join(MARKER).exists(), "{output:?}");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
}
