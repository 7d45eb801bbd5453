//! The program sees nothing of the tool: no thread until one is needed (a single-threaded
//! program stays single-threaded, so glibc's fork-from-a-signal-handler pattern works), no
//! descriptor of the program's taken, and a missing result explained by its true reason.
//! Each test builds a real C program from tests/fixtures/hostile/ and runs it under the CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::host_leak::{clear_runtime_knobs, Overview};
use crate::util::{compile, fixture_src, output_with_timeout, Scratch, BIN};

/// Builds `tests/fixtures/hostile/{source}` into `dir`.
fn build(dir: &Path, source: &str) -> PathBuf {
    let exe = dir.join(Path::new(source).file_stem().unwrap());
    let src = fixture_src("hostile").join(source);
    compile(
        "gcc",
        &[
            "-O1",
            "-g",
            src.to_str().unwrap(),
            "-o",
            exe.to_str().unwrap(),
        ],
    );
    exe
}

/// `program args` without the tool, in `dir`.
fn plain(dir: &Path, program: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(dir).env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut cmd);
    output_with_timeout(cmd)
}

/// The command `msmemscope {tool} -o {out} program args`, run in `dir`.
fn traced_command(dir: &Path, tool: &[&str], out: &Path, program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(tool)
        .arg("-o")
        .arg(out)
        .arg(program)
        .args(args)
        .current_dir(dir)
        .env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut cmd);
    cmd
}

fn traced(dir: &Path, tool: &[&str], out: &Path, program: &Path, args: &[&str]) -> Output {
    output_with_timeout(traced_command(dir, tool, out, program, args))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The modes a launched run has: the event dump (default) and the host-leak window.
const MODES: [&[&str]; 2] = [&[], &["--analysis=host-leaks"]];

/// A single-threaded program reads `Threads: 1` in its own status under every mode: the
/// runtime starts no thread of its own unless one is needed.
#[test]
fn a_single_threaded_program_reads_one_thread() {
    let scratch = Scratch::new("threads");
    let exe = build(scratch.path(), "threads_status.c");
    let alone = plain(scratch.path(), &exe, &[]);
    assert_eq!(text(&alone.stdout), "Threads:\t1\n");
    for tool in MODES {
        let out = traced(scratch.path(), tool, &scratch.path().join("out"), &exe, &[]);
        assert_eq!(
            text(&out.stdout),
            "Threads:\t1\n",
            "{tool:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
}

/// glibc's tst-mallocfork2 pattern (a signal handler forks while the single-threaded main loop
/// allocates) exits as without the tool under every mode, the control channel on.
#[test]
fn fork_in_a_signal_handler_under_every_mode() {
    let scratch = Scratch::new("fork-modes");
    let exe = build(scratch.path(), "fork_in_handler.c");
    let alone = plain(scratch.path(), &exe, &[]);
    assert_eq!(text(&alone.stdout), "survived the signals: 1\n");
    for tool in MODES {
        let out = traced(scratch.path(), tool, &scratch.path().join("out"), &exe, &[]);
        assert_eq!(
            text(&out.stdout),
            "survived the signals: 1\n",
            "{tool:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let host = std::fs::read_dir(scratch.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().path().join("host_leak/leak_overview_1.txt"))
        .find(|p| p.exists())
        .expect("the host-leak run's report");
    let overview = Overview::parse(&std::fs::read_to_string(host).unwrap());
    assert_eq!(overview.expect_function("leak_at_the_end").0, (2, 1800));
}

/// A server that closes every descriptor from 3 up and opens twelve listeners on 3..14 serves
/// all of its 240 clients under the tool, three runs in each mode.
#[test]
fn a_server_on_reused_descriptors_accepts_every_client() {
    let scratch = Scratch::new("listeners");
    let exe = build(scratch.path(), "many_listeners.c");
    let alone = plain(scratch.path(), &exe, &[]);
    assert_eq!(text(&alone.stdout), "accepted 240 of 240\n");
    for tool in MODES {
        for run in 0..3 {
            let out = traced(scratch.path(), tool, &scratch.path().join("out"), &exe, &[]);
            assert_eq!(
                (text(&out.stdout).as_str(), out.status.code()),
                ("accepted 240 of 240\n", Some(0)),
                "{tool:?} run {run}: {}",
                text(&out.stderr)
            );
        }
    }
}

/// The pid of the launcher's one child (the program).
fn program_pid(launcher: u32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
                .unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "the launcher started no program");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The thread count in `/proc/PID/status`.
fn threads_of(pid: i32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line["Threads:".len()..].trim().parse().unwrap()
}

/// `msmemscope --pid` reaches that server after it closed the runtime's socket: the client's
/// signal starts the runtime's thread, which makes the socket again; the server then serves
/// every client. Before the attach the program has its one thread.
#[test]
fn attach_reaches_a_server_that_closed_every_descriptor() {
    for tool in MODES {
        let scratch = Scratch::new("listeners-attach");
        let exe = build(scratch.path(), "many_listeners.c");
        let go = scratch.path().join("go");
        let mut cmd = traced_command(
            scratch.path(),
            tool,
            &scratch.path().join("out"),
            &exe,
            &[go.to_str().unwrap()],
        );
        let mut launcher = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = program_pid(launcher.id());
        // "listening" is printed once the twelve listeners are open.
        let mut stdout = launcher.stdout.take().unwrap();
        let mut first = [0u8; 10];
        std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
        assert_eq!(&first, b"listening\n");
        assert_eq!(
            threads_of(pid),
            1,
            "{tool:?}: a thread before anyone attached"
        );
        let attach = Command::new(BIN)
            .args(["--pid", &pid.to_string(), "--command", "display config"])
            .output()
            .unwrap();
        assert!(
            attach.status.success() && text(&attach.stdout).contains("\"log_level\""),
            "{tool:?}: {}{}",
            text(&attach.stdout),
            text(&attach.stderr)
        );
        std::fs::write(&go, b"").unwrap();
        let out = launcher.wait_with_output().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        assert_eq!(
            (rest.as_str(), out.status.code()),
            ("accepted 240 of 240\n", Some(0)),
            "{tool:?}: {}",
            text(&out.stderr)
        );
    }
}

/// A host-leak run whose output directory's disk is full says so (not "exit handlers"), and
/// keeps the program's exit status. Needs root (a small tmpfs is mounted for the disk).
#[test]
fn a_full_disk_is_named_as_the_reason() {
    let scratch = Scratch::new("full-disk");
    let exe = build(scratch.path(), "fills_disk.c");
    let disk = scratch.path().join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&disk)
        .output();
    if !mount.as_ref().is_ok_and(|m| m.status.success()) {
        eprintln!(
            "skipped: cannot mount a tmpfs to fill (root and mount(8) needed): {:?}",
            mount.map(|m| text(&m.stderr))
        );
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&disk);
    let filler = disk.join("filler");
    let out = traced(
        scratch.path(),
        &["--analysis=host-leaks"],
        &disk.join("out"),
        &exe,
        &[filler.to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert_eq!(text(&out.stdout), "disk full: 1\n", "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("msmemscope: no host leak report was written for the target: "))
        .unwrap_or_else(|| panic!("no line saying the report is missing:\n{stderr}"));
    assert!(line.contains("No space left on device"), "{line}");
    assert!(!line.contains("exit handlers"), "{line}");
}
