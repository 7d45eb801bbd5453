//! Running the CLI and programs, and finding and reading what a run wrote.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{producer, BIN};

/// Every run under [`output_with_timeout`] is killed (and the test fails) after this long.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// `msmemscope-cli ARGS` without `LD_PRELOAD`, run to its end.
pub fn cli(args: &[&OsStr]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("the CLI runs")
}

/// `msmemscope-cli ARGS` in `dir`, without `LD_PRELOAD`, run to its end.
pub fn cli_in(dir: &Path, args: &[impl AsRef<OsStr>]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("the CLI runs")
}

/// `msmemscope-cli OPTIONS -o OUT PROGRAM...` without `LD_PRELOAD`, checked to exit 0.
pub fn launch_ok(options: &[&str], out: &Path, program: &[&OsStr]) -> Output {
    let output = Command::new(BIN)
        .args(options)
        .arg("-o")
        .arg(out)
        .args(program)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("the CLI runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `cmd` with piped stdout/stderr in its own process group; kills the group and fails
/// the test if it runs longer than [`RUN_TIMEOUT`].
pub fn output_with_timeout(cmd: Command) -> Output {
    output_within(cmd, RUN_TIMEOUT)
}

/// [`output_with_timeout`] with another limit.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    cmd.process_group(0);
    let (mut child, readers) = spawn_collecting(&mut cmd);
    let start = Instant::now();
    let status: ExitStatus = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > limit {
            // SAFETY: signalling the process group this function created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("{:?} did not finish within {:?} (hang?)", cmd, limit);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    readers.output(status)
}

/// The two threads reading a child's stdout and stderr to their ends.
pub struct Readers {
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
}

impl Readers {
    /// The child's whole output, once it ended with `status`.
    pub fn output(self, status: ExitStatus) -> Output {
        Output {
            status,
            stdout: self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
        }
    }
}

/// Spawns `cmd` with stdin from /dev/null and its stdout and stderr read on two threads (so
/// that neither pipe fills while the test waits on it).
pub fn spawn_collecting(cmd: &mut Command) -> (Child, Readers) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    fn read_all(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = pipe.read_to_end(&mut v);
            v
        })
    }
    let stdout = read_all(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    (child, Readers { stdout, stderr })
}

/// `msmemscope-cli OPTIONS -o OUT emit_events sleep` without `LD_PRELOAD`, its stderr to
/// `stderr`, waited on until the producer says "waiting" (it has emitted both its rows and
/// sleeps until killed). Returns the launcher (its stdout still piped) and the target's pid:
/// the launcher's only child.
pub fn launch_sleeping_producer(options: &[&str], out: &Path, stderr: Stdio) -> (Child, i32) {
    let mut child = Command::new(BIN)
        .args(options)
        .arg("-o")
        .arg(out)
        .arg(producer("emit_events"))
        .arg("sleep")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.contains("waiting") {
        assert!(Instant::now() < deadline, "target never got ready");
        let mut buf = [0u8; 64];
        let n = stdout.read(&mut buf).unwrap();
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    child.stdout = Some(stdout);
    let launcher = child.id();
    let children =
        std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).unwrap();
    let target: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    (child, target)
}

// ------------------------------------------------------------------------------------------
// What a run wrote

/// The `msmemscope_*` entries of an output directory (the run directories).
pub fn msmemscope_runs(out: &Path) -> std::io::Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(out)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("msmemscope_"))
        })
        .collect())
}

/// The one entry of an output directory: the run directory of a single launch.
pub fn only_run_dir(out: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

/// The files of a run's `{device}/dump/` (`device_cpu`, `device_0`); not the directory of a
/// dump's step summary and parts (`memscope_dump_{ts}.steps/`).
pub fn dump_files(run: &Path, device: &str) -> Vec<PathBuf> {
    std::fs::read_dir(run.join(device).join("dump"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect()
}

/// The one dump file of a device in a run.
pub fn only_dump(run: &Path, device: &str) -> PathBuf {
    let mut files = dump_files(run, device);
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

/// RFC 4180: fields separated by commas, records by CRLF or LF, quoted fields may contain
/// commas, line breaks and doubled quotes. Panics on malformed input.
pub fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut at_field_start = true;
    while let Some(c) = chars.next() {
        if at_field_start && c == '"' {
            // quoted field
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(ch) => field.push(ch),
                    None => panic!("unterminated quoted field in CSV"),
                }
            }
            at_field_start = false;
            match chars.peek() {
                Some(',') | Some('\n') | Some('\r') | None => {}
                Some(other) => panic!("character {other:?} after closing quote"),
            }
            continue;
        }
        match c {
            ',' => {
                record.push(std::mem::take(&mut field));
                at_field_start = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
                at_field_start = true;
            }
            '"' => panic!("quote inside an unquoted field"),
            _ => {
                field.push(c);
                at_field_start = false;
            }
        }
    }
    if !at_field_start || !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    records
}
