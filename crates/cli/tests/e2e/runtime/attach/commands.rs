//! Attach (docs/cli.md#attach; the host-leak interim snapshot, docs/analyses.md#windows): the real
//! `msmemscope-cli --pid` against targets that load the real runtime library, launched by
//! `msmemscope-cli --analysis=host-leaks` or preloaded as after `source msmemscope --load-api-env`
//! (tests/fixtures/attach_target.c): its commands and interactive session, malformed frames,
//! another user, the pre-checks.
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary)
//! and gcc on PATH. The security test runs a client as `nobody` through `setpriv` when the
//! tests run as root (skipped otherwise).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use msmemscope_core::config::RunConfig;

use crate::util::attach_target::{
    attach, client, euid, fixture, header, read_frame, request, session, Target, WAIT,
};
use crate::util::{msmemscope_runs, runtime_lib, Scratch, BIN, RUNTIME_LIB};

// ------------------------------------------------------------------------------------------
// The target (util/attach_target.rs) in scratch directories the `nobody` client can reach

fn open_scratch(tag: &str) -> Scratch {
    let scratch = Scratch::new(&format!("attach-{tag}"));
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    scratch
}

/// `msmemscope-cli --analysis=host-leaks -o OUT attach_target DIR`.
fn launched() -> Target {
    Target::launched(open_scratch("launched"), None)
}

/// `LD_PRELOAD=runtime attach_target DIR api CONFIG` (the program starts host-leaks).
fn api() -> Target {
    Target::api(open_scratch("api"), None)
}

fn host_leak_dir(scratch: &Path) -> PathBuf {
    let out = scratch.join("out");
    let run = msmemscope_runs(&out)
        .unwrap_or_else(|e| panic!("no {}: {e}", out.display()))
        .into_iter()
        .next()
        .expect("a run directory");
    run.join("host_leak")
}

/// The `#` site lines of an overview with the function of each site's first frame in the
/// fixture: `(function, line)`.
fn sites(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with('#') {
            continue;
        }
        let counts = line.split_once("] ").map(|(_, c)| c).unwrap_or(line);
        // The first frame line after the class line.
        let frame = lines
            .get(i + 2)
            .map(|f| f.trim().split(' ').next().unwrap_or("").to_string())
            .unwrap_or_default();
        out.push((frame, counts.to_string()));
    }
    out.sort();
    out
}

fn site_counts(text: &str, function: &str) -> String {
    let found: Vec<String> = sites(text)
        .into_iter()
        .filter(|(f, _)| f == function)
        .map(|(_, c)| c)
        .collect();
    assert_eq!(found.len(), 1, "one {function} site expected in:\n{text}");
    found.into_iter().next().unwrap()
}

fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
}

/// The parts of a final overview that must not depend on attaching: every site with its
/// counts, the totals.
fn report_facts(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let totals = [
        "Allocations tracked:",
        "Frees tracked:",
        "Pre-window frees:",
    ]
    .iter()
    .map(|p| line_starting(text, p).to_string())
    .chain(std::iter::once(
        text.lines()
            .skip_while(|l| *l != "--- Total Unfreed ---")
            .nth(1)
            .unwrap()
            .to_string(),
    ))
    .collect();
    (sites(text), totals)
}

// ------------------------------------------------------------------------------------------
// Tests

#[test]
fn interim_snapshots_show_the_leak_growing_and_leave_the_final_report_unchanged() {
    // Without attaching.
    let mut plain = launched();
    plain.go(1);
    let (plain_out, plain_scratch) = plain.finish();
    assert!(plain_out.status.success());
    let plain_report =
        std::fs::read_to_string(host_leak_dir(plain_scratch.path()).join("leak_overview_1.txt"))
            .unwrap();

    // With two interim snapshots (and the other display words) in between.
    let mut t = launched();
    let dir_meta = std::fs::symlink_metadata(t.socket().parent().unwrap()).unwrap();
    assert!(dir_meta.is_dir());
    assert_eq!(dir_meta.mode() & 0o777, 0o700, "socket directory mode");
    assert_eq!(dir_meta.uid(), euid());
    let sock_meta = std::fs::symlink_metadata(t.socket()).unwrap();
    assert_eq!(sock_meta.mode() & 0o777, 0o600, "socket mode");

    let (code, first, err) = attach(t.pid, "display host_leak summary");
    assert_eq!(code, 0, "{err}");
    assert!(
        first.starts_with(&format!(
            "====== Host Leak Overview (interim snapshot): stage=1, pid={} ======\n",
            t.pid
        )),
        "{first}"
    );
    assert!(
        line_starting(&first, "Window:").ends_with(" (interim snapshot, window open)"),
        "{first}"
    );
    assert_eq!(
        site_counts(&first, "leak_a"),
        "unfreed 10 blocks / 10000 bytes; allocated 10 / 10000 bytes; freed 0 / 0 bytes"
    );
    assert!(first.contains("--- Resident Baselines"));
    assert!(
        first.contains("Allocations tracked: 110 (16400 bytes)"),
        "{first}"
    );
    // Nothing written by a snapshot.
    assert!(!host_leak_dir(t.scratch.path()).exists());

    let (code, memory, _) = attach(t.pid, "display memory summary");
    assert_eq!(code, 0);
    for needle in [
        "VmRSS:",
        "VmHWM:",
        "VmSize:",
        "host-leak window 1: ",
        "tracing: off",
    ] {
        assert!(memory.contains(needle), "{needle} missing in {memory}");
    }
    let (code, config, _) = attach(t.pid, "display config");
    assert_eq!(code, 0);
    let config = RunConfig::from_json(&config).expect("display config is the RunConfig JSON");
    assert!(config.host_leaks());

    t.go(1);
    let (code, second, _) = attach(t.pid, "display host_leak summary");
    assert_eq!(code, 0);
    assert_eq!(
        site_counts(&second, "leak_a"),
        "unfreed 20 blocks / 20000 bytes; allocated 20 / 20000 bytes; freed 0 / 0 bytes"
    );
    assert_eq!(
        site_counts(&second, "leak_b"),
        "unfreed 5 blocks / 20480 bytes; allocated 5 / 20480 bytes; freed 0 / 0 bytes"
    );
    let socket = t.socket();
    let (out, scratch) = t.finish();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("attach_target done\n"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().next(),
        String::from_utf8_lossy(&plain_out.stdout).lines().next()
    );
    let report =
        std::fs::read_to_string(host_leak_dir(scratch.path()).join("leak_overview_1.txt")).unwrap();
    assert!(!report.contains("interim"), "{report}");
    assert_eq!(report_facts(&report), report_facts(&plain_report));
    assert!(!socket.exists(), "the socket is removed at exit");
}

#[test]
fn stop_and_start_words_close_and_open_windows_of_a_launched_run() {
    let mut t = launched();
    let (code, out, err) = attach(t.pid, "stop");
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("host-leak window 1 closed: "), "{out}");
    let first =
        std::fs::read_to_string(host_leak_dir(t.scratch.path()).join("leak_overview_1.txt"))
            .unwrap();
    assert!(first.contains("unfreed 10 blocks / 10000 bytes"), "{first}");
    assert_eq!(
        attach(t.pid, "display host_leak summary"),
        (1, "no active window\n".to_string(), String::new())
    );
    let (code, out, _) = attach(t.pid, "start");
    assert_eq!((code, out.as_str()), (0, "host-leak window 2 opened\n"));
    let (code, out, _) = attach(t.pid, "start");
    assert_eq!(code, 1, "{out}");
    t.go(1);
    let (out, scratch) = t.finish();
    assert!(out.status.success());
    let second =
        std::fs::read_to_string(host_leak_dir(scratch.path()).join("leak_overview_2.txt")).unwrap();
    assert!(
        second.starts_with("====== Host Leak Overview: stage=2,"),
        "{second}"
    );
    assert_eq!(
        site_counts(&second, "leak_a"),
        "unfreed 10 blocks / 10000 bytes; allocated 10 / 10000 bytes; freed 0 / 0 bytes"
    );
}

#[test]
fn start_and_stop_words_drive_an_api_env_process() {
    let mut t = api();
    let (code, out, err) = attach(t.pid, "stop");
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("host-leak window 1 closed: "), "{out}");
    assert!(host_leak_dir(t.scratch.path())
        .join("leak_overview_1.txt")
        .is_file());
    let (code, out, _) = attach(t.pid, "display host_leak summary");
    assert_eq!((code, out.as_str()), (1, "no active window\n"));
    let (code, out, _) = attach(t.pid, "stop");
    assert_eq!(code, 1, "{out}");
    let (code, out, _) = attach(t.pid, "start");
    assert_eq!((code, out.as_str()), (0, "host-leak window 2 opened\n"));
    t.go(1);
    let (code, out, _) = attach(t.pid, "stop");
    assert_eq!(code, 0);
    assert!(out.starts_with("host-leak window 2 closed: "), "{out}");
    let dir = host_leak_dir(t.scratch.path());
    let second = std::fs::read_to_string(dir.join("leak_overview_2.txt")).unwrap();
    assert_eq!(
        site_counts(&second, "leak_a"),
        "unfreed 10 blocks / 10000 bytes; allocated 10 / 10000 bytes; freed 0 / 0 bytes"
    );
    assert_eq!(
        site_counts(&second, "leak_b"),
        "unfreed 5 blocks / 20480 bytes; allocated 5 / 20480 bytes; freed 0 / 0 bytes"
    );
    let (code, _, _) = attach(t.pid, "step");
    assert_eq!(code, 0);
    let (out, _scratch) = t.finish();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_interactive_session_reads_words_until_exit() {
    let t = launched();
    let mut child = session(t.pid, Stdio::piped());
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"help\n\ndisplay host_leak summary\nfrobnicate\nexit\nhelp\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.matches("msmemscope> ").count(), 5, "{stdout}");
    assert_eq!(
        stdout.matches("display host_leak summary  ").count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains("(interim snapshot, window open)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("unknown command \"frobnicate\""),
        "{stderr}"
    );
}

fn raw(t: &Target) -> UnixStream {
    let s = UnixStream::connect(t.socket()).expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

#[test]
fn malformed_frames_get_errors_and_the_target_runs_on() {
    let mut plain = launched();
    plain.go(1);
    let (plain_out, _plain_scratch) = plain.finish();

    let t = launched();
    let error_of = |frame: &[u8]| -> String {
        let mut s = raw(&t);
        s.write_all(frame).unwrap();
        let (kind, v) = read_frame(&mut s);
        assert_eq!(kind, 3, "an error frame for {frame:?}: {v}");
        v["error"].as_str().unwrap().to_string()
    };
    assert_eq!(
        error_of(&header(9, 1, 2)),
        "unsupported frame version 9 (expected 1)"
    );
    assert_eq!(
        error_of(&header(1, 1, u32::MAX)),
        "payload of 4294967295 bytes exceeds the 64 KiB limit"
    );
    assert!(error_of(&request(b"{\"command\": garbage")).starts_with("bad request JSON"));
    assert_eq!(error_of(&request(b"\xff\xfe\xfd")), "payload is not UTF-8");
    assert!(error_of(&request(b"[1,2]")).starts_with("bad request:"));
    assert_eq!(
        error_of(&request(br#"{"command":"frobnicate now"}"#)),
        "unknown command \"frobnicate now\"; `help` lists the words"
    );
    let mut wrong_type = header(1, 2, 2);
    wrong_type.extend_from_slice(b"{}");
    assert!(error_of(&wrong_type).starts_with("unexpected frame type 2"));

    // After an error the connection goes on (a frame of the wrong type, then a request).
    let mut s = raw(&t);
    s.write_all(&wrong_type).unwrap();
    assert_eq!(read_frame(&mut s).0, 3);
    s.write_all(&request(br#"{"command":"help"}"#)).unwrap();
    let (kind, v) = read_frame(&mut s);
    assert_eq!(kind, 2);
    assert_eq!(v["status"], 0);
    assert!(v["output"]
        .as_str()
        .unwrap()
        .contains("display host_leak summary"));
    drop(s);

    // Truncated frames: half a header, a payload cut short; then garbage bytes.
    let mut s = raw(&t);
    s.write_all(&[1, 1, 0, 0, 0]).unwrap();
    drop(s);
    let mut s = raw(&t);
    let mut cut = header(1, 1, 100);
    cut.extend_from_slice(b"{\"command\":");
    s.write_all(&cut).unwrap();
    drop(s);
    let mut s = raw(&t);
    s.write_all(&[0xAB; 4096]).unwrap();
    let _ = read_frame(&mut s);
    drop(s);

    // Still answering, and its output and report are those of an untouched run.
    let (code, out, _) = attach(t.pid, "help");
    assert_eq!(code, 0);
    assert!(out.contains("display memory summary"));
    let (out, scratch) = t.finish();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, plain_out.stdout);
    let report =
        std::fs::read_to_string(host_leak_dir(scratch.path()).join("leak_overview_1.txt")).unwrap();
    assert!(
        report.contains("unfreed 20 blocks / 20000 bytes"),
        "{report}"
    );
}

#[test]
fn another_user_is_refused() {
    if euid() != 0 {
        eprintln!(
            "skipped: needs root (to run the client as another user); uid {}",
            euid()
        );
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: needs setpriv (util-linux) to run the client as another user");
        return;
    }
    let t = launched();
    // The client's own pre-check, as nobody.
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
    let (code, _, err) = client(cmd, t.pid, Some("help"));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "msmemscope: process {} belongs to uid 0, not to you (uid 65534): only its user or root may attach\n",
            t.pid
        )
    );
    // The server's check: a nobody peer that can reach the socket (file permissions
    // overridden) is still refused by its credentials.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=+dac_override",
            "--ambient-caps=+dac_override",
        ])
        .arg(fixture())
        .arg("connect")
        .arg(t.socket())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        "type=3 {\"error\":\"permission denied: uid 65534 may not attach to a process of uid 0\"}\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same raw client as root is served.
    let out = Command::new(fixture())
        .arg("connect")
        .arg(t.socket())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("type=2 {"), "{stdout}");
    assert!(stdout.contains("display host_leak summary"), "{stdout}");
    let (out, _) = t.finish();
    assert!(out.status.success());
}

#[test]
fn prechecks_name_what_is_missing() {
    let (code, out, err) = attach(2_147_483_646, "help");
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(err, "msmemscope: no process with pid 2147483646\n");

    let mut plain = Command::new("sleep")
        .arg("30")
        .env_remove("LD_PRELOAD")
        .spawn()
        .unwrap();
    let pid = plain.id() as i32;
    let (code, _, err) = attach(pid, "help");
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "msmemscope: process {pid} has not loaded {RUNTIME_LIB}: start it with msmemscope, or \
             after `source msmemscope --load-api-env`\n"
        )
    );
    let _ = plain.kill();
    let _ = plain.wait();

    // The library preloaded (as in a shell after --load-api-env) but never started: no listener.
    let mut preloaded = Command::new("sleep")
        .arg("30")
        .env("LD_PRELOAD", runtime_lib())
        .spawn()
        .unwrap();
    let pid = preloaded.id() as i32;
    let start = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains(RUNTIME_LIB)
    {
        assert!(start.elapsed() < WAIT);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, _, err) = attach(pid, "display host_leak summary");
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!(
            "msmemscope: process {pid} has {RUNTIME_LIB} but no control listener (msmemscope_ctrl)"
        )),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1);
    let _ = preloaded.kill();
    let _ = preloaded.wait();
}

#[test]
fn ctrl_c_ends_the_client_with_130() {
    let t = launched();
    let mut child = session(t.pid, Stdio::null());
    // Wait for the prompt, then interrupt the session waiting for a line.
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"msmemscope> ") {
        assert_eq!(stdout.read(&mut byte).unwrap(), 1, "no prompt");
        seen.push(byte[0]);
    }
    // SAFETY: signalling the child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(child.wait().unwrap().code(), Some(130));
    drop(t);
}
