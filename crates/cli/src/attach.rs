//! `msmemscope --pid PID [--command "WORDS"]`: the client of the runtime's control channel
//! (docs/cli.md#attach; the server is crates/runtime/src/control/).
//!
//! Before connecting it checks, in order, that the process exists, belongs to the user (unless
//! we are root), has the runtime library mapped and has the listener thread, and says which
//! check failed. A runtime starts that thread only when asked (so a program nobody attaches to
//! keeps its own thread count): when the process has bound its socket and handles the wake
//! signal, the client sends it and waits for the thread. Each command goes over a fresh connection, so an idle interactive session
//! holds nothing in the target.

use std::io::{BufRead, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The listener thread's name in `/proc/PID/task/*/comm`.
const THREAD_NAME: &str = "msmemscope_ctrl";
const RUNTIME_LIBRARY: &str = msmemscope_core::launch_env::RUNTIME_LIBRARY;
/// How long the thread may take to start once the wake signal is sent: a program busy inside
/// its allocator or the C library starts it at its next safe point.
const WAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A snapshot of a big ledger (symbolization included) can take a while.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);
/// All response frames of one command together, at most.
const MAX_REPLY: usize = 64 * 1024 * 1024;
const PROMPT: &str = "msmemscope> ";

pub fn run(pid: i32, command: Option<String>) -> ExitCode {
    install_sigint_exit();
    let target = match precheck(pid) {
        Ok(target) => target,
        Err(line) => {
            eprintln!("msmemscope: {line}");
            return ExitCode::from(1);
        }
    };
    match command {
        Some(words) => match send(&target, &words) {
            Ok(reply) => {
                print_output(&reply.output);
                ExitCode::from(if reply.status == 0 { 0 } else { 1 })
            }
            Err(line) => {
                eprintln!("msmemscope: {line}");
                ExitCode::from(1)
            }
        },
        None => interactive(&target),
    }
}

/// Ctrl-C ends the client with status 130, whatever it was waiting for.
fn install_sigint_exit() {
    extern "C" fn on_sigint(_: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) }
    }
    // SAFETY: installs a handler that only calls an async-signal-safe function.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

fn interactive(target: &Target) -> ExitCode {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock();
    println!(
        "attached to process {} (`help` lists the words, `exit` ends the session)",
        target.pid
    );
    loop {
        print!("{PROMPT}");
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => {
                println!();
                return ExitCode::SUCCESS;
            }
            Ok(_) => {}
        }
        let words = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if words.is_empty() {
            continue;
        }
        if words == "exit" || words == "quit" {
            return ExitCode::SUCCESS;
        }
        match send(target, &words) {
            Ok(reply) => print_output(&reply.output),
            Err(line) => {
                eprintln!("msmemscope: {line}");
                // The process is gone or no longer listening: nothing more to say to it.
                if !Path::new(&format!("/proc/{}", target.pid)).exists() {
                    return ExitCode::from(1);
                }
            }
        }
    }
}

fn print_output(output: &str) {
    if output.ends_with('\n') || output.is_empty() {
        print!("{output}");
    } else {
        println!("{output}");
    }
    let _ = std::io::stdout().flush();
}

/// A process that passed the pre-checks.
pub struct Target {
    pid: i32,
    uid: u32,
}

/// The pre-checks, in order; the error is the one line saying which failed.
pub fn precheck(pid: i32) -> Result<Target, String> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let status = match std::fs::read_to_string(proc_dir.join("status")) {
        Ok(status) => status,
        Err(_) => return Err(format!("no process with pid {pid}")),
    };
    let uid =
        status_uid(&status).ok_or_else(|| format!("cannot read the owner of process {pid}"))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 && me != uid {
        return Err(format!(
            "process {pid} belongs to uid {uid}, not to you (uid {me}): only its user or root may attach"
        ));
    }
    // A stopped process never answers, and an exited one has no memory left to look at.
    match process_state(&status) {
        Some('Z') | Some('X') => {
            return Err(format!(
                "process {pid} has exited (a zombie waiting for its parent to reap it): there is \
                 nothing left to attach to"
            ))
        }
        Some('T') | Some('t') => {
            return Err(format!(
                "process {pid} is stopped (SIGSTOP, or a debugger): it cannot answer until it \
                 runs again (kill -CONT {pid})"
            ))
        }
        _ => {}
    }
    let maps = std::fs::read_to_string(proc_dir.join("maps"))
        .map_err(|e| format!("cannot read /proc/{pid}/maps: {e}"))?;
    if !maps.lines().any(|l| l.ends_with(RUNTIME_LIBRARY)) {
        return Err(format!(
            "process {pid} has not loaded {RUNTIME_LIBRARY}: start it with msmemscope, or after \
             `source msmemscope --load-api-env`"
        ));
    }
    if !has_listener_thread(&proc_dir) && !wake_listener(&proc_dir, &Target { pid, uid })? {
        let why = no_listener_reason(pid, uid).unwrap_or_else(|| {
            "with --load-api-env it starts at the program's first msmemscope start() or config()"
                .to_string()
        });
        return Err(format!(
            "process {pid} has {RUNTIME_LIBRARY} but no control listener ({THREAD_NAME}): {why}"
        ));
    }
    Ok(Target { pid, uid })
}

/// Why a process with the runtime has no listener, when it can be told from outside: the
/// control channel switched off in its environment, or its socket directory refused by the
/// same checks the runtime makes (it does not create the directory, so only an existing one
/// is judged).
fn no_listener_reason(pid: i32, uid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let var = |name: &str| {
        let prefix = format!("{name}=");
        environ
            .split(|&b| b == 0)
            .find_map(|v| v.strip_prefix(prefix.as_bytes()))
            .map(|v| std::ffi::OsStr::from_bytes(v).to_os_string())
    };
    if var(control_socket::ENV_NO_CONTROL).is_some_and(|v| v == "1") {
        return Some(format!(
            "the control channel is switched off ({}=1)",
            control_socket::ENV_NO_CONTROL
        ));
    }
    let dir = control_socket::socket_dir(uid, var("XDG_RUNTIME_DIR"));
    std::fs::symlink_metadata(&dir).ok()?;
    control_socket::check_private_dir(&dir, uid)
        .err()
        .map(|reason| format!("its socket directory was refused: {reason}"))
}

/// The state letter from `/proc/PID/status` (`State:\tT (stopped)`).
fn process_state(status: &str) -> Option<char> {
    let line = status.lines().find(|l| l.starts_with("State:"))?;
    line["State:".len()..].trim_start().chars().next()
}

/// The effective uid from `/proc/PID/status` (`Uid: real effective saved fs`).
fn status_uid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Asks a runtime whose socket is bound but whose thread has not started to start it: sends
/// the wake signal, only to a process that handles it (`SigCgt` in its status: a process whose
/// default action would end it is never sent one), and waits for the thread. `Ok(false)` when
/// there is nothing to wake; `Err` when it was asked and did not start in time.
fn wake_listener(proc_dir: &Path, target: &Target) -> Result<bool, String> {
    let signal = control_socket::wake_signal();
    let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
    let bound = socket_candidates(target).iter().any(|p| p.exists());
    if !bound || !catches(&status, signal) {
        return Ok(false);
    }
    // SAFETY: sends a signal the target handles (checked just now) to a pid of this user.
    if unsafe { libc::kill(target.pid, signal) } != 0 {
        return Ok(false);
    }
    let deadline = std::time::Instant::now() + WAKE_TIMEOUT;
    while std::time::Instant::now() < deadline {
        if has_listener_thread(proc_dir) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!(
        "process {} was asked to start its control listener ({THREAD_NAME}, signal {signal})          and did not within {} s: it may be stopped inside a lock, or have taken the signal          for itself",
        target.pid,
        WAKE_TIMEOUT.as_secs()
    ))
}

/// Whether the `SigCgt:` mask of a `/proc/PID/status` has a handler for `signal`.
fn catches(status: &str, signal: i32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| (1..=64).contains(&signal) && mask & (1u64 << (signal - 1)) != 0)
}

fn has_listener_thread(proc_dir: &Path) -> bool {
    let Ok(tasks) = std::fs::read_dir(proc_dir.join("task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("comm"))
            .is_ok_and(|comm| comm.trim_end_matches('\n') == THREAD_NAME)
    })
}

/// Where the target may have bound its socket: under its `$XDG_RUNTIME_DIR` (as it saw it at
/// start, from `/proc/PID/environ`) or ours, else `/tmp/msmemscope-{uid}/`.
fn socket_candidates(target: &Target) -> Vec<PathBuf> {
    let name = control_socket::socket_name(target.pid as u32);
    let mut dirs = Vec::new();
    if let Ok(environ) = std::fs::read(format!("/proc/{}/environ", target.pid)) {
        for var in environ.split(|&b| b == 0) {
            if let Some(value) = var.strip_prefix(b"XDG_RUNTIME_DIR=") {
                if !value.is_empty() {
                    dirs.push(PathBuf::from(String::from_utf8_lossy(value).into_owned()));
                }
            }
        }
    }
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        dirs.push(PathBuf::from(xdg));
    }
    let mut paths: Vec<PathBuf> = dirs
        .into_iter()
        .map(|d| d.join("msmemscope").join(&name))
        .collect();
    paths.push(PathBuf::from(format!("/tmp/msmemscope-{}", target.uid)).join(&name));
    paths.dedup();
    paths
}

fn connect(target: &Target) -> Result<UnixStream, String> {
    let candidates = socket_candidates(target);
    // A thread just woken may be making its socket again (the program had closed the first
    // one): the file is briefly missing or refuses; tried again for a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let mut last = None;
        for path in &candidates {
            if !path.exists() {
                continue;
            }
            match UnixStream::connect(path) {
                Ok(stream) => {
                    check_server(&stream, target)?;
                    return Ok(stream);
                }
                Err(e) => last = Some(format!("cannot connect to {}: {e}", path.display())),
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(last.unwrap_or_else(|| {
                format!(
                    "process {} has no control socket (looked for {})",
                    target.pid,
                    candidates
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The socket must be served by the target itself (same pid), not by whoever bound the path.
fn check_server(stream: &UnixStream, target: &Target) -> Result<(), String> {
    let pid = frame::peer_credentials(stream.as_raw_fd()).map_or(0, |(pid, _)| pid);
    if pid != target.pid {
        return Err(format!(
            "the control socket of process {} is served by another process (pid {pid})",
            target.pid
        ));
    }
    Ok(())
}

pub struct Reply {
    pub status: i32,
    pub output: String,
}

/// Sends one command and reads its reply (joining split responses).
fn send(target: &Target, words: &str) -> Result<Reply, String> {
    let mut stream = connect(target)?;
    let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let payload = serde_json::json!({ "command": words }).to_string();
    if payload.len() > frame::MAX_PAYLOAD as usize {
        return Err("the command is too long".to_string());
    }
    let seq = 1;
    // A refused peer may find the connection closed before its request is written: the
    // refusal is still there to read.
    let sent = stream.write_all(&frame::encode(
        frame::TYPE_REQUEST,
        0,
        seq,
        payload.as_bytes(),
    ));
    let mut output = String::new();
    loop {
        let (header, payload) = match (frame::read(&mut stream), &sent) {
            (Ok(frame), _) => frame,
            (Err(_), Err(e)) => return Err(format!("cannot send the command: {e}")),
            (Err(e), Ok(())) => return Err(e),
        };
        let value: serde_json::Value = serde_json::from_slice(&payload)
            .map_err(|e| format!("malformed reply from process {}: {e}", target.pid))?;
        match header.kind {
            frame::TYPE_ERROR => {
                let reason = value["error"].as_str().unwrap_or("unspecified error");
                return Err(reason.to_string());
            }
            frame::TYPE_RESPONSE => {
                output.push_str(value["output"].as_str().unwrap_or(""));
                if output.len() > MAX_REPLY {
                    return Err("the reply is too long".to_string());
                }
                if header.flags & frame::FLAG_MORE == 0 {
                    let status = value["status"].as_i64().unwrap_or(1) as i32;
                    return Ok(Reply { status, output });
                }
            }
            other => return Err(format!("unexpected reply frame type {other}")),
        }
    }
}

use msmemscope_core::control_frame as frame;
use msmemscope_core::control_socket;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_limits() {
        let f = frame::encode(frame::TYPE_RESPONSE, frame::FLAG_MORE, 9, b"{\"a\":1}");
        assert_eq!(f.len(), frame::HEADER_LEN + 7);
        let (h, payload) = frame::read(&mut &f[..]).unwrap();
        assert_eq!(
            h,
            frame::Header {
                version: 1,
                kind: 2,
                flags: 1,
                seq: 9,
                payload_len: 7
            }
        );
        assert_eq!(payload, b"{\"a\":1}");
        let mut big = frame::encode(frame::TYPE_RESPONSE, 0, 1, b"");
        big[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(frame::read(&mut &big[..]).unwrap_err().contains("exceeds"));
        let mut bad = frame::encode(frame::TYPE_RESPONSE, 0, 1, b"");
        bad[0] = 7;
        assert!(frame::read(&mut &bad[..])
            .unwrap_err()
            .contains("version 7"));
        assert!(frame::read(&mut &f[..5]).is_err());
    }

    #[test]
    fn caught_signals_from_status() {
        // SIGINT (2) and signal 60 caught; 61 not.
        let status = "Name:\tx\nSigCgt:\t0800000000000002\n";
        assert!(catches(status, 2));
        assert!(catches(status, 60));
        assert!(!catches(status, 61));
        assert!(!catches(status, 1));
        assert!(!catches("Name: x\n", 2));
        assert!(!catches(status, 0));
    }

    #[test]
    fn uid_from_status() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1001\t1001\nGid:\t5\t5\t5\t5\n";
        assert_eq!(status_uid(status), Some(1001));
        assert_eq!(status_uid("Name: x\n"), None);
        assert_eq!(process_state("Name:\tx\nState:\tT (stopped)\n"), Some('T'));
        assert_eq!(process_state("State:\tZ (zombie)\n"), Some('Z'));
        assert_eq!(process_state("Name: x\n"), None);
    }

    #[test]
    fn prechecks_name_the_failed_check() {
        assert_eq!(
            precheck(i32::MAX).err().unwrap(),
            format!("no process with pid {}", i32::MAX)
        );
        // This test process has no runtime library.
        let me = std::process::id() as i32;
        assert!(precheck(me)
            .err()
            .unwrap()
            .starts_with(&format!("process {me} has not loaded {RUNTIME_LIBRARY}")));
    }
}
