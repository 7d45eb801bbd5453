//! Arguments and settings the CLI cannot use, beyond the option parser's one-line contract
//! (usage_errors.rs): a program that cannot run exits 127 or 126 and leaves no run directory,
//! a bad `MSMEMSCOPE_HOST_*` knob is named with its range while the run goes on, `--pid`
//! refuses an unknown word and ignored options before connecting, a huge bad value is cut in
//! the message, and an output path that is a file is named as the option.

use std::process::Command;

use crate::util::{Scratch, BIN};

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_missing_program_exits_127_and_leaves_no_run_directory() {
    let scratch = Scratch::new("missing");
    let out = scratch.path().join("out");
    let run = Command::new(BIN)
        .arg("-o")
        .arg(&out)
        .arg(scratch.path().join("no-such-program"))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("msmemscope: cannot run "), "{stderr}");
    assert_eq!(entries(&out), Vec::<String>::new());
}

#[test]
fn a_program_that_is_not_executable_exits_126_and_leaves_no_run_directory() {
    let scratch = Scratch::new("noexec");
    let out = scratch.path().join("out");
    let prog = scratch.path().join("data.txt");
    std::fs::write(&prog, "not a program\n").unwrap();
    let run = Command::new(BIN)
        .arg("--analysis=host-leaks")
        .arg("-o")
        .arg(&out)
        .arg(&prog)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(126));
    assert_eq!(entries(&out), Vec::<String>::new());
    assert_eq!(std::fs::read(&prog).unwrap(), b"not a program\n");
}

#[test]
fn a_bad_host_knob_is_named_with_its_range_and_the_run_goes_on() {
    let scratch = Scratch::new("knob");
    let run = Command::new(BIN)
        .args(["--analysis=host-leaks", "-q", "-o"])
        .arg(scratch.path().join("out"))
        .arg("true")
        .env("MSMEMSCOPE_HOST_BEAT_MS", "fast")
        .env_remove("MSMEMSCOPE_HOST_TOP_N")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        stderr.lines().next().unwrap_or(""),
        "msmemscope: warning: MSMEMSCOPE_HOST_BEAT_MS=\"fast\" is not a whole number \
         (10 to 60000 milliseconds); using the default 1000",
        "{stderr}"
    );
}

fn usage_error(args: &[&str]) -> String {
    let run = Command::new(BIN).args(args).output().unwrap();
    assert_eq!(run.status.code(), Some(2), "{args:?}: {run:?}");
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn attach_refuses_an_unknown_word_and_ignored_options_before_connecting() {
    // A process that exists but has no runtime: rejecting the word must not depend on it.
    let pid = std::process::id().to_string();
    assert_eq!(
        usage_error(&["--pid", &pid, "--command", "xyz"]),
        "msmemscope: unknown --command word \"xyz\"; accepted: start, stop, step, display config, \
         display memory summary, display host_leak summary, help, exit\n"
    );
    assert_eq!(
        usage_error(&["--pid", &pid, "--analysis=leaks", "--command", "help"]),
        "msmemscope: --analysis is not used with --pid: the running process keeps the options it \
         started with\n"
    );
}

#[test]
fn a_huge_bad_value_is_cut_in_the_message() {
    let value = "x".repeat(120_000);
    let line = usage_error(&[&format!("--level={value}"), "true"]);
    assert!(line.len() < 300, "{} bytes", line.len());
    assert!(
        line.contains("… (120000 characters in all)\": accepted values are op, kernel"),
        "{line}"
    );
}

#[test]
fn an_output_path_that_is_a_file_is_named_as_the_option() {
    let scratch = Scratch::new("outfile");
    let file = scratch.path().join("plain");
    std::fs::write(&file, "keep").unwrap();
    let run = Command::new(BIN)
        .arg(format!("--output-path={}", file.display()))
        .arg("true")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&run.stderr),
        format!(
            "msmemscope: invalid --output-path \"{}\": it exists and is not a directory; \
             accepted values are a non-empty directory path\n",
            file.display()
        )
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}
