//! The launcher passes signals on to the program and reports every host-leak window: the real
//! `msmemscope-cli` runs tests/fixtures/signals/target.c (built here with gcc) and the tests
//! signal the launcher the way batch schedulers, containers and terminals do.
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary)
//! and gcc on PATH.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::util::host_leak::*;
use crate::util::{built_once, spawn_collecting, Readers, Scratch, BIN, RUN_TIMEOUT};

/// A signalled program must be gone within this long (it waits 30 s on its own).
const PROMPT: Duration = Duration::from_secs(10);

fn target() -> PathBuf {
    // -O0 keeps `leak` a frame of its own in the reports.
    built_once(
        "launcher-signals",
        "signals/target.c",
        "signals_target",
        &["-O0", "-g"],
        &["-ldl"],
    )
}

/// The CLI running the target: `tool_args` before it, `-o SCRATCH/out`, the host-leak knobs
/// cleared as `run_tool_cmd` does.
fn cli(scratch: &Scratch, tool_args: &[&str], target_args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(tool_args)
        .arg("-o")
        .arg(scratch.path().join("out"))
        .arg(target())
        .args(target_args)
        .current_dir(scratch.path())
        .env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut cmd);
    cmd
}

/// A launcher started in the background, its output collected while the test signals it.
struct Launched {
    /// Handed to the finished [`Run`].
    scratch: Option<Scratch>,
    child: Child,
    /// The process group to kill when the test gives up (the launcher's own group).
    group: i32,
    ready: PathBuf,
    readers: Option<Readers>,
    /// The target's pid once it said it is ready (killed on drop if it outlived the test).
    target_pid: Option<i32>,
}

impl Launched {
    /// `mode` is a target mode that takes the ready file as its argument.
    fn start(tool_args: &[&str], mode: &str) -> Launched {
        Self::start_with(tool_args, mode, |cmd| {
            cmd.process_group(0);
        })
    }

    fn start_with(tool_args: &[&str], mode: &str, setup: impl FnOnce(&mut Command)) -> Launched {
        let scratch = Scratch::new("signals");
        let ready = scratch.path().join("ready");
        let mut cmd = cli(&scratch, tool_args, &[mode, ready.to_str().unwrap()]);
        // A signal ignored here (a suite started under `nohup` ignores SIGHUP; a background job
        // of a shell without job control, SIGINT and SIGQUIT) stays ignored in the launcher, as
        // POSIX wants: these tests send them, so the launcher starts with the defaults.
        // SAFETY: only `signal`, which is async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        setup(&mut cmd);
        let (child, readers) = spawn_collecting(&mut cmd);
        Launched {
            scratch: Some(scratch),
            group: child.id() as i32,
            child,
            ready,
            readers: Some(readers),
            target_pid: None,
        }
    }

    fn launcher_pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the target to be ready; returns its pid (checked to be the launcher's child).
    fn wait_ready(&mut self) -> i32 {
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.ready) {
                let mut words = text.split_whitespace().map(|w| w.parse::<i32>().unwrap());
                let (pid, ppid) = (words.next().unwrap(), words.next().unwrap());
                assert_eq!(ppid, self.launcher_pid(), "the target's parent");
                self.target_pid = Some(pid);
                return pid;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("the launcher ended ({st:?}) before the target was ready");
            }
            assert!(
                start.elapsed() < RUN_TIMEOUT,
                "the target never became ready"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal_launcher(&self, sig: i32) {
        // SAFETY: signalling the launcher this test started (not reaped yet, so its pid is ours).
        assert_eq!(unsafe { libc::kill(self.launcher_pid(), sig) }, 0);
    }

    /// Waits for the launcher (at most `limit`); then the target must be gone already.
    fn finish(mut self, limit: Duration) -> (Run, Duration) {
        let start = Instant::now();
        let status: ExitStatus = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > limit {
                // SAFETY: signalling the process group this test created.
                unsafe { libc::kill(-self.group, libc::SIGKILL) };
                let _ = self.child.wait();
                panic!("the launcher did not end within {limit:?} of the signal");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = start.elapsed();
        if let Some(pid) = self.target_pid {
            assert!(
                !target_alive(pid),
                "the target {pid} outlived the launcher (status {status:?})"
            );
        }
        let out = self.readers.take().unwrap().output(status);
        let scratch = self.scratch.take().unwrap();
        (Run { scratch, out }, took)
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if let Some(pid) = self.target_pid {
            if target_alive(pid) {
                // SAFETY: `target_alive` checked that this pid still runs our fixture.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: signalling the process group this test created.
            unsafe { libc::kill(-self.group, libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// Whether `pid` is a live (not zombie) process running the fixture.
fn target_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    if state == Some('Z') {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c).contains(target().file_name().unwrap().to_str().unwrap())
        })
        .unwrap_or(false)
}

fn launcher_log(run: &Run) -> String {
    std::fs::read_to_string(run.run_dir().join("msmemscope_logs/launcher.log")).unwrap_or_default()
}

fn assert_killed_by(run: &Run, sig: i32, what: &str) {
    assert_eq!(
        run.out.status.signal(),
        Some(sig),
        "{what}: launcher status {:?}\nstderr:\n{}",
        run.out.status,
        run.stderr()
    );
}

// ------------------------------------------------------------------------------------------
// 1. Signals to the launcher reach the program

fn sigterm_ends_the_program(tool_args: &[&str]) -> Run {
    let mut l = Launched::start(tool_args, "wait");
    l.wait_ready();
    l.signal_launcher(libc::SIGTERM);
    let (run, took) = l.finish(PROMPT);
    assert!(took < PROMPT, "took {took:?}");
    assert_killed_by(
        &run,
        libc::SIGTERM,
        "target killed by the forwarded SIGTERM",
    );
    assert!(
        launcher_log(&run).contains("signals passed on to the target: SIGTERM x1"),
        "launcher.log:\n{}",
        launcher_log(&run)
    );
    run
}

#[test]
fn sigterm_to_the_launcher_ends_an_event_dump_run() {
    sigterm_ends_the_program(&[]);
}

#[test]
fn sigterm_to_the_launcher_ends_a_host_leaks_run() {
    let run = sigterm_ends_the_program(&["--analysis=host-leaks"]);
    report_or_signal_named(&run, libc::SIGTERM, "SIGTERM");
}

/// After a signal death the launcher prints the overview if the runtime managed to write one
/// (it may close the window on a terminating signal), else says which signal it was; never
/// that exit handlers were skipped.
fn report_or_signal_named(run: &Run, sig: i32, name: &str) {
    let stderr = run.stderr();
    let overview = run.run_dir().join("host_leak/leak_overview_1.txt");
    if overview.is_file() {
        let want = format!("msmemscope: host leak report: {}\n", overview.display());
        assert!(stderr.ends_with(&want), "stderr:\n{stderr}");
        assert!(
            stderr.contains(run.overview_text().trim_end()),
            "stderr:\n{stderr}"
        );
    } else {
        let want = format!(
            "msmemscope: no host leak report was written for the target: it was killed by \
             signal {sig} ({name}); run directory {}\n",
            run.run_dir().display()
        );
        assert!(stderr.ends_with(&want), "stderr:\n{stderr}");
    }
    assert!(!stderr.contains("exit handlers"), "stderr:\n{stderr}");
}

#[test]
fn program_catching_sigterm_passes_its_exit_code_through() {
    let mut l = Launched::start(&["--analysis=host-leaks"], "catch");
    l.wait_ready();
    l.signal_launcher(libc::SIGTERM);
    let (run, _) = l.finish(PROMPT);
    assert_exited(&run.out, 3, "target exits 3 from its SIGTERM handler");
    assert_eq!(run.stdout(), format!("caught {}\n", libc::SIGTERM));
    // It ended through exit(): its window closed and the launcher printed the overview.
    let path = run.run_dir().join("host_leak/leak_overview_1.txt");
    assert!(
        run.stderr().ends_with(&format!(
            "msmemscope: host leak report: {}\n",
            path.display()
        )),
        "stderr:\n{}",
        run.stderr()
    );
    run.overview();
}

#[test]
fn sighup_to_the_launcher_is_passed_on() {
    let mut l = Launched::start(&[], "catch");
    l.wait_ready();
    l.signal_launcher(libc::SIGHUP);
    let (run, _) = l.finish(PROMPT);
    assert_exited(&run.out, 3, "target exits 3 from its SIGHUP handler");
    assert_eq!(run.stdout(), format!("caught {}\n", libc::SIGHUP));
}

#[test]
fn sighup_kills_the_program_and_the_launcher_alike() {
    let mut l = Launched::start(&[], "wait");
    l.wait_ready();
    l.signal_launcher(libc::SIGHUP);
    let (run, _) = l.finish(PROMPT);
    assert_killed_by(&run, libc::SIGHUP, "target killed by the forwarded SIGHUP");
}

/// SIGINT/SIGQUIT sent by another process (kill) are passed on, once.
fn sent_interactive_signal_is_passed_on(sig: i32, want: &str) {
    let mut l = Launched::start(&["--analysis=host-leaks"], "count");
    l.wait_ready();
    l.signal_launcher(sig);
    let (run, _) = l.finish(PROMPT);
    assert_exited(&run.out, 0, "counting target");
    assert_eq!(run.stdout(), want);
    run.overview();
}

#[test]
fn sigint_from_a_process_is_passed_on() {
    sent_interactive_signal_is_passed_on(libc::SIGINT, "SIGINT x1 SIGQUIT x0\n");
}

#[test]
fn sigquit_from_a_process_is_passed_on() {
    sent_interactive_signal_is_passed_on(libc::SIGQUIT, "SIGINT x0 SIGQUIT x1\n");
}

#[test]
fn sigint_from_a_process_kills_the_program_and_the_launcher_alike() {
    let mut l = Launched::start(&[], "wait");
    l.wait_ready();
    l.signal_launcher(libc::SIGINT);
    let (run, _) = l.finish(PROMPT);
    assert_killed_by(&run, libc::SIGINT, "target killed by the forwarded SIGINT");
}

/// A pseudo-terminal whose slave becomes the launcher's controlling terminal.
struct Pty {
    master: std::fs::File,
    slave: std::ffi::CString,
}

impl Pty {
    fn open() -> Pty {
        use std::os::fd::FromRawFd;
        // SAFETY: opening the pty multiplexer; O_CLOEXEC keeps the master out of other tests'
        // children.
        let fd = unsafe {
            libc::open(
                c"/dev/ptmx".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0, "/dev/ptmx: {}", std::io::Error::last_os_error());
        let mut name = [0 as libc::c_char; 128];
        // SAFETY: `fd` is a pty master; `name` holds 128 bytes.
        unsafe {
            assert_eq!(libc::grantpt(fd), 0);
            assert_eq!(libc::unlockpt(fd), 0);
            assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        }
        // SAFETY: ptsname_r wrote a NUL-terminated path; `fd` is ours to own.
        let slave = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_owned();
        Pty {
            // SAFETY: `fd` was just opened and nothing else owns it.
            master: unsafe { std::fs::File::from_raw_fd(fd) },
            slave,
        }
    }
}

/// The terminal's Ctrl-C / Ctrl-\ reach the program (it shares the launcher's process group)
/// and are not passed on again; the launcher survives them and passes the status through.
fn terminal_key_reaches_the_program_once(key: u8, want: &str) {
    use std::io::Write;
    let pty = Pty::open();
    let slave = pty.slave.clone();
    let mut l = Launched::start_with(&["--analysis=host-leaks"], "count", move |cmd| {
        // SAFETY: between fork and exec only setsid/open/ioctl run (async-signal-safe); the
        // launcher leads a new session whose controlling terminal is the pty's slave, so its
        // process group is the terminal's foreground group.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
                if fd < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    l.wait_ready();
    let mut master = &pty.master;
    master.write_all(&[key]).unwrap();
    let (run, _) = l.finish(PROMPT);
    assert_exited(&run.out, 0, "counting target");
    assert_eq!(run.stdout(), want);
    let log = launcher_log(&run);
    assert!(
        !log.contains("signals passed on"),
        "a terminal's signal was passed on again:\n{log}"
    );
    run.overview();
}

#[test]
fn terminal_ctrl_c_reaches_the_program_once() {
    terminal_key_reaches_the_program_once(0x03, "SIGINT x1 SIGQUIT x0\n");
}

#[test]
fn terminal_ctrl_backslash_reaches_the_program_once() {
    terminal_key_reaches_the_program_once(0x1c, "SIGINT x0 SIGQUIT x1\n");
}

// ------------------------------------------------------------------------------------------
// 2. Every window's overview, and why there is none

fn run_target(target_args: &[&str]) -> Run {
    run_tool_cmd(&[], &[], target().to_str().unwrap(), target_args)
}

/// `leak`'s unfreed (blocks, bytes) in an overview.
fn leak_site(ov: &Overview) -> (u64, u64) {
    ov.expect_function("leak").0
}

#[test]
fn every_window_overview_is_printed_in_stage_order() {
    let run = run_target(&["windows", "3"]);
    assert_exited(&run.out, 0, "three windows");
    let stderr = run.stderr();
    let mut at = 0;
    for stage in 1..=3u32 {
        let text = run.overview_text_of(stage);
        assert!(
            text.starts_with(&format!("====== Host Leak Overview: stage={stage},")),
            "{text}"
        );
        assert_eq!(
            leak_site(&Overview::parse(&text)),
            (1, 1000 * stage as u64),
            "window {stage}:\n{text}"
        );
        // The overview, then its path, after the previous window's.
        let path = run
            .run_dir()
            .join(format!("host_leak/leak_overview_{stage}.txt"));
        let block = format!("{text}msmemscope: host leak report: {}\n", path.display());
        let found = stderr[at..]
            .find(&block)
            .unwrap_or_else(|| panic!("window {stage} not printed in order:\n{stderr}"));
        at += found + block.len();
    }
    assert_eq!(
        at,
        stderr.len(),
        "stderr must end with the last report:\n{stderr}"
    );
    assert!(!stderr.contains("no host leak report"), "{stderr}");
}

#[test]
fn overviews_of_closed_windows_are_printed_when_the_program_is_killed() {
    let run = run_target(&["windows-kill"]);
    assert_killed_by(&run, libc::SIGKILL, "target killed itself");
    let ov = run.overview();
    assert_eq!(leak_site(&ov), (1, 1000));
    let path = run.run_dir().join("host_leak/leak_overview_1.txt");
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!(
            "msmemscope: host leak report: {}\n",
            path.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("no host leak report"), "{stderr}");
    assert!(!stderr.contains("exit handlers"), "{stderr}");
}

#[test]
fn abort_is_named_as_a_signal_not_as_skipped_exit_handlers() {
    let prog = built_once(
        "launcher-signals-abort",
        "host_leaks.c",
        "host_leaks",
        &["-O2", "-g", "-pthread"],
        &["-ldl"],
    );
    let run = run_tool_cmd(&[], &[], prog.to_str().unwrap(), &["abort"]);
    assert_killed_by(&run, libc::SIGABRT, "abort");
    report_or_signal_named(&run, libc::SIGABRT, "SIGABRT");
}

#[test]
fn no_overview_after_underscore_exit_says_exit_handlers_did_not_run() {
    let run = run_target(&["underscore-exit"]);
    assert_exited(&run.out, 0, "_exit(0)");
    let stderr = run.stderr();
    let want = format!(
        "msmemscope: no host leak report was written for the target: it ended without running \
         exit handlers (_exit, or exec into a program without the runtime); run directory {}\n",
        run.run_dir().display()
    );
    assert!(stderr.ends_with(&want), "stderr:\n{stderr}");
}

// ------------------------------------------------------------------------------------------
// 3. Event mode with nothing unfreed

#[test]
fn event_mode_writes_a_header_only_csv_when_nothing_is_unfreed() {
    let run = run_tool_cmd(
        &["--host-leak-mode=event"],
        &[],
        target().to_str().unwrap(),
        &["free-all"],
    );
    assert_exited(&run.out, 0, "free-all");
    assert_eq!(run.stdout(), "freed everything\n");
    let ov = run.overview();
    assert_eq!(
        ov.total_unfreed,
        (0, 0),
        "the program frees everything:\n{}",
        ov.text
    );
    assert!(ov.allocations_tracked().0 >= 1500, "{}", ov.text);
    assert_eq!(ov.h("Report mode"), "event (block_detail CSV written)");
    assert_eq!(
        run.host_leak_files(),
        [
            "block_detail_1.csv",
            "leak_overview_1.txt",
            "leak_sites_1.json"
        ]
    );
    let csv = std::fs::read_to_string(run.run_dir().join("host_leak/block_detail_1.csv")).unwrap();
    assert_eq!(
        csv, "addr,size,alloc_ts,Call Stack(C),Call Stack(Python),Domain\r\n",
        "header only"
    );
}
