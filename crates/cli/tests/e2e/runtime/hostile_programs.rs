//! The runtime inside processes nobody here wrote: other allocators, programs that close and
//! reuse descriptors, memory pressure, full disks, signals and exit paths. Each test builds a
//! real C program, runs it once without the tool and once under the real CLI, and checks that
//! the program's own output and exit status are the same, that nothing was written outside the
//! run directory, and what the tool said.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::host_leak::{clear_runtime_knobs, Overview};
use crate::util::{compile, fixture_src, output_with_timeout, repo, venv_python, Scratch, BIN};

/// Builds `tests/fixtures/hostile/{name}` (C or C++ by its extension) into `dir`.
fn build(dir: &Path, source: &str, extra: &[&str]) -> PathBuf {
    let src = fixture_src("hostile").join(source);
    let stem = Path::new(source).file_stem().unwrap().to_str().unwrap();
    let exe = dir.join(stem);
    let compiler = if source.ends_with(".cc") {
        "g++"
    } else {
        "gcc"
    };
    let mut args: Vec<&str> = vec!["-O1", "-g", "-Wno-alloc-size-larger-than"];
    args.extend_from_slice(extra);
    let src_s = src.to_str().unwrap().to_string();
    let exe_s = exe.to_str().unwrap().to_string();
    args.extend_from_slice(&[&src_s, "-o", &exe_s]);
    compile(compiler, &args);
    exe
}

/// Builds a fixture that writes MSTX marks (weakly linked: it runs without the tool too).
fn build_with_mstx(dir: &Path, source: &str) -> PathBuf {
    let include = repo().join("crates/runtime/include");
    let include = format!("-I{}", include.display());
    build(dir, source, &["-DMSMEMSCOPE_MSTX_WEAK", &include])
}

/// A library the test command installs from Debian's packages.
fn debian_library(name: &str) -> PathBuf {
    let path = Path::new("/usr/lib/x86_64-linux-gnu").join(name);
    assert!(
        path.exists(),
        "{} is missing: scripts/test.sh installs libjemalloc2 and libtcmalloc-minimal4",
        path.display()
    );
    path
}

/// One program, run without the tool and under it, in directories of its own.
struct Pair {
    /// Where the traced run's program ran (its working directory) and the tool's output went.
    scratch: Scratch,
    plain: Output,
    traced: Output,
}

impl Pair {
    /// Runs `program` plainly and under `msmemscope {tool_args} -o OUT`, `env` for both, and
    /// checks that the tool changed nothing the program does ([`Pair::assert_unchanged`]).
    fn run(tool_args: &[&str], program: &[&str], env: &[(&str, &str)]) -> Pair {
        let scratch = Scratch::new("hostile");
        let plain_dir = scratch.path().join("plain");
        let traced_dir = scratch.path().join("work");
        std::fs::create_dir_all(&plain_dir).unwrap();
        std::fs::create_dir_all(&traced_dir).unwrap();
        let mut plain = Command::new(program[0]);
        plain.args(&program[1..]).current_dir(&plain_dir);
        let mut traced = Command::new(BIN);
        traced
            .args(tool_args)
            .arg("-o")
            .arg(scratch.path().join("out"))
            .args(program)
            .current_dir(&traced_dir);
        for cmd in [&mut plain, &mut traced] {
            cmd.env_remove("LD_PRELOAD");
            clear_runtime_knobs(cmd);
            for (k, v) in env {
                cmd.env(k, v);
            }
        }
        let plain = output_with_timeout(plain);
        let traced = output_with_timeout(traced);
        let pair = Pair {
            scratch,
            plain,
            traced,
        };
        pair.assert_unchanged();
        pair
    }

    /// [`Pair::run`] of `program` alone under `--analysis=host-leaks`.
    fn host_leaks(program: &Path) -> Pair {
        Pair::run(
            &["--analysis=host-leaks"],
            &[program.to_str().unwrap()],
            &[],
        )
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.traced.stderr).into_owned()
    }

    /// The program's output and status are what they are without the tool, and it wrote only
    /// what it writes without it.
    fn assert_unchanged(&self) {
        assert_eq!(
            String::from_utf8_lossy(&self.traced.stdout),
            String::from_utf8_lossy(&self.plain.stdout),
            "stdout changed; tool's stderr:\n{}",
            self.stderr()
        );
        assert_eq!(
            self.traced.status.code(),
            self.plain.status.code(),
            "exit status changed ({:?} vs {:?}); stderr:\n{}",
            self.traced.status,
            self.plain.status,
            self.stderr()
        );
        assert_eq!(
            listing(&self.scratch.path().join("work")),
            listing(&self.scratch.path().join("plain")),
            "the traced program's directory differs from the plain one's"
        );
    }

    /// The single run directory.
    fn run_dir(&self) -> PathBuf {
        let out = self.scratch.path().join("out");
        let dirs: Vec<PathBuf> = std::fs::read_dir(&out)
            .unwrap_or_else(|e| panic!("no {}: {e}\n{}", out.display(), self.stderr()))
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        dirs.into_iter().next().unwrap()
    }

    /// The lines holding `needle` in all the run's CPU dump files.
    fn dump_lines_with(&self, needle: &str) -> usize {
        std::fs::read_dir(self.run_dir().join("device_cpu/dump"))
            .unwrap()
            .map(|e| {
                let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
                text.lines().filter(|l| l.contains(needle)).count()
            })
            .sum()
    }

    fn overview(&self) -> Overview {
        let path = self.run_dir().join("host_leak/leak_overview_1.txt");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.stderr()));
        Overview::parse(&text)
    }
}

/// Every file under `dir` with its contents, sorted.
fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.push((rel, std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

// ------------------------------------------------------------------------------------------
// Other allocators

/// jemalloc and tcmalloc preloaded after the runtime (the launcher puts it first): the hooks
/// forward to them, C++ `new`/`delete` and `malloc`/`free` mixed, in both modes; the report says
/// which allocator it saw and counts the program's blocks.
#[test]
fn allocators_preloaded_after_the_runtime() {
    let dir = Scratch::new("alloc-bin");
    let prog = build(dir.path(), "mixed_allocations.cc", &[]);
    let prog = prog.to_str().unwrap();
    for lib in ["libjemalloc.so.2", "libtcmalloc_minimal.so.4"] {
        let lib = debian_library(lib);
        let env = [("LD_PRELOAD", lib.to_str().unwrap())];
        Pair::run(&["-q"], &[prog], &env);
        let host = Pair::run(&["--analysis=host-leaks"], &[prog], &env);
        let overview = host.overview();
        assert_eq!(
            overview.h("Allocator"),
            format!("{}, through the hooks", lib.display()),
            "{}",
            host.stderr()
        );
        // 7 blocks of 3000 bytes leak through malloc. Both allocators bring their own C++
        // `operator new`, which never calls `malloc`: the report says its blocks are not seen.
        let leaked = overview
            .by_function("leak_with_malloc()")
            .expect("malloc site");
        assert_eq!(leaked.0, (7, 7 * 3000));
        assert!(overview.by_function("leak_with_new()").is_none());
        assert_eq!(
            overview.h("C++ operator new/delete"),
            "the allocator's own, not seen by the hooks"
        );
        assert_eq!(
            overview.verdict(),
            format!(
                "INCOMPLETE, not usable as a leak conclusion: blocks from C++ operator new are \
                 not seen ({} brings its own, which does not call malloc); malloc's are",
                lib.display()
            )
        );
    }
}

/// An allocator preloaded ahead of the runtime (a wrapper script that prepends it), and a
/// program that defines malloc itself: the program's calls never reach the hooks, and the
/// report says so instead of calling the empty window complete.
#[test]
fn allocators_ahead_of_the_runtime_are_named() {
    let dir = Scratch::new("ahead-bin");
    let own = build(dir.path(), "own_malloc.c", &[]);
    let run = Pair::host_leaks(&own);
    let overview = run.overview();
    assert_eq!(
        overview.h("Allocator"),
        "the program itself, NOT through the hooks (found before the runtime)"
    );
    assert!(
        overview.verdict().starts_with(
            "INCOMPLETE, not usable as a leak conclusion: malloc is defined by the program \
             itself, which the loader finds before the runtime"
        ),
        "{}",
        overview.verdict()
    );

    let mixed = build(dir.path(), "mixed_allocations.cc", &[]);
    for lib in ["libjemalloc.so.2", "libtcmalloc_minimal.so.4"] {
        let lib = debian_library(lib);
        let script = format!(
            "LD_PRELOAD={}:$LD_PRELOAD exec {}",
            lib.display(),
            mixed.display()
        );
        Pair::run(&["-q"], &["sh", "-c", &script], &[]);
        let run = Pair::run(&["--analysis=host-leaks"], &["sh", "-c", &script], &[]);
        assert_eq!(
            run.overview().h("Allocator"),
            format!(
                "{}, NOT through the hooks (found before the runtime)",
                lib.display()
            )
        );
    }
}

/// The edges of the malloc API behave as the host's glibc makes them (alignment rules, errno
/// after failures, `free` keeping errno), in both modes.
#[test]
fn glibc_semantics_are_the_hosts() {
    let dir = Scratch::new("semantics-bin");
    let prog = build(dir.path(), "glibc_semantics.c", &["-O0"]);
    let prog = prog.to_str().unwrap();
    for mode in [&["-q"][..], &["-q", "--analysis=host-leaks"][..]] {
        let run = Pair::run(mode, &[prog], &[]);
        let text = String::from_utf8_lossy(&run.traced.stdout);
        // glibc 2.36 rounds a non-power-of-two alignment up in aligned_alloc.
        assert!(
            text.contains("aligned_alloc(24, 48): null=0 errno=0"),
            "{text}"
        );
        assert!(text.contains("free keeps errno: 4321"), "{text}");
        assert!(
            text.contains("posix_memalign(128, 512): rc=0 errno=1234"),
            "{text}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Descriptors the program closes and reuses

/// The program closes every descriptor above stderr and opens its own pipe (fed with bytes
/// that are signal numbers), file and listening socket on the freed numbers: it reads back
/// exactly what it wrote, its file holds only its lines, it ends as it ends without the tool
/// (exit 0, or SIGTERM/SIGHUP by default action, without hanging), and the run still gets its
/// dump or report, the leak counted, through descriptors made again.
#[test]
fn descriptors_closed_and_reused_by_the_program() {
    let dir = Scratch::new("fd-bin");
    let prog = build(dir.path(), "fd_reuse.c", &[]);
    let prog = prog.to_str().unwrap();
    for ending in ["exit", "sigterm", "sighup"] {
        let events = Pair::run(&[], &[prog, ending], &[]);
        let stdout = String::from_utf8_lossy(&events.traced.stdout);
        assert!(stdout.contains("pipe gave 4 bytes: 1 2 15 42"), "{stdout}");
        assert!(
            stdout.contains("program.txt: 50 lines, all mine"),
            "{stdout}"
        );
        let dump = std::fs::read_dir(events.run_dir().join("device_cpu/dump"))
            .unwrap_or_else(|e| panic!("no dump ({ending}): {e}\n{}", events.stderr()))
            .count();
        assert_eq!(dump, 1, "{}", events.stderr());

        let host = Pair::run(&["--analysis=host-leaks"], &[prog, ending], &[]);
        let overview = host.overview();
        assert_eq!(
            overview.expect_function("leak_after_close_range").0,
            (4, 4 * 5000)
        );
    }
}

// ------------------------------------------------------------------------------------------
// Full disks, cut files

/// A small file system, mounted for one test and unmounted when it ends.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// A tmpfs with mount `options` (`size=160k`, `ro,size=16k`).
    fn mount(at: &Path, options: &str) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(at)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs (as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The disk fills during an event dump: the program runs as without the tool, the console says
/// the dump is incomplete and why, and the dump's rows up to the cut are readable (the cut last
/// row left out with one warning naming it).
#[test]
fn a_full_disk_during_the_event_dump() {
    let dir = Scratch::new("disk-bin");
    let prog = build_with_mstx(dir.path(), "many_marks.c");
    let scratch = Scratch::new("disk");
    let out = scratch.path().join("out");
    let disk = SmallDisk::mount(&out, "size=160k");
    let mut cmd = Command::new(BIN);
    cmd.arg("-o")
        .arg(&out)
        .arg(&prog)
        .current_dir(scratch.path());
    cmd.env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut cmd);
    let traced = output_with_timeout(cmd);
    let stderr = String::from_utf8_lossy(&traced.stderr).into_owned();
    assert_eq!(String::from_utf8_lossy(&traced.stdout), "marked 20000\n");
    assert_eq!(traced.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("msmemscope: event dump (INCOMPLETE: ")
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
    // Read back off the full disk: a copy of the run, reported on.
    let run = std::fs::read_dir(&out)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let copy = scratch.path().join("copy");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&run)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    drop(disk);
    let dumps: Vec<PathBuf> = std::fs::read_dir(copy.join("device_cpu/dump"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dumps.len(), 1);
    let bytes = std::fs::read(&dumps[0]).unwrap();
    assert_ne!(bytes.last(), Some(&b'\n'), "the disk filled mid-row");
    let rows = msmemscope_core::events::reader::open(&dumps[0])
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .expect("every row before the cut is read");
    let complete_lines = bytes.iter().filter(|&&b| b == b'\n').count();
    assert_eq!(
        rows.len(),
        complete_lines - 1,
        "all complete rows, header aside"
    );
    let report = Command::new(BIN).arg("report").arg(&copy).output().unwrap();
    let said = String::from_utf8_lossy(&report.stderr);
    assert_eq!(report.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "{}:{}: the last row is cut off",
            dumps[0].display(),
            complete_lines + 1
        )),
        "{said}"
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
    let mut zombie = Command::new("true").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let run = Command::new(BIN)
        .arg(format!("--pid={}", zombie.id()))
        .arg("--command=help")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(&format!("process {} has exited", zombie.id())),
        "{stderr}"
    );
    zombie.wait().unwrap();

    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    // SAFETY: stops the child this test started.
    unsafe { libc::kill(sleeper.id() as i32, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let run = Command::new(BIN)
        .arg(format!("--pid={}", sleeper.id()))
        .arg("--command=help")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(&format!("process {} is stopped", sleeper.id())),
        "{stderr}"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

/// A program built without PIE that takes `free`'s address makes its own PLT entry the address
/// of `free` for the whole process. The runtime still points the program's lazy GOT slot at its
/// own hook (not at that PLT entry, which would jump to itself forever): the program ends as
/// without the tool, in both modes, and its leak is counted. (gcc's cc1plus is such a program.)
#[test]
fn a_program_without_pie_that_takes_free_s_address() {
    let dir = Scratch::new("nopie-bin");
    let exe = build(
        dir.path(),
        "nopie_free_pointer.c",
        &["-no-pie", "-fno-pie", "-Wl,-z,lazy"],
    );
    let exe = exe.to_str().unwrap();
    Pair::run(&["-q"], &[exe], &[]);
    let host = Pair::run(&["--analysis=host-leaks"], &[exe], &[]);
    assert_eq!(String::from_utf8_lossy(&host.traced.stdout), "done\n");
    assert_eq!(
        host.overview().expect_function("leak_without_pie").0,
        (1, 77)
    );
}

// ------------------------------------------------------------------------------------------
// Memory pressure

/// The program exhausts its address space (its own RLIMIT_AS), so the runtime's allocations
/// fail too: the program runs to its normal end, and the report is written and says accounting
/// stopped because the runtime's memory ran out.
#[test]
fn memory_pressure_never_ends_the_program() {
    let dir = Scratch::new("pressure-bin");
    let exe = build(dir.path(), "memory_pressure.c", &[]);
    let run = Pair::host_leaks(&exe);
    assert_eq!(
        String::from_utf8_lossy(&run.traced.stdout),
        "exhausted: 1, recovered\n"
    );
    let overview = run.overview();
    assert!(
        overview
            .h("Truncation")
            .starts_with("bits=12 (bit3 the runtime's own memory ran out"),
        "{}",
        overview.h("Truncation")
    );
    assert!(
        overview.verdict().starts_with(
            "INCOMPLETE, not usable as a leak conclusion: accounting stopped when the runtime's \
             own memory ran out"
        ),
        "{}",
        overview.verdict()
    );
}

// ------------------------------------------------------------------------------------------
// Threads, signals and exit

/// A program that takes every pthread key it can and exits: the runtime's exit path needs no
/// key (its threads are raw pthreads), so the program ends as it would and the report is there.
#[test]
fn a_program_that_uses_every_pthread_key() {
    let dir = Scratch::new("keys-bin");
    let exe = build(dir.path(), "all_tls_keys.c", &["-lpthread"]);
    let exe = exe.to_str().unwrap();
    Pair::run(&["-q"], &[exe], &[]);
    let host = Pair::run(&["--analysis=host-leaks"], &[exe], &[]);
    assert_eq!(
        host.overview().expect_function("leak_with_no_keys_left").0,
        (2, 1400)
    );
}

/// A program that execs right after its last events: they are in the dump (the exec waits for
/// the writer), and the program's output and status are those of the image it became.
#[test]
fn events_before_an_exec_reach_the_dump() {
    let dir = Scratch::new("exec-bin");
    let exe = build_with_mstx(dir.path(), "marks_then_exec.c");
    let run = Pair::run(&["-q"], &[exe.to_str().unwrap()], &[]);
    assert_eq!(run.dump_lines_with("before exec "), 500, "{}", run.stderr());
}

/// The common PyTorch deployment: jemalloc preloaded for a Python program that imports torch
/// (C++ blocks from jemalloc's own operator new reach the hooked free). Both modes run it as
/// without the tool.
#[test]
fn pytorch_with_jemalloc_preloaded() {
    let python = venv_python();
    let jemalloc = debian_library("libjemalloc.so.2");
    let env = [("LD_PRELOAD", jemalloc.to_str().unwrap())];
    let script = "import torch\n\
                  x = torch.ones(256, 256)\n\
                  kept = [x @ x for _ in range(3)]\n\
                  print(float(kept[0].sum()))\n";
    let program = [python.to_str().unwrap(), "-c", script];
    for mode in [&["-q"][..], &["-q", "--analysis=host-leaks"][..]] {
        let run = Pair::run(mode, &program, &env);
        assert_eq!(
            String::from_utf8_lossy(&run.traced.stdout),
            "16777216.0\n",
            "{}",
            run.stderr()
        );
    }
}

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

/// Allocations made on a stack the program switched to (makecontext/swapcontext, the stack from
/// malloc) keep the frames that can be walked, each read checked, ending at the fiber's root.
#[test]
fn allocations_on_a_fiber_stack_keep_their_frames() {
    let dir = Scratch::new("fiber-bin");
    let exe = build(dir.path(), "fiber_stack.c", &[]);
    let run = Pair::host_leaks(&exe);
    let overview = run.overview();
    assert_eq!(overview.expect_function("leak_on_the_fiber").0, (3, 4500));
    let site = overview.expect_site("leak_on_the_fiber");
    assert!(
        site.frames[1].starts_with("fiber ") && site.frames[1].contains("fiber_stack.c:15"),
        "{:?}",
        site.frames
    );
}

/// A program that exits with every descriptor taken: the runtime kept one in reserve for its
/// report, which is written with the program's leak.
#[test]
fn a_program_out_of_descriptors() {
    let dir = Scratch::new("nofd-bin");
    let exe = build(dir.path(), "no_fds_left.c", &[]);
    let run = Pair::host_leaks(&exe);
    assert_eq!(
        String::from_utf8_lossy(&run.traced.stdout),
        "out of descriptors: 1\n"
    );
    assert_eq!(
        run.overview()
            .expect_function("leak_with_no_descriptors_left")
            .0,
        (2, 1600)
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
