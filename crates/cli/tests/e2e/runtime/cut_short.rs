//! Runs cut short: the program SIGKILLed at a random moment, the disk filling, the file size
//! limit (`ulimit -f`) below the dump. The program's own output and status stay its own, and
//! every offline consumer (report, both exports, ranks, compare) opens the run directory, reads
//! what was kept and says in one line what is missing and why. The producer is
//! tests/fixtures/emit_events.c (`burst N`: N MALLOC rows), a program of the C ABI.

use std::ffi::OsStr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::host_leak::clear_runtime_knobs;
use crate::util::{self, only_dump, only_run_dir, output_with_timeout, stderr, Scratch, BIN};

const EXIT_FILES: &str = "leaks/findings.json, leaks/peak.json, analysis_report.txt";

fn producer() -> PathBuf {
    util::producer("emit_events")
}

/// The launcher running the producer, without the test's own runtime settings.
fn launcher(out: &Path, options: &[&str], mode: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(options)
        .arg("-o")
        .arg(out)
        .arg(producer())
        .args(mode);
    cmd.env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut cmd);
    cmd
}

/// A seed from the clock, printed so that a failure can be replayed with `CUT_SHORT_SEED`.
fn seed() -> u64 {
    let seed = std::env::var("CUT_SHORT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        });
    println!("cut_short seed: {seed} (CUT_SHORT_SEED={seed} replays it)");
    seed
}

/// A number in `0..n` from `seed` (one step of xorshift64*).
fn pick(seed: u64, n: u64) -> u64 {
    let mut x = seed | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
}

/// The offline commands on `run`, each checked to open it (status 0, no panic): their stderr.
fn consumers(run: &Path) -> Vec<(String, String)> {
    let dump = only_dump(run, "device_cpu");
    let pair = format!("{},{}", dump.display(), dump.display());
    let commands: Vec<Vec<&OsStr>> = vec![
        vec!["report".as_ref(), run.as_os_str()],
        vec![
            "export".as_ref(),
            "--format".as_ref(),
            "torch-snapshot".as_ref(),
            run.as_os_str(),
        ],
        vec![
            "export".as_ref(),
            "--format".as_ref(),
            "parquet".as_ref(),
            run.as_os_str(),
        ],
        vec!["ranks".as_ref(), run.as_os_str()],
        vec![
            "--compare".as_ref(),
            "--input-path".as_ref(),
            pair.as_ref(),
            "-o".as_ref(),
            run.as_os_str(),
        ],
    ];
    commands
        .into_iter()
        .map(|args| {
            let shown = format!("{:?}", args);
            let done = util::cli(&args);
            let said = stderr(&done);
            assert_eq!(done.status.code(), Some(0), "{shown}: {said}");
            assert!(!said.contains("panicked"), "{shown}: {said}");
            (shown, said)
        })
        .collect()
}

/// Each consumer's stderr holds `note` exactly once.
fn each_says_once(said: &[(String, String)], note: &str) {
    for (command, text) in said {
        assert_eq!(
            text.matches(note).count(),
            1,
            "{command}: {text}\nwanted: {note}"
        );
    }
}

/// The rows the reader gives back, and the complete lines of the CSV dump (header aside): a
/// row the writing stopped inside is left out, every complete one read.
fn rows_and_lines(dump: &Path) -> (usize, usize) {
    let rows = msmemscope_core::events::reader::open(dump)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .expect("every complete row reads");
    let bytes = std::fs::read(dump).unwrap();
    let lines = bytes.iter().filter(|&&b| b == b'\n').count();
    (rows.len(), lines - 1)
}

/// The program (the launcher's child) is SIGKILLed at a random moment of a long burst of rows:
/// the launcher re-raises the signal and says the files written at exit are missing; every
/// consumer reads the rows kept and names the signal and the same files.
#[test]
fn a_program_killed_at_a_random_moment_leaves_a_run_every_consumer_opens() {
    let seed = seed();
    let scratch = Scratch::new("cut-kill");
    let out = scratch.path().join("out");
    let mut cmd = launcher(&out, &[], &["burst", "20000000"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let (mut launcher, readers) = util::spawn_collecting(&mut cmd);
    // The program writes once its dump file exists; it is killed 0.1 to 1.5 s later, well
    // before its burst ends (about 10 s).
    let start = Instant::now();
    let dump = loop {
        let found = util::msmemscope_runs(&out)
            .ok()
            .and_then(|runs| runs.first().cloned())
            .and_then(|run| std::fs::read_dir(run.join("device_cpu/dump")).ok())
            .and_then(|mut files| files.next())
            .and_then(|file| file.ok())
            .map(|file| file.path());
        if let Some(dump) = found {
            break dump;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no dump was made"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let delay = Duration::from_millis(100 + pick(seed, 1400));
    println!("killing the program {delay:?} after its dump appeared");
    std::thread::sleep(delay);
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", launcher.id())).unwrap();
    let program: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: a process this test started (through the launcher).
    assert_eq!(unsafe { libc::kill(program, libc::SIGKILL) }, 0);
    let status = launcher.wait().unwrap();
    let launched: Output = readers.output(status);
    let said = stderr(&launched);
    assert_eq!(launched.status.signal(), Some(libc::SIGKILL), "{said}");
    assert!(launched.stdout.is_empty(), "the burst never finished");
    assert!(
        said.contains(&format!(
            "msmemscope: the program was killed by signal 9 (SIGKILL) before its exit: \
             {EXIT_FILES} (written at exit) are missing; the event dump holds the rows written \
             until then"
        )),
        "{said}"
    );

    let run = only_run_dir(&out);
    let (rows, lines) = rows_and_lines(&dump);
    assert!(rows > 0, "rows were written before the kill");
    assert_eq!(rows, lines, "every complete row is read");
    let note = format!(
        "msmemscope: note: {}: the program was killed (signal: 9 (SIGKILL)) before the run \
         ended: the event dump holds the rows written until then; missing: {EXIT_FILES} \
         (written when the program exits)",
        run.display()
    );
    let said = consumers(&run);
    each_says_once(&said, &note);
    // A last row the kill cut in half is left out with the true reason.
    let cut = std::fs::read(&dump).unwrap().last() != Some(&b'\n');
    println!("last row cut: {cut}");
    for (command, text) in &said {
        assert_eq!(
            text.contains(
                "the writing stopped inside it: the program was killed (signal: 9 (SIGKILL))"
            ),
            cut,
            "{command}: {text}"
        );
    }
}

/// A small tmpfs, mounted for one test and unmounted when it ends; `None` (with the reason
/// printed) where mounting is refused.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).unwrap();
        let done = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output();
        match done {
            Ok(done) if done.status.success() => Some(SmallDisk(at.to_path_buf())),
            Ok(done) => {
                println!(
                    "skipped: this test mounts a {size} tmpfs (root, mount(8)): {}",
                    String::from_utf8_lossy(&done.stderr).trim()
                );
                None
            }
            Err(e) => {
                println!("skipped: this test mounts a {size} tmpfs, and mount(8) cannot run: {e}");
                None
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The part of the runtime's line the launcher and every consumer repeat, with its time.
fn logged_failure(run: &Path) -> (String, String) {
    let failure = msmemscope_core::events::run_end::dump_failure(run).expect("a failure logged");
    (failure.when, failure.what)
}

/// The disk fills in the middle of the run: the program prints and exits as without the tool,
/// the console says the disk filled (where, when), and a copy of the run is read by every
/// consumer, each saying the dump stops early because the disk was full.
#[test]
fn a_disk_that_fills_mid_run_leaves_a_run_every_consumer_opens() {
    let scratch = Scratch::new("cut-disk");
    let out = scratch.path().join("out");
    let Some(disk) = SmallDisk::mount(&out, "400k") else {
        return;
    };
    let launched = output_with_timeout(launcher(&out, &[], &["burst", "20000"]));
    let said = stderr(&launched);
    assert!(
        util::stdout(&launched).starts_with("emitted 20000 in "),
        "{said}"
    );
    assert_eq!(launched.status.code(), Some(0), "{said}");
    let run = only_run_dir(&out);
    let (when, what) = logged_failure(&run);
    assert!(
        what.starts_with(&format!(
            "the disk holding {} is full: No space left on device (os error 28); the dump stops \
             there: the rows from ID ",
            run.display()
        )),
        "{what}"
    );
    assert!(
        said.contains(&format!(
            "msmemscope: event dump (INCOMPLETE: since {when}: {what}): "
        )),
        "{said}"
    );
    // Read off the full disk: a copy, where the page and the exports have room.
    let copy = scratch.path().join("copy");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(&run)
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    drop(disk);
    let dump = only_dump(&copy, "device_cpu");
    let (rows, lines) = rows_and_lines(&dump);
    assert_eq!(rows, lines);
    assert!(rows > 1000 && rows < 20000, "{rows} rows");
    let note = format!(
        "msmemscope: note: {}: the event dump stops early, at {when}: {what}; missing: \
         {EXIT_FILES} (written when the program exits)",
        copy.display()
    );
    each_says_once(&consumers(&copy), &note);
}

/// `ulimit -f` below the dump: the writes past it fail (the runtime's threads block SIGXFSZ,
/// which would otherwise kill the program) and are taken as the dump's end, the message naming
/// the limit; the analyses' files are written at exit as usual. The same for a SQLite dump,
/// whose failed writes once held the program's exit up for the writer's 30 s.
#[test]
fn a_file_size_limit_below_the_dump_ends_the_dump_not_the_program() {
    const LIMIT: u64 = 1 << 20;
    for format in ["csv", "db"] {
        let scratch = Scratch::new("cut-fsize");
        let out = scratch.path().join("out");
        let mut cmd = launcher(&out, &["--format", format], &["burst", "300000"]);
        with_file_size_limit(&mut cmd, LIMIT);
        let start = Instant::now();
        let launched = output_with_timeout(cmd);
        let took = start.elapsed();
        let said = stderr(&launched);
        assert!(
            util::stdout(&launched).starts_with("emitted 300000 in "),
            "{format}: {said}"
        );
        assert_eq!(launched.status.code(), Some(0), "{format}: {said}");
        assert!(
            took < Duration::from_secs(20),
            "{format}: the exit took {took:?}"
        );
        let run = only_run_dir(&out);
        let (when, what) = logged_failure(&run);
        let cause = format!(
            "the file size limit the program runs under was reached (ulimit -f, RLIMIT_FSIZE: \
             {LIMIT} bytes per file): "
        );
        assert!(what.starts_with(&cause), "{format}: {what}");
        assert!(
            said.contains(&format!(
                "msmemscope: event dump (INCOMPLETE: since {when}: {what}): "
            )),
            "{format}: {said}"
        );
        assert!(!said.contains("-journal"), "{format}: {said}");
        let dump = util::dump_files(&run, "device_cpu")
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == format))
            .unwrap();
        assert!(std::fs::metadata(&dump).unwrap().len() <= LIMIT);
        for file in EXIT_FILES.split(", ") {
            assert!(
                run.join(file).is_file(),
                "{format}: {file} is written at exit"
            );
        }
        let note = format!(
            "msmemscope: note: {}: the event dump stops early, at {when}: {what}",
            run.display()
        );
        if format == "csv" {
            let (rows, lines) = rows_and_lines(&dump);
            assert_eq!(rows, lines);
            each_says_once(&consumers(&run), &note);
        } else {
            let report = util::cli(&["report".as_ref(), run.as_os_str()]);
            assert_eq!(report.status.code(), Some(0), "{}", stderr(&report));
            assert_eq!(
                stderr(&report).matches(&note).count(),
                1,
                "{}",
                stderr(&report)
            );
        }
    }
}

/// `cmd` with a file size limit of `bytes`.
fn with_file_size_limit(cmd: &mut Command, bytes: u64) {
    // SAFETY: setrlimit is async-signal-safe; it only lowers the child's own limit.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The launcher takes no SIGXFSZ itself, and hands the program its own disposition: a program
/// writing past the limit dies of SIGXFSZ as without the tool; a limit that leaves no room for
/// the run directory's first file is said in one line (status 2), not a launcher killed.
#[test]
fn the_program_keeps_its_own_sigxfsz() {
    let scratch = Scratch::new("cut-xfsz");
    let out = scratch.path().join("out");
    let script = "exec head -c 100000 /dev/zero > big";
    let mut plain = Command::new("sh");
    plain.args(["-c", script]).current_dir(scratch.path());
    with_file_size_limit(&mut plain, 50_000);
    let plain = output_with_timeout(plain);
    assert_eq!(plain.status.signal(), Some(libc::SIGXFSZ));

    let mut traced = Command::new(BIN);
    traced
        .args(["-q", "-o"])
        .arg(&out)
        .args(["sh", "-c", script])
        .current_dir(scratch.path())
        .env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut traced);
    with_file_size_limit(&mut traced, 50_000);
    let traced = output_with_timeout(traced);
    assert_eq!(
        traced.status.signal(),
        Some(libc::SIGXFSZ),
        "{}",
        stderr(&traced)
    );

    let mut none = launcher(&scratch.path().join("none"), &[], &["steps"]);
    with_file_size_limit(&mut none, 0);
    let none = output_with_timeout(none);
    let said = stderr(&none);
    assert_eq!(none.status.code(), Some(2), "{said}");
    assert!(none.stdout.is_empty());
    assert!(
        said.ends_with(
            "/config.json: File too large (os error 27): the file size limit (ulimit -f) leaves \
             no room for the run directory's files; raise it\n"
        ),
        "{said}"
    );
    assert_eq!(said.lines().count(), 1, "{said}");
}
