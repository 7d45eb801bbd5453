//! The run's state has one owner: windows closed and opened by the program's own C ABI calls in
//! a launched run use the launch configuration; the run begins before the runtime's
//! constructor (a linked library's constructor allocates first) and ends after the libraries'
//! destructors; a terminating signal to the program writes the report first and still ends
//! the program by that signal. Real C programs (tests/fixtures/session/) under the real CLI.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::util::host_leak::*;
use crate::util::{build_dir, fixture_src, gcc, Scratch, BIN};

struct Programs {
    windows: PathBuf,
    sigterm: PathBuf,
    ctor_main: PathBuf,
    fork_term: PathBuf,
}

fn programs() -> &'static Programs {
    static P: OnceLock<Programs> = OnceLock::new();
    P.get_or_init(|| {
        let dir = build_dir("session");
        let src = |name: &str| fixture_src(&format!("session/{name}"));
        let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
        gcc(&[
            "-O2",
            "-g",
            src("windows.c").to_str().unwrap(),
            "-o",
            &out("windows"),
            "-ldl",
        ]);
        for name in ["sigterm", "fork_term"] {
            let source = src(&format!("{name}.c"));
            gcc(&["-O2", "-g", source.to_str().unwrap(), "-o", &out(name)]);
        }
        gcc(&[
            "-shared",
            "-fPIC",
            "-O2",
            "-g",
            src("ctor_lib.c").to_str().unwrap(),
            "-o",
            &out("libctor_lib.so"),
        ]);
        gcc(&[
            "-O2",
            "-g",
            src("ctor_main.c").to_str().unwrap(),
            "-o",
            &out("ctor_main"),
            "-L",
            dir.to_str().unwrap(),
            "-lctor_lib",
            "-Wl,-rpath,$ORIGIN",
        ]);
        Programs {
            windows: dir.join("windows"),
            sigterm: dir.join("sigterm"),
            ctor_main: dir.join("ctor_main"),
            fork_term: dir.join("fork_term"),
        }
    })
}

/// The only site of a window's overview: (unfreed, allocated, freed).
fn only_site(ov: &Overview) -> &Site {
    assert_eq!(ov.sites.len(), 1, "sites in:\n{}", ov.text);
    &ov.sites[0]
}

#[test]
fn stop_and_start_from_the_program_make_two_windows_in_the_output_path() {
    let p = programs();
    let run = run_tool_cmd(&[], &[], p.windows.to_str().unwrap(), &[]);
    assert_exited(&run.out, 0, "windows");
    assert_eq!(run.stdout(), "windows done\n");
    assert_eq!(
        run.host_leak_files(),
        [
            "leak_overview_1.txt",
            "leak_overview_2.txt",
            "leak_sites_1.json",
            "leak_sites_2.json"
        ]
    );
    // Window 1: the 111-byte leak only; the 222-byte block made between the windows is in
    // neither; window 2: the 333-byte leak only.
    let first = Overview::parse(&run.overview_text_of(1));
    assert_eq!(first.allocations_tracked(), (1, 111));
    assert_eq!(first.total_unfreed, (1, 111));
    assert_eq!(only_site(&first).first_function(), "main");
    let second = Overview::parse(&run.overview_text_of(2));
    assert!(second
        .text
        .starts_with("====== Host Leak Overview: stage=2, pid="));
    assert_eq!(second.allocations_tracked(), (1, 333));
    assert_eq!(second.frees_tracked(), (0, 0));
    assert_eq!(second.total_unfreed, (1, 333));
    // Nothing in the program's working directory but the output path we gave.
    let cwd: Vec<String> = std::fs::read_dir(run.scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(cwd, ["out"], "stray files in the program's cwd");
    assert!(
        !run.stderr().contains("without running exit handlers"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_linked_library_constructor_leak_counts_and_its_destructor_frees_count() {
    let p = programs();
    let run = run_tool_cmd(&[], &[], p.ctor_main.to_str().unwrap(), &[]);
    assert_exited(&run.out, 0, "ctor_main");
    let ov = run.overview();
    // The constructor made 4321 + 999 bytes before the runtime's constructor ran; the
    // destructor freed the 999 after main returned.
    assert_eq!(ov.allocations_tracked(), (2, 4321 + 999));
    assert_eq!(ov.frees_tracked(), (1, 999));
    assert_eq!(ov.total_unfreed, (1, 4321));
    assert_eq!(
        ov.h("Pre-window frees"),
        "0 (0 bytes) (allocated before the window, freed in it; not part of the leak verdict)"
    );
    let site = only_site(&ov);
    assert_eq!(site.first_function(), "ctor_lib_init");
    assert_eq!(
        (site.unfreed, site.allocated, site.freed),
        ((1, 4321), (1, 4321), (0, 0))
    );
}

/// Starts `sigterm.c` under the CLI (with `arg`), waits for the pid it prints, sends SIGTERM to
/// the program (not the launcher) and returns the launcher's status and the run.
fn signalled_run(arg: &str) -> (std::process::ExitStatus, Scratch) {
    let p = programs();
    let scratch = Scratch::new("sigterm");
    let mut child = Command::new(BIN)
        .arg("--analysis=host-leaks")
        .arg("-o")
        .arg(scratch.path().join("out"))
        .arg(&p.sigterm)
        .args((!arg.is_empty()).then_some(arg))
        .current_dir(scratch.path())
        .env_remove("LD_PRELOAD")
        .env_remove("MSMEMSCOPE_NO_CONTROL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the CLI");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: i32 = line.trim().parse().expect("the program's pid");
    // SAFETY: signalling the program this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the program did not end after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, scratch)
}

fn only_overview(scratch: &Scratch) -> Overview {
    let out = scratch.path().join("out");
    let dirs: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let text = std::fs::read_to_string(dirs[0].join("host_leak/leak_overview_1.txt"))
        .expect("the window's report was written before the signal took effect");
    Overview::parse(&text)
}

#[test]
fn sigterm_to_the_program_writes_the_report_and_ends_it_by_sigterm() {
    let (status, scratch) = signalled_run("");
    // As without the tool: the program dies of SIGTERM, and the launcher passes that on.
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let ov = only_overview(&scratch);
    assert_eq!(ov.total_unfreed, (1, 777));
    assert_eq!(only_site(&ov).first_function(), "main");
}

#[test]
fn the_programs_own_sigterm_handler_still_runs() {
    let (status, scratch) = signalled_run("handler");
    // Its handler calls _exit(3): no exit handlers, so no report, and the status is its own.
    assert_eq!(status.code(), Some(3), "{status:?}");
    drop(scratch);
}

#[test]
fn sigterm_to_a_forked_child_ends_the_child_and_leaves_the_run_alone() {
    let p = programs();
    let run = run_tool_cmd(&[], &[], p.fork_term.to_str().unwrap(), &[]);
    // The child died of SIGTERM (the program checks); the parent's run ended normally.
    assert_exited(&run.out, 0, "fork_term");
    assert_eq!(run.stdout(), "child terminated\n");
    let ov = run.overview();
    assert_eq!(ov.total_unfreed, (1, 555));
}
