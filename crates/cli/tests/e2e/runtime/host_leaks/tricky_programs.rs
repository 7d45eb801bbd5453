//! End-to-end host-leak runs of whole programs whose shape once broke the runtime: a Rust
//! binary and a C program whose first allocation on a thread happens inside
//! `pthread_getattr_np` (a hang), a library opened with `RTLD_DEEPBIND` (false leaks), 400
//! short threads (the runtime's own bookkeeping counted as pre-window frees), libc frames left
//! unnamed though its debug symbols were installed. Fixtures are in
//! tests/fixtures/programs/, built here with gcc and rustc, and run under the real
//! `msmemscope-cli --analysis=host-leaks` with the harness's hang timeout.
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary),
//! gcc and rustc on PATH; Debian's libc6-dbg for the debug-symbol test (installed here when
//! running as root, as scripts/test.sh does; skipped when it cannot be had).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::attach_target::euid;
use crate::util::host_leak::*;
use crate::util::{fixture_src, gcc, runtime_lib, Scratch};

fn program_src(name: &str) -> PathBuf {
    fixture_src("programs").join(name)
}

/// Builds a C fixture into `dir` with `extra` gcc arguments after the source.
fn build_c(dir: &Path, src: &str, out: &str, extra: &[&str]) -> PathBuf {
    runtime_lib();
    let prog = dir.join(out);
    let src = program_src(src);
    let mut args = vec![
        "-O2",
        "-g",
        "-fomit-frame-pointer",
        "-pthread",
        src.to_str().unwrap(),
        "-o",
        prog.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    gcc(&args);
    prog
}

fn pre_window_frees(ov: &Overview) -> (u64, u64) {
    count_bytes(ov.h("Pre-window frees"))
}

/// The listed sites with a frame in `function`.
fn sites_through<'a>(ov: &'a Overview, function: &str) -> Vec<&'a Site> {
    let prefix = format!("{function} ");
    ov.sites
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.starts_with(&prefix)))
        .collect()
}

// ------------------------------------------------------------------------------------------
// 1. Stack bounds without pthread_getattr_np

#[test]
fn rust_binary_finishes_and_reports_its_leak() {
    runtime_lib();
    let scratch = Scratch::new("rust-prog");
    let prog = scratch.path().join("rust_vec_leak");
    let out = Command::new("rustc")
        .args(["-C", "opt-level=0", "-g", "--edition", "2021", "-o"])
        .arg(&prog)
        .arg(program_src("rust_vec_leak.rs"))
        .output()
        .expect("cannot run rustc");
    assert!(
        out.status.success(),
        "rustc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = run_tool_cmd(&[], &[], prog.to_str().unwrap(), &[]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "hi\n");
    let ov = run.overview();
    let main = sites_through(&ov, "rust_vec_leak::main");
    assert_eq!(main.len(), 1, "{}", ov.text);
    assert_eq!(
        (main[0].unfreed, main[0].allocated, main[0].freed),
        ((1, 1000), (1, 1000), (0, 0)),
        "{}",
        ov.text
    );
    assert_eq!(pre_window_frees(&ov), (0, 0), "{}", ov.text);
    // The rest is std's own start-up state.
    for s in &ov.sites {
        if s.label != main[0].label {
            assert!(
                s.frames.iter().any(|f| f.starts_with("std::rt::")),
                "unexpected unfreed site {s:?}\n{}",
                ov.text
            );
        }
    }
    ov.check_sites_sum_to_total();
}

#[test]
fn first_allocation_inside_pthread_getattr_np_does_not_hang() {
    let scratch = Scratch::new("getattr");
    let prog = build_c(scratch.path(), "getattr_np.c", "getattr_np", &[]);
    let plain = run_plain_cmd(&prog, &[]);
    assert_exited(&plain, 0, "plain run");
    let run = run_tool_cmd(&[], &[], prog.to_str().unwrap(), &[]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "getattr done\n");
    let ov = run.overview();
    assert_eq!(
        ov.expect_function("leak_in_main"),
        ((1, 3333), (1, 3333), (0, 0))
    );
    assert_eq!(
        ov.expect_function("leak_in_thread"),
        ((1, 4444), (1, 4444), (0, 0))
    );
    assert_eq!(pre_window_frees(&ov), (0, 0), "{}", ov.text);
    // The rest is glibc's: stdout's buffer and the thread's TLS vector (its stack is cached).
    for s in &ov.sites {
        let first = s.first_function();
        if first != "leak_in_main" && first != "leak_in_thread" {
            assert!(
                s.frames
                    .iter()
                    .any(|f| f.starts_with("_IO_puts ") || f.starts_with("pthread_create ")),
                "unexpected unfreed site {s:?}\n{}",
                ov.text
            );
        }
    }
    ov.check_sites_sum_to_total();
}

// ------------------------------------------------------------------------------------------
// 2. RTLD_DEEPBIND

/// `mode` is the program's `dlopen` binding ("now" or "lazy"); `link` the library's GOT
/// layout: `-z now` puts every slot in the read-only RELRO part, written only through
/// `mprotect`, while the default keeps the PLT slots writable (and, under "lazy", unresolved
/// until first called).
fn deepbind(mode: &str, link: &[&str]) {
    const N: u64 = 500;
    let scratch = Scratch::new("deepbind");
    let lib_dir = scratch.path().join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libdeepbind_lib.so");
    let lib_src = program_src("deepbind_lib.c");
    let mut args = vec![
        "-shared",
        "-fPIC",
        "-O2",
        "-g",
        "-fomit-frame-pointer",
        lib_src.to_str().unwrap(),
        "-o",
        lib.to_str().unwrap(),
    ];
    args.extend_from_slice(link);
    gcc(&args);
    // RUNPATH, not RPATH: the program finds the library only through its own $ORIGIN.
    let prog = build_c(
        scratch.path(),
        "deepbind_main.c",
        "deepbind_main",
        &["-ldl", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib"],
    );
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&prog)
        .output()
        .expect("cannot run readelf");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        dynamic.contains("(RUNPATH)") && dynamic.contains("[$ORIGIN/lib]"),
        "{dynamic}"
    );
    let n = N.to_string();
    let plain = run_plain_cmd(&prog, &[mode, &n]);
    assert_exited(&plain, 0, "plain run");
    let run = run_tool_cmd(&[], &[], prog.to_str().unwrap(), &[mode, &n]);
    assert_exited(
        &run.out,
        0,
        "tool run (the library must load through RUNPATH $ORIGIN)",
    );
    assert_eq!(run.stdout(), format!("deepbind {mode} done\n"));
    let ov = run.overview();
    // Before the fix: a deep_churn site with N unfreed 64-byte blocks.
    assert_eq!(
        sites_through(&ov, "deep_churn"),
        Vec::<&Site>::new(),
        "the library's own frees were missed:\n{}",
        ov.text
    );
    let leak = sites_through(&ov, "deep_leak");
    assert_eq!(leak.len(), 1, "{}", ov.text);
    assert_eq!(
        (leak[0].unfreed, leak[0].allocated, leak[0].freed),
        ((1, 200), (1, 200), (0, 0)),
        "{}",
        ov.text
    );
    assert_eq!(leak[0].frames[0].split(' ').next(), Some("strdup"));
    assert_eq!(pre_window_frees(&ov), (0, 0), "{}", ov.text);
    // Everything else left is the loader's and stdio's, none of it the library's.
    for s in &ov.sites {
        if s.label != leak[0].label {
            assert!(
                s.frames
                    .iter()
                    .any(|f| f.starts_with("dlopen ") || f.starts_with("printf ")),
                "unexpected unfreed site {s:?}\n{}",
                ov.text
            );
        }
    }
    // The library's N churned blocks were tracked and their frees seen.
    assert!(ov.allocations_tracked().0 > N, "{}", ov.text);
    assert!(ov.frees_tracked().0 >= N, "{}", ov.text);
    assert_eq!(
        ov.allocations_tracked().0 - ov.frees_tracked().0,
        ov.total_unfreed.0
    );
    ov.check_sites_sum_to_total();
}

#[test]
fn deepbind_library_frees_are_seen_now() {
    deepbind("now", &[]);
}

#[test]
fn deepbind_library_frees_are_seen_now_with_read_only_got() {
    deepbind("now", &["-Wl,-z,relro,-z,now"]);
}

#[test]
fn deepbind_library_frees_are_seen_lazy() {
    deepbind("lazy", &[]);
}

// ------------------------------------------------------------------------------------------
// 3. The runtime's own per-thread bookkeeping

#[test]
fn thread_bookkeeping_is_not_a_pre_window_free() {
    const THREADS: u64 = 400;
    let scratch = Scratch::new("threads400");
    let prog = build_c(scratch.path(), "threads400.c", "threads400", &[]);
    let run = run_tool_cmd(&[], &[], prog.to_str().unwrap(), &[]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "threads done\n");
    let ov = run.overview();
    // Before the fix: one 40-byte free per thread (the runtime's thread-local destructor
    // entry) and the cache-turnover NOTE.
    assert_eq!(pre_window_frees(&ov), (0, 0), "{}", ov.text);
    assert!(!ov.text.contains("NOTE: pre-window frees"), "{}", ov.text);
    // glibc's own blocks: one TLS vector per new thread stack (4 stay with the cached stacks)
    // and stdout's buffer.
    let tls = sites_through(&ov, "_dl_allocate_tls");
    assert_eq!(tls.len(), 1, "{}", ov.text);
    let (tls_allocated, tls_freed) = (tls[0].allocated, tls[0].freed);
    assert_eq!(tls_allocated.0, THREADS, "{}", ov.text);
    assert_eq!(tls[0].unfreed.0, 4, "{}", ov.text);
    let stdout = sites_through(&ov, "_IO_file_doallocate");
    assert_eq!(stdout.len(), 1, "{}", ov.text);
    let buffer = stdout[0].allocated;
    assert_eq!(stdout[0].unfreed, buffer);
    // Exactly the program's 400 blocks of 100 bytes besides those.
    assert_eq!(
        ov.allocations_tracked(),
        (
            THREADS + tls_allocated.0 + buffer.0,
            THREADS * 100 + tls_allocated.1 + buffer.1
        ),
        "{}",
        ov.text
    );
    assert_eq!(
        ov.frees_tracked(),
        (THREADS + tls_freed.0, THREADS * 100 + tls_freed.1),
        "{}",
        ov.text
    );
    assert_eq!(ov.sites.len(), 2, "{}", ov.text);
    ov.check_sites_sum_to_total();
}

// ------------------------------------------------------------------------------------------
// 4. Names from installed debug symbols

/// The libc this process runs on, the one the fixtures are linked against.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no libc.so.6 in /proc/self/maps:\n{maps}"))
}

/// Where a debug package installs `module`'s debug file: `/usr/lib/debug/.build-id/xx/yyyy.debug`
/// for its build-id (from `readelf -n`).
fn build_id_debug_file(module: &Path) -> PathBuf {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(module)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf (binutils): {e}"));
    let notes = String::from_utf8_lossy(&out.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build-id:\n{notes}", module.display()));
    PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ))
}

/// libc's installed debug file, installing Debian's libc6-dbg when it is missing and this runs
/// as root; `None` (the test skips) when it cannot be had.
fn libc_debug_file() -> Option<PathBuf> {
    let libc = libc_path();
    let debug = build_id_debug_file(&libc);
    if !debug.is_file() && euid() == 0 {
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "libc6-dbg"])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !install() {
            let _ = Command::new("apt-get").args(["update", "-qq"]).output();
            install();
        }
    }
    if debug.is_file() {
        return Some(debug);
    }
    eprintln!(
        "skipped: {} has no installed debug file {} (Debian's libc6-dbg), and it could not be \
         installed (needs root and apt-get)",
        libc.display(),
        debug.display()
    );
    None
}

#[test]
fn libc_frames_are_named_from_installed_debug_symbols() {
    if libc_debug_file().is_none() {
        return;
    }
    let scratch = Scratch::new("libc-frames");
    let prog = build_c(scratch.path(), "libc_frames.c", "libc_frames", &[]);
    let run = run_tool_cmd(&[], &[], prog.to_str().unwrap(), &[]);
    assert_exited(&run.out, 0, "tool run");
    let ov = run.overview();
    assert_eq!(ov.sites.len(), 1, "{}", ov.text);
    let site = &ov.sites[0];
    assert_eq!(site.unfreed, (1, 2222), "{}", ov.text);
    let functions: Vec<&str> = site
        .frames
        .iter()
        .map(|f| f.split(' ').next().unwrap())
        .collect();
    // Before: `?? (libc.so.6+0x2724a)` below main, as libc's own table has no local names.
    assert_eq!(
        functions,
        [
            "leak_here",
            "main",
            "__libc_start_call_main",
            "__libc_start_main",
            "_start"
        ],
        "{}",
        ov.text
    );
    // The debug file's DWARF gives libc's frames their source lines too.
    assert!(
        site.frames[2].starts_with("__libc_start_call_main nptl/libc_start_call_main.h:"),
        "{}",
        ov.text
    );
    assert!(
        site.frames[3].starts_with("__libc_start_main csu/libc-start.c:"),
        "{}",
        ov.text
    );
    assert_eq!(
        ov.h("Symbolization coverage"),
        "100.0% (5/5 reported frames resolved to a function)"
    );
}

/// `--follow exec` (the default) in host-leak mode: the program a wrapper shell starts gets a
/// window and report of its own, in a run directory linked to the job, and the launcher prints
/// it; `--follow=none` leaves it untraced.
#[test]
fn a_wrapper_shells_child_has_its_own_report() {
    let scratch = Scratch::new("follow");
    let exe = build_c(scratch.path(), "child_leaker.c", "child_leaker", &[]);
    let line = format!("{} 4; echo after", exe.display());

    // bash, not dash: dash ends with `_exit`, so it writes no report of its own.
    let run = run_tool_cmd(&[], &[], "bash", &["-c", &line]);
    assert_exited(&run.out, 0, "bash under the tool");
    assert_eq!(run.stdout(), "child leaked 4\nafter\n");
    let out = run.scratch.path().join("out");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 2, "{dirs:?}");
    let configs: Vec<serde_json::Value> = dirs
        .iter()
        .map(|d| {
            serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
        })
        .collect();
    let child = configs
        .iter()
        .position(|c| c.get("job").is_some())
        .expect("a followed run");
    let job = &configs[child]["job"];
    assert_eq!(job["job_run"], dirs[1 - child].to_string_lossy().as_ref());
    assert_eq!(
        job["command"],
        serde_json::json!([exe.to_string_lossy(), "4"])
    );
    let text = std::fs::read_to_string(dirs[child].join("host_leak/leak_overview_1.txt")).unwrap();
    let ov = Overview::parse(&text);
    assert_eq!(ov.expect_function("leak_in_child").0, (4, 1332), "{text}");
    let pid = dirs[child]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .split('_')
        .nth(1)
        .unwrap()
        .to_string();
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!(
            "msmemscope: traced process {pid}: {} 4\n",
            exe.display()
        )),
        "{stderr}"
    );
    // The shell's own report is the job's, without the child's blocks.
    let shell =
        std::fs::read_to_string(dirs[1 - child].join("host_leak/leak_overview_1.txt")).unwrap();
    assert!(
        Overview::parse(&shell)
            .by_function("leak_in_child")
            .is_none(),
        "{shell}"
    );

    let alone = run_tool_cmd(&["--follow=none"], &[], "bash", &["-c", &line]);
    assert_exited(&alone.out, 0, "bash under the tool, --follow=none");
    assert_eq!(alone.stdout(), "child leaked 4\nafter\n");
    let dir = alone.run_dir();
    assert!(
        !alone.stderr().contains("traced process"),
        "{}",
        alone.stderr()
    );
    let shell = std::fs::read_to_string(dir.join("host_leak/leak_overview_1.txt")).unwrap();
    assert!(
        Overview::parse(&shell)
            .by_function("leak_in_child")
            .is_none(),
        "{shell}"
    );
}
