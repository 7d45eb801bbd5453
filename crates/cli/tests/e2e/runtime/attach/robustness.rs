//! Attach robustness (docs/cli.md#attach): the real `msmemscope-cli --pid` against targets that
//! load the real runtime library (tests/fixtures/attach_target.c, as in commands.rs).
//!
//! - A slow client (one byte a second) neither delays another client nor outlives its
//!   whole-request deadline; beyond the connection bound a client is answered "busy".
//! - A refused socket directory (0777, a symlink) is said once on the program's stderr, and
//!   `--pid` names the directory and the reason.
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary)
//! and gcc on PATH.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use msmemscope_core::config::RunConfig;

use crate::util::attach_target::{attach, read_frame, request, Target};
use crate::util::{Scratch, RUNTIME_LIB};

/// The runtime's whole-request deadline (control/mod.rs REQUEST_DEADLINE).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// The runtime's bound on connections served at once (control/mod.rs MAX_CONNECTIONS).
const MAX_CONNECTIONS: usize = 8;

// ------------------------------------------------------------------------------------------
// Scratch directories, the target

/// A scratch directory only its owner can enter.
fn private_scratch(tag: &str) -> Scratch {
    let scratch = Scratch::new(&format!("attach-robust-{tag}"));
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    scratch
}

/// `msmemscope-cli --analysis=host-leaks -o OUT attach_target DIR`, with `XDG_RUNTIME_DIR` as
/// given (else unset).
fn launched(xdg: Option<&Path>) -> Target {
    Target::launched(private_scratch("launched"), xdg)
}

/// `LD_PRELOAD=runtime attach_target DIR api CONFIG` (the program starts host-leaks).
fn api(xdg: Option<&Path>) -> Target {
    Target::api(private_scratch("api"), xdg)
}

/// Whether the server has closed `s`: end of file or a reset, not a timeout.
fn closed_by_server(s: &mut UnixStream) -> bool {
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

// ------------------------------------------------------------------------------------------
// A slow client, the connection bound

#[test]
fn a_trickling_client_delays_no_other_and_is_dropped_at_its_deadline() {
    let t = launched(None);
    let mut slow = UnixStream::connect(t.socket()).expect("connect to the control socket");
    let connected = Instant::now();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // One byte a second of a well-formed request (far longer than the deadline allows).
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let mut writer = slow.try_clone().unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let bytes = request(br#"{"command":"display config"}"#);
            for byte in bytes {
                if stop.load(Ordering::Relaxed) || writer.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));

    // Another client meanwhile: answered at once.
    let asked = Instant::now();
    let (code, out, err) = attach(t.pid, "display config");
    let took = asked.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(RunConfig::from_json(&out)
        .expect("the RunConfig JSON")
        .host_leaks());
    assert!(
        took < Duration::from_secs(3),
        "display config took {took:?}"
    );

    // A client that sends its request in pieces within the deadline is served too.
    let mut pieces = UnixStream::connect(t.socket()).unwrap();
    pieces
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let frame = request(br#"{"command":"help"}"#);
    for part in [&frame[..5], &frame[5..14], &frame[14..]] {
        pieces.write_all(part).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    let (kind, v) = read_frame(&mut pieces);
    assert_eq!(kind, 2, "{v}");
    assert!(v["output"].as_str().unwrap().contains("display config"));
    drop(pieces);

    // The trickling client is told why and dropped at its deadline, not later.
    let (kind, v) = read_frame(&mut slow);
    assert_eq!(kind, 3, "{v}");
    assert_eq!(
        v["error"],
        format!(
            "timed out: no whole request within {} s",
            REQUEST_DEADLINE.as_secs()
        )
    );
    assert!(
        closed_by_server(&mut slow),
        "the slow client's connection stays open"
    );
    let dropped_after = connected.elapsed();
    assert!(
        dropped_after >= REQUEST_DEADLINE - Duration::from_millis(200)
            && dropped_after < REQUEST_DEADLINE + Duration::from_secs(3),
        "dropped after {dropped_after:?}"
    );
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();

    // Still answering; the run ends as usual.
    let (code, out, _) = attach(t.pid, "help");
    assert_eq!(code, 0);
    assert!(out.contains("display memory summary"));
    let (out, _) = t.finish();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("attach_target done\n"));
}

#[test]
fn beyond_the_connection_bound_a_client_is_answered_busy() {
    let t = launched(None);
    // MAX_CONNECTIONS clients each halfway through a header.
    let held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let mut s = UnixStream::connect(t.socket()).unwrap();
            s.write_all(&[1, 1, 0]).unwrap();
            s
        })
        .collect();
    let (code, out, err) = attach(t.pid, "help");
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert_eq!(
        err,
        format!(
            "msmemscope: busy: {MAX_CONNECTIONS} other clients are connected to this process; try again\n"
        )
    );
    // Their slots are free again once they go.
    drop(held);
    let (code, out, err) = attach(t.pid, "help");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("display host_leak summary"));
    let (out, _) = t.finish();
    assert!(out.status.success());
}

// ------------------------------------------------------------------------------------------
// A refused socket directory

const WARNING: &str =
    "msmemscope: warning: control channel not started, `msmemscope --pid` cannot attach: ";

/// An `XDG_RUNTIME_DIR` of ours whose `msmemscope` entry is refused: a 0777 directory, or a
/// symlink to a private directory. Returns (the XDG directory, the refused path, the reason).
fn refused_xdg(scratch: &Scratch, kind: &str) -> (PathBuf, PathBuf, String) {
    let xdg = scratch.path().join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = xdg.join("msmemscope");
    let reason = match kind {
        "open" => {
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            format!(
                "{} is writable by group or others (mode 777)",
                dir.display()
            )
        }
        "symlink" => {
            let private = scratch.path().join("private");
            std::fs::create_dir(&private).unwrap();
            std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::symlink(&private, &dir).unwrap();
            format!("{} is a symlink", dir.display())
        }
        _ => unreachable!(),
    };
    (xdg, dir, reason)
}

/// `--pid` on a target whose directory was refused: one line naming it and why.
fn assert_pid_says_why(pid: i32, reason: &str) {
    let (code, out, err) = attach(pid, "help");
    assert_ne!(code, 0);
    assert_eq!(out, "");
    assert_eq!(
        err,
        format!(
            "msmemscope: process {pid} has {RUNTIME_LIB} but no control listener \
             (msmemscope_ctrl): its socket directory was refused: {reason}\n"
        )
    );
}

#[test]
fn a_refused_socket_directory_is_said_once_and_pid_names_it() {
    // The plain run, for its output and status.
    let plain = launched(None).finish().0;
    assert!(plain.status.success());
    let plain_stderr = String::from_utf8_lossy(&plain.stderr).into_owned();
    assert!(!plain_stderr.contains("warning"), "{plain_stderr}");

    for kind in ["open", "symlink"] {
        let scratch = private_scratch(kind);
        let (xdg, dir, reason) = refused_xdg(&scratch, kind);

        // Launched: the warning first, then the launcher's own lines as in the plain run.
        let t = launched(Some(&xdg));
        assert_pid_says_why(t.pid, &reason);
        assert!(!t.socket().exists(), "no fallback socket in /tmp");
        let (out, _) = t.finish();
        assert_eq!(out.status.code(), plain.status.code(), "{kind}");
        assert_eq!(out.stdout, plain.stdout, "{kind}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let (first, rest) = stderr.split_once('\n').unwrap();
        assert_eq!(first, format!("{WARNING}{reason}"), "{kind}");
        assert_eq!(
            stderr.matches("msmemscope: warning:").count(),
            1,
            "{stderr}"
        );
        assert_eq!(
            rest.lines().count(),
            plain_stderr.lines().count(),
            "{kind}: {stderr}"
        );

        // Preloaded (the program starts the runtime): that one line is all of its stderr.
        let t = api(Some(&xdg));
        assert_pid_says_why(t.pid, &reason);
        let (out, _) = t.finish();
        assert!(out.status.success(), "{kind}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "attach_target done\n",
            "{kind}"
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("{WARNING}{reason}\n"),
            "{kind}"
        );

        // Nothing of ours was made in or through the refused directory.
        let inside = if kind == "symlink" {
            scratch.path().join("private")
        } else {
            dir.clone()
        };
        assert_eq!(std::fs::read_dir(&inside).unwrap().count(), 0, "{kind}");
    }
}
