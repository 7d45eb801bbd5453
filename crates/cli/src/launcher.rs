//! Launching the target: run directory, preload, exec, wait, report, and the target's exit
//! status passed through as if msmemscope were not there.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use msmemscope_core::config::{DataFormat, Follow, LogLevel, RunConfig};
use msmemscope_core::launch_env;

use crate::install::{python_package_root, runtime_library, Layout};
use msmemscope_core::run_dir::RunDir;

pub fn run(config: &RunConfig, program: &[OsString], report: bool) -> ExitCode {
    if config.host_leaks() {
        for line in crate::knobs::warnings() {
            eprintln!("msmemscope: warning: {line}");
        }
    }
    let library = match runtime_library() {
        Ok(path) => path,
        Err(line) => {
            eprintln!("msmemscope: {line}");
            return ExitCode::from(1);
        }
    };
    if let Err(line) = check_output_path_length(&config.output_path) {
        eprintln!("msmemscope: {line}");
        return ExitCode::from(2);
    }
    // Under a file size limit (`ulimit -f`) a write of ours past it fails with EFBIG and is
    // said, instead of SIGXFSZ ending the launcher; the program gets its own disposition back.
    // SAFETY: setting a signal's disposition to SIG_IGN; no handler runs.
    let xfsz = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // The output path is the user's choice: one it cannot be made in (read-only, not a
    // directory, no permission) is a usage error.
    let dir = match RunDir::create(config, std::process::id()) {
        Ok(dir) => dir,
        Err(line) if line.contains("(os error 27)") => {
            eprintln!(
                "msmemscope: {line}: the file size limit (ulimit -f) leaves no room for the run \
                 directory's files; raise it"
            );
            return ExitCode::from(2);
        }
        Err(line) => {
            eprintln!("msmemscope: {line}; choose another --output-path");
            return ExitCode::from(2);
        }
    };
    log(&dir, &format!("launching {:?}", program));

    let original = std::env::var_os("LD_PRELOAD");
    let mut preload = OsString::from(library.as_os_str());
    if let Some(original) = &original {
        if !original.is_empty() {
            preload.push(":");
            preload.push(original);
        }
    }
    let mut command = std::process::Command::new(&program[0]);
    // The runtime writes through this descriptor, never through the path: the child inherits it
    // (close-on-exec cleared in the child only) and learns its number from the environment.
    let held = match dir.fd() {
        Ok(fd) => fd.as_raw_fd(),
        Err(e) => {
            eprintln!("msmemscope: {e}");
            return ExitCode::from(1);
        }
    };
    command
        .args(&program[1..])
        .env("LD_PRELOAD", preload)
        .env(launch_env::RUN_DIR, dir.path())
        .env(launch_env::RUN_DIR_FD, held.to_string())
        .env(launch_env::LAUNCHER_PID, std::process::id().to_string());
    // SAFETY: the closure runs in the forked child before exec and only calls fcntl and
    // signal, which are async-signal-safe; `held` stays open in the parent for the whole spawn.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(held, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if xfsz != libc::SIG_ERR {
                libc::signal(libc::SIGXFSZ, xfsz);
            }
            Ok(())
        });
    }
    if config.tracks_python_objects() {
        command.env(launch_env::PYTHON_OBJECTS, "1");
    } else {
        command.env_remove(launch_env::PYTHON_OBJECTS);
    }
    if !config.host_leaks() {
        // Marks from NVTX-annotated code (the nvtx package, torch.cuda.nvtx) reach the runtime.
        command.env(launch_env::NVTX_INJECTION, &library);
    }
    if !config.host_leaks() || config.tracks_python_objects() {
        // A Python target turns the PyTorch tracker on by itself once it imports torch; in a
        // host-leak run it wraps the interpreter's allocators instead.
        match python_autostart_path() {
            Some(path) => {
                command.env("PYTHONPATH", path);
            }
            None => log(
                &dir,
                "Python package not found: PyTorch tracking (event runs) or Python-object \
                 tracking (host-leak runs) cannot start by itself",
            ),
        }
    }

    // Installed before the spawn so that a signal arriving meanwhile waits for the target.
    let mut forwarding = crate::forward::Forwarding::prepare();
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            drop(forwarding);
            let name = program[0].to_string_lossy();
            eprintln!("msmemscope: cannot run {name}: {e}");
            // Nothing ran: the directory made for the run holds only our own files.
            let _ = std::fs::remove_dir_all(dir.path());
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return ExitCode::from(code);
        }
    };
    forwarding.start(child.id());
    if let Err(e) = forwarding.wait_ended(child.id()) {
        log(
            &dir,
            &format!("waiting for the target without reaping it: {e}"),
        );
    }
    drop(forwarding);
    let passed = crate::forward::passed_on();
    if !passed.is_empty() {
        log(&dir, &format!("signals passed on to the target: {passed}"));
    }
    let status = match child.wait() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("msmemscope: lost the target process: {e}");
            return ExitCode::from(1);
        }
    };
    log(&dir, &format!("target exited: {status}"));

    let followed = match (config.follow, dir.path().parent()) {
        (Follow::Exec, Some(output)) => crate::job::followed_runs(output, dir.path()),
        _ => Vec::new(),
    };
    let shown_program = program[0].to_string_lossy();
    // Whether the program's own run goes into the job's table (it recorded events itself).
    let mut own_events = false;
    if config.host_leaks() {
        // With processes besides the program, one summary of them all follows instead.
        let full = followed.is_empty();
        report_host_leaks(&dir, config, &status, &program[0], full);
    } else {
        if config.format == DataFormat::Parquet {
            note_open_segments(&dir);
            for process in &followed {
                if let Ok(run) = RunDir::open(&process.dir) {
                    note_open_segments(&run);
                }
            }
        }
        own_events = report_event_dump(&dir, config, &status, &program[0], !followed.is_empty());
    }
    let program_run = own_events.then(|| (dir.path(), shown_program.as_ref(), child.id()));
    if config.host_leaks() && !followed.is_empty() {
        crate::job::print_host_leak_summary(config, (dir.path(), child.id()), &followed);
    }
    crate::job::print_summary(config, program_run, &followed);
    if report {
        // The page is extra output: failing to write it is said, never the target's status.
        match crate::report::generate(dir.path()) {
            Ok(path) => eprintln!("msmemscope: report: {}", path.display()),
            Err(failure) => eprintln!("msmemscope: report: {}", failure.message),
        }
    }
    pass_through(status)
}

/// `PYTHONPATH` for the target: our autostart `sitecustomize`, the directory holding the
/// package when it is a source tree's `python/` (nothing else is in it), then the user's.
fn python_autostart_path() -> Option<OsString> {
    let (root, layout) = python_package_root()?;
    let mut path = OsString::from(root.join("msmemscope").join("_autostart"));
    if layout == Layout::SourceTree {
        path.push(":");
        path.push(&root);
    }
    if let Some(user) = std::env::var_os("PYTHONPATH") {
        if !user.is_empty() {
            path.push(":");
            path.push(user);
        }
    }
    Some(path)
}

/// `--format parquet`: the target wrote its dump in segments, each a complete Parquet file
/// once closed; a target that was killed left its open segments (`*.parquet.open`) without a
/// footer. Their rows are lost: said once each, with what is still read.
fn note_open_segments(run: &RunDir) {
    use msmemscope_core::events::parts::{open_segment_note, OPEN_SUFFIX};
    let mut devices: Vec<String> = std::fs::read_dir(run.resolved())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("device_"))
        .collect();
    devices.sort();
    for device in devices {
        let dump = run.path().join(&device).join("dump");
        let mut open: Vec<std::path::PathBuf> = Vec::new();
        for entry in std::fs::read_dir(&dump).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(OPEN_SUFFIX) {
                open.push(path);
            } else if name.ends_with(".steps") && path.is_dir() {
                for part in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    if part.file_name().to_string_lossy().ends_with(OPEN_SUFFIX) {
                        open.push(part.path());
                    }
                }
            }
        }
        open.sort();
        for segment in open {
            let note = open_segment_note(&segment);
            log(run, &note);
            eprintln!("msmemscope: {note}");
        }
    }
}

/// The program's own dumps and its analyses' report. `others_traced`: processes it started
/// recorded events (listed after this), so a program that recorded none itself (a launcher,
/// a wrapper script) is said to be one, not a run that lost its events.
fn report_event_dump(
    run: &RunDir,
    config: &RunConfig,
    status: &std::process::ExitStatus,
    program: &std::ffi::OsStr,
    others_traced: bool,
) -> bool {
    // Read through the held descriptor (whatever was renamed since), named by the run's path.
    let (dir, shown) = (run.resolved(), run.path());
    let mut dumps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("device_"))
        .flat_map(|e| {
            std::fs::read_dir(e.path().join("dump"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    // A Parquet segment a killed target left open is no dump (said above).
                    // SQLite's rollback journal, left by a failed write, is no dump.
                    n.starts_with("memscope_dump_")
                        && !n.ends_with(msmemscope_core::events::parts::OPEN_SUFFIX)
                        && !n.ends_with("-journal")
                })
        })
        .map(|p| shown.join(p.strip_prefix(&dir).unwrap_or(&p)))
        .collect();
    dumps.sort();
    let recorded = dumps.iter().any(|d| !only_trace_rows(d));
    if !recorded && others_traced {
        eprintln!(
            "msmemscope: {} recorded no events itself; the processes it started that did \
             are listed below",
            program.to_string_lossy()
        );
        return false;
    } else if dumps.is_empty() {
        eprintln!(
            "msmemscope: no events were recorded: {}; run directory {}",
            crate::why_empty::reason(run, program, status),
            shown.display()
        );
    }
    let incomplete = crate::why_empty::dump_failure(run);
    let any_dump = !dumps.is_empty();
    for dump in dumps {
        match &incomplete {
            Some(why) => eprintln!(
                "msmemscope: event dump (INCOMPLETE: {why}): {}",
                dump.display()
            ),
            None => eprintln!("msmemscope: event dump: {}", dump.display()),
        }
        let real = dir.join(dump.strip_prefix(shown).unwrap_or(&dump));
        let kept = msmemscope_core::events::parts::coverage(&real);
        let files = msmemscope_core::events::parts::dump_files(&real).len();
        if kept.is_none() && files > 1 {
            // A user opening the one file named above would see only its first segment.
            eprintln!(
                "msmemscope:   written as {files} complete Parquet segments: this file, then \
                 head_*.parquet in {}/ (the offline commands read them all from the path \
                 above; other tools must read every segment)",
                msmemscope_core::events::parts::parts_dir(&dump).display()
            );
        }
        if let Some(kept) = kept {
            let parts = msmemscope_core::events::parts::parts_dir(&dump);
            eprintln!(
                "msmemscope:   longer than its dump budget (--dump-budget): the rows of steps {} \
                 are kept (the later ones in {}/); all {} steps are summarized in {}/{}",
                msmemscope_core::events::parts::ranges(&kept.kept),
                parts.display(),
                kept.steps,
                parts.display(),
                msmemscope_core::events::parts::SUMMARY_FILE,
            );
        }
    }
    let missing = msmemscope_core::events::run_end::missing_exit_files(&dir);
    if let Some(sig) = status.signal().filter(|_| any_dump && !missing.is_empty()) {
        eprintln!(
            "msmemscope: the program was killed by signal {sig} ({}) before its exit: {} \
             (written at exit) are missing; the event dump holds the rows written until then",
            crate::why_empty::signal_name(sig).unwrap_or("?"),
            missing.join(", ")
        );
    }
    match run.read_to_string(Path::new(launch_env::ANALYSIS_REPORT)) {
        Ok(report) if config.log_level < LogLevel::Error => eprint!("{report}"),
        _ => {}
    }
    recorded
}

/// Whether a CSV dump holds nothing but the trace's own SYSTEM rows (its start and stop): what
/// a program that never touched PyTorch leaves. Other formats are taken as holding events.
fn only_trace_rows(dump: &Path) -> bool {
    use std::io::BufRead;
    const LOOKED_AT: usize = 8;
    if dump.extension().is_none_or(|e| e != "csv") {
        return false;
    }
    let Ok(file) = std::fs::File::open(dump) else {
        return false;
    };
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .take(LOOKED_AT)
        .map_while(Result::ok)
        .collect();
    lines.len() < LOOKED_AT
        && lines
            .iter()
            .skip(1)
            .all(|line| line.split(',').nth(1) == Some("SYSTEM"))
}

/// Prints every window's overview in stage order (a program may close and reopen windows), or
/// why there is none; with `full` false, only why there is none (the job's summary names the
/// files).
fn report_host_leaks(
    run: &RunDir,
    config: &RunConfig,
    status: &std::process::ExitStatus,
    program: &std::ffi::OsStr,
    full: bool,
) {
    let overviews = crate::job::overviews_in(&run.resolved().join("host_leak"));
    if overviews.is_empty() {
        let why = crate::why_empty::reason(run, program, status);
        eprintln!(
            "msmemscope: no host leak report was written for the target: {why}; run directory {}",
            run.path().display()
        );
        return;
    }
    for name in overviews {
        let relative = Path::new("host_leak").join(&name);
        let path = run.path().join(&relative);
        match run.read_to_string(&relative) {
            Ok(text) if text.is_empty() => eprintln!(
                "msmemscope: no host leak report was written for the target: {} ({} is empty); \
                 run directory {}",
                crate::why_empty::reason(run, program, status),
                path.display(),
                run.path().display()
            ),
            Ok(_) if !full => {}
            Ok(text) => {
                if config.log_level < LogLevel::Error {
                    eprint!("{text}");
                }
                eprintln!("msmemscope: host leak report: {}", path.display());
            }
            Err(e) => eprintln!("msmemscope: cannot read {}: {e}", path.display()),
        }
    }
}

/// The longest path below the output directory that a run writes (run directory, device
/// directory, a dump with a counter), beyond the output path itself.
const LONGEST_RUN_FILE: usize =
    "/msmemscope_4194304_20261203131504/device_cuda:65535/dump/memscope_dump_20261203131504_99.parquet"
        .len();

/// Refuses an output path so long that the run's files would pass PATH_MAX: the run would
/// otherwise record nothing, silently.
fn check_output_path_length(output: &Path) -> Result<(), String> {
    let absolute = std::path::absolute(output).unwrap_or_else(|_| output.to_path_buf());
    let length = absolute.as_os_str().len();
    let limit = libc::PATH_MAX as usize - 1;
    if length + LONGEST_RUN_FILE > limit {
        return Err(format!(
            "--output-path is {length} bytes long: the run's files below it would pass the \
             system's path limit ({limit} bytes); use a path of at most {} bytes",
            limit - LONGEST_RUN_FILE
        ));
    }
    Ok(())
}

/// Exits the way the target did: the same code, or the same signal re-raised.
fn pass_through(status: std::process::ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(code as u8);
    }
    if let Some(sig) = status.signal() {
        // SAFETY: restoring the default action and raising the signal the target died of.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return ExitCode::from(128u8.wrapping_add(sig as u8));
    }
    ExitCode::from(1)
}

fn log(dir: &RunDir, message: &str) {
    use std::io::Write;
    let relative = Path::new(launch_env::LOG_DIR).join("launcher.log");
    if let Ok(mut file) = dir.append_file(&relative) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let _ = writeln!(
            file,
            "{} {message}",
            msmemscope_core::time_fmt::utc_timestamp(now)
        );
    }
}
