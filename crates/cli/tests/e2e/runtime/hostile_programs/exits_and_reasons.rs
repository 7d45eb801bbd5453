//! How a program ends, and what the tool says when it cannot do its part: exec right after
//! the last events, signals (fork in a handler, a hung program sent SIGTERM), and the reasons
//! given for a program the loader keeps the runtime out of, a run directory deleted, an output
//! path refused, a process that cannot be attached to.

use std::process::Command;

use super::{build, build_with_mstx, Pair, SmallDisk};
use crate::util::host_leak::clear_runtime_knobs;
use crate::util::{venv_python, Scratch, BIN};

// ------------------------------------------------------------------------------------------
// Exec

/// A program that execs right after its last events: they are in the dump (the exec waits for
/// the writer), and the program's output and status are those of the image it became.
#[test]
fn events_before_an_exec_reach_the_dump() {
    let dir = Scratch::new("exec-bin");
    let exe = build_with_mstx(dir.path(), "marks_then_exec.c");
    let run = Pair::run(&["-q"], &[exe.to_str().unwrap()], &[]);
    assert_eq!(run.dump_lines_with("before exec "), 500, "{}", run.stderr());
}

/// The same from Python: marks (through the nvtx package) and then `os.execv` at once.
#[test]
fn python_marks_before_os_execv_reach_the_dump() {
    let python = venv_python();
    let script = "import os\n\
                  import nvtx\n\
                  for i in range(300):\n    nvtx.mark(message=f'python mark {i}')\n\
                  print('exec now', flush=True)\n\
                  os.execv('/bin/true', ['true'])\n";
    let run = Pair::run(&["-q"], &[python.to_str().unwrap(), "-c", script], &[]);
    assert_eq!(run.dump_lines_with("python mark "), 300, "{}", run.stderr());
}

// ------------------------------------------------------------------------------------------
// Signals

/// glibc's fork-in-a-signal-handler pattern is safe only in a single-threaded process. In
/// host-leak mode with the control channel off the runtime adds no thread at all, so the
/// program runs as without the tool, and its report is written (README: what stays
/// multi-threaded and why).
#[test]
fn fork_in_a_signal_handler_with_no_runtime_thread() {
    let dir = Scratch::new("fork-bin");
    let exe = build(dir.path(), "fork_in_handler.c", &[]);
    let run = Pair::run(
        &["--analysis=host-leaks"],
        &[exe.to_str().unwrap()],
        &[("MSMEMSCOPE_NO_CONTROL", "1")],
    );
    assert_eq!(
        String::from_utf8_lossy(&run.traced.stdout),
        "survived the signals: 1\n"
    );
    assert_eq!(
        run.overview().expect_function("leak_at_the_end").0,
        (2, 1800)
    );
}

/// The same pattern with the runtime's thread present can deadlock inside glibc (its fork takes
/// the malloc locks in a multi-threaded process). Such a hung program still ends when it is
/// sent SIGTERM: the end of the run gets a deadline (`MSMEMSCOPE_SIGNAL_DEADLINE_S`), then the
/// signal's default action happens, and the launcher ends the same way.
#[test]
fn sigterm_ends_a_hung_program() {
    use std::os::unix::process::ExitStatusExt;
    let dir = Scratch::new("hung-bin");
    let exe = build(dir.path(), "fork_in_handler.c", &[]);
    let scratch = Scratch::new("hung");
    let mut cmd = Command::new(BIN);
    cmd.arg("--analysis=host-leaks")
        .arg("-o")
        .arg(scratch.path().join("out"))
        .arg(&exe)
        .current_dir(scratch.path())
        .env_remove("LD_PRELOAD")
        .env("MSMEMSCOPE_SIGNAL_DEADLINE_S", "2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    clear_runtime_knobs(&mut cmd);
    let mut launcher = cmd.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    // SAFETY: signals the launcher this test started (it passes SIGTERM on to the program).
    unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) };
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > crate::util::RUN_TIMEOUT {
            let _ = launcher.kill();
            panic!("the hung program did not end after SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Exit 0 when no deadlock happened this time; otherwise the SIGTERM, as without the tool.
    assert!(
        status.code() == Some(0) || status.signal() == Some(libc::SIGTERM),
        "{status:?}"
    );
}

// ------------------------------------------------------------------------------------------
// Clear reasons

/// A program the runtime cannot be preloaded into gets the loader's reason, not "_exit or exec":
/// a static binary, a setuid binary (secure execution drops LD_PRELOAD).
#[test]
fn programs_the_loader_keeps_the_runtime_out_of() {
    let dir = Scratch::new("loader-bin");
    let exe = build(dir.path(), "plain_hello.c", &["-static"]);
    let run = Pair::host_leaks(&exe);
    assert!(
        run.stderr().contains(&format!(
            "no host leak report was written for the target: {} is statically linked",
            exe.display()
        )),
        "{}",
        run.stderr()
    );

    let setuid_dir = dir.path().join("setuid");
    std::fs::create_dir(&setuid_dir).unwrap();
    let exe = build(&setuid_dir, "plain_hello.c", &[]);
    // Owned by nobody, setuid: root running it changes its effective uid, so the loader runs
    // it in secure mode.
    let chown = Command::new("chown")
        .args(["nobody"])
        .arg(&exe)
        .status()
        .unwrap();
    assert!(
        chown.success(),
        "this test changes a file's owner (as root)"
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // The directories on the way must let nobody run it.
    for d in [dir.path(), setuid_dir.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = Pair::run(&[], &[exe.to_str().unwrap()], &[]);
    assert!(
        run.stderr().contains(&format!(
            "no events were recorded: {} is setuid/setgid, so the loader ignores LD_PRELOAD",
            exe.display()
        )),
        "{}",
        run.stderr()
    );
}

/// The run directory removed while the program runs: said as such.
#[test]
fn a_run_directory_deleted_during_the_run() {
    let dir = Scratch::new("deleted-bin");
    let exe = build(dir.path(), "waits_for_go.c", &[]);
    let scratch = Scratch::new("deleted");
    let out = scratch.path().join("out");
    let mut cmd = Command::new(BIN);
    cmd.arg("-o")
        .arg(&out)
        .arg(&exe)
        .current_dir(scratch.path())
        .env_remove("LD_PRELOAD")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    clear_runtime_knobs(&mut cmd);
    let child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_dir(&out).map_or(true, |mut d| d.next().is_none()) {
        assert!(started.elapsed().as_secs() < 60, "no run directory");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::write(scratch.path().join("go"), b"").unwrap();
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(String::from_utf8_lossy(&done.stdout), "went\n");
    assert_eq!(done.status.code(), Some(0));
    assert!(
        stderr.contains(
            "msmemscope: no events were recorded: the run directory was deleted while the program ran"
        ),
        "{stderr}"
    );
}

/// An output path the run cannot be made in, or too long for the run's files: refused before
/// the program starts, exit status 2, one line saying why.
#[test]
fn output_paths_refused_up_front() {
    let scratch = Scratch::new("outpath");
    let long = scratch.path().join("d".repeat(250)).join("e".repeat(250));
    let mut long_path = long.clone();
    for _ in 0..16 {
        long_path = long_path.join("f".repeat(250));
    }
    let run = Command::new(BIN)
        .arg("-o")
        .arg(&long_path)
        .arg("true")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("msmemscope: --output-path is ")
            && stderr.contains("would pass the system's path limit (4095 bytes)"),
        "{stderr}"
    );
    assert!(!long.exists(), "nothing made for a refused path");

    let ro = scratch.path().join("ro");
    let _disk = SmallDisk::mount(&ro, "ro,size=16k");
    let run = Command::new(BIN)
        .arg("-o")
        .arg(&ro)
        .arg("true")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("Read-only file system") && stderr.contains("choose another --output-path"),
        "{stderr}"
    );
}

/// Attaching to a process that has exited (a zombie) or is stopped says so at once.
#[test]
fn attach_to_exited_and_stopped_processes() {
    // What `--pid=PID --command=help` says on stderr.
    let attach_help = |pid: u32| {
        let run = Command::new(BIN)
            .arg(format!("--pid={pid}"))
            .arg("--command=help")
            .output()
            .unwrap();
        String::from_utf8_lossy(&run.stderr).into_owned()
    };
    let mut zombie = Command::new("true").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let stderr = attach_help(zombie.id());
    assert!(
        stderr.contains(&format!("process {} has exited", zombie.id())),
        "{stderr}"
    );
    zombie.wait().unwrap();

    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    // SAFETY: stops the child this test started.
    unsafe { libc::kill(sleeper.id() as i32, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let stderr = attach_help(sleeper.id());
    assert!(
        stderr.contains(&format!("process {} is stopped", sleeper.id())),
        "{stderr}"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
