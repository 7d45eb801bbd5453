//! What a program does with the heap and the process's resources: other allocators and the
//! edges of glibc's malloc API, descriptors closed, reused or used up, a disk that fills,
//! memory that runs out, every pthread key taken, a stack of its own.

use std::path::PathBuf;
use std::process::Command;

use super::{build, build_with_mstx, debian_library, Pair, SmallDisk};
use crate::util::host_leak::clear_runtime_knobs;
use crate::util::{output_with_timeout, venv_python, Scratch, BIN};

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
// Descriptors the program closes, reuses or uses up

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

// ------------------------------------------------------------------------------------------
// Full disks, cut files

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
// Memory pressure, thread keys, other stacks

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
