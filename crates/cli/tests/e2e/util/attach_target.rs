//! The attach tests' target: tests/fixtures/attach_target.c, run under the launcher or with the
//! runtime preloaded, stepped through its phases by files in its scratch directory; the
//! `msmemscope-cli --pid` client; and the control socket's frames, for raw clients.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use msmemscope_core::config::{Analysis, RunConfig};

use super::{built_once, runtime_lib, Scratch, BIN};

pub const WAIT: Duration = Duration::from_secs(30);

/// Builds the fixture once per test process, in a directory `nobody` can read (the security
/// test's client runs as nobody).
pub fn fixture() -> PathBuf {
    let prog = built_once(
        "attach",
        "attach_target.c",
        "attach_target",
        &["-O2", "-fomit-frame-pointer", "-g"],
        &["-ldl"],
    );
    let dir = prog.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    prog
}

/// Our effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A running fixture (under the launcher or preloaded), killed with its group if dropped.
pub struct Target {
    pub scratch: Scratch,
    child: Option<Child>,
    pub pid: i32,
}

impl Target {
    /// `msmemscope-cli --analysis=host-leaks -o OUT attach_target DIR` in `scratch`, with
    /// `XDG_RUNTIME_DIR` as given (else unset).
    pub fn launched(scratch: Scratch, xdg: Option<&Path>) -> Target {
        let mut cmd = Command::new(BIN);
        cmd.arg("--analysis=host-leaks")
            .arg("-o")
            .arg(scratch.path().join("out"))
            .arg(fixture())
            .arg(scratch.path());
        Target::spawn(scratch, cmd, xdg)
    }

    /// `LD_PRELOAD=runtime attach_target DIR api CONFIG` (the program starts host-leaks).
    pub fn api(scratch: Scratch, xdg: Option<&Path>) -> Target {
        let config = RunConfig {
            analysis: vec![Analysis::HostLeaks],
            output_path: scratch.path().join("out"),
            ..RunConfig::default()
        };
        let config_path = scratch.path().join("config.json");
        std::fs::write(&config_path, config.to_json()).unwrap();
        let mut cmd = Command::new(fixture());
        cmd.arg(scratch.path())
            .arg("api")
            .arg(&config_path)
            .env("LD_PRELOAD", runtime_lib())
            .env("MSMEMSCOPE_API_ENV", "host");
        Target::spawn(scratch, cmd, xdg)
    }

    fn spawn(scratch: Scratch, mut cmd: Command, xdg: Option<&Path>) -> Target {
        cmd.current_dir(scratch.path())
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("MSMEMSCOPE_NO_CONTROL")
            .env_remove("MSMEMSCOPE_HOST_TOP_N")
            .env_remove("MSMEMSCOPE_HOST_BEAT_MS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(xdg) = xdg {
            cmd.env("XDG_RUNTIME_DIR", xdg);
        }
        if !cmd.get_envs().any(|(k, _)| k == "LD_PRELOAD") {
            cmd.env_remove("LD_PRELOAD");
        }
        let child = cmd.spawn().expect("spawn the target");
        let mut target = Target {
            scratch,
            child: Some(child),
            pid: 0,
        };
        target.pid = target.wait_ready(1);
        target
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// Waits for `ready{phase}`; returns the pid written in it.
    pub fn wait_ready(&mut self, phase: u32) -> i32 {
        let path = self.file(&format!("ready{phase}"));
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                return text.trim().parse().expect("pid in the ready file");
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let out = self.child.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "the target ended ({status}) before ready{phase}:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(start.elapsed() < WAIT, "no ready{phase} within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets phase `phase` end (and waits for the next one's ready file).
    pub fn go(&mut self, phase: u32) {
        std::fs::write(self.file(&format!("go{phase}")), b"").unwrap();
        if phase == 1 {
            self.wait_ready(2);
        }
    }

    /// Lets the target finish; returns its output and its scratch directory.
    pub fn finish(mut self) -> (Output, Scratch) {
        self.go(1);
        std::fs::write(self.file("go2"), b"").unwrap();
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < WAIT, "the target did not finish");
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().unwrap();
        let scratch = Scratch(std::mem::take(&mut self.scratch.0));
        (out, scratch)
    }

    pub fn socket(&self) -> PathBuf {
        PathBuf::from(format!("/tmp/msmemscope-{}/ctrl_{}.sock", euid(), self.pid))
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling the process group spawn() created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

/// `msmemscope-cli --pid PID --command WORDS`: (exit code, stdout, stderr).
pub fn attach(pid: i32, words: &str) -> (i32, String, String) {
    client(Command::new(BIN), pid, Some(words))
}

/// `msmemscope-cli --pid PID`: the interactive session, its stdin and stdout piped, its stderr
/// to `stderr`.
pub fn session(pid: i32, stderr: Stdio) -> Child {
    Command::new(BIN)
        .arg("--pid")
        .arg(pid.to_string())
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("run the interactive client")
}

/// `cmd --pid PID [--command WORDS]`: (exit code, stdout, stderr).
pub fn client(mut cmd: Command, pid: i32, words: Option<&str>) -> (i32, String, String) {
    cmd.arg("--pid").arg(pid.to_string());
    if let Some(words) = words {
        cmd.arg("--command").arg(words);
    }
    let out = cmd
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .output()
        .expect("run the client");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ------------------------------------------------------------------------------------------
// The control socket's frames

/// A frame header: version, type, flags, a 5, the payload's length.
pub fn header(version: u8, kind: u8, len: u32) -> Vec<u8> {
    let mut h = vec![version, kind, 0, 0, 5, 0, 0, 0];
    h.extend_from_slice(&len.to_le_bytes());
    h
}

/// A well-formed request frame carrying `payload`.
pub fn request(payload: &[u8]) -> Vec<u8> {
    let mut f = header(1, 1, payload.len() as u32);
    f.extend_from_slice(payload);
    f
}

/// Reads one frame from the raw socket: (type, JSON payload).
pub fn read_frame(s: &mut UnixStream) -> (u8, serde_json::Value) {
    let mut h = [0u8; 12];
    s.read_exact(&mut h).expect("a reply header");
    assert_eq!(h[0], 1, "reply version");
    let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
    assert!(len <= 64 * 1024);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).unwrap();
    (h[1], serde_json::from_slice(&payload).unwrap())
}
