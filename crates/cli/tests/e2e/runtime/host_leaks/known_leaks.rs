//! End-to-end host leak detection (docs/analyses.md#host-leaks): the real `msmemscope-cli` launches
//! C fixture programs (tests/fixtures/host_leaks.c, tests/fixtures/dl_leaker.c, built here with
//! gcc) with the preloaded runtime, and the tests check the written overview / block detail against
//! the fixtures' known heap behaviour, exactly where it is knowable.
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary)
//! and gcc on PATH.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Output;

use crate::util::built_once;
use crate::util::host_leak::*;

// ------------------------------------------------------------------------------------------
// Fixture builds

/// tests/fixtures/host_leaks.c, built once per test process.
pub(super) fn prog() -> PathBuf {
    built_once(
        "host-leaks",
        "host_leaks.c",
        "host_leaks",
        &["-O2", "-g", "-fomit-frame-pointer", "-pthread"],
        &["-ldl"],
    )
}

/// tests/fixtures/dl_leaker.c, the library the fixture opens with dlopen.
fn dl_lib() -> PathBuf {
    built_once(
        "host-leaks",
        "dl_leaker.c",
        "libdl_leaker.so",
        &["-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-g"],
        &[],
    )
}

/// The fixture program on its own, without the tool.
pub(super) fn run_plain(args: &[&str]) -> Output {
    run_plain_cmd(&prog(), args)
}

/// Runs the fixture with `tool_args` before it and `env` set (the MSMEMSCOPE_HOST_* knobs
/// are cleared first, then MSMEMSCOPE_HOST_TOP_N=1024 unless `env` sets it).
pub(super) fn run_tool(tool_args: &[&str], env: &[(&str, &str)], target: &[&str]) -> Run {
    run_tool_cmd(tool_args, env, prog().to_str().unwrap(), target)
}

// ------------------------------------------------------------------------------------------
// 1. Leak sites

#[test]
fn every_leak_site_is_reported_exactly() {
    let plain = run_plain(&["sites"]);
    assert_exited(&plain, 0, "plain run");
    let run = run_tool(&[], &[], &["sites"]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(
        run.out.stdout, plain.stdout,
        "target stdout must pass through untouched"
    );
    assert_eq!(run.stdout(), "sites done\n");

    // The launcher prints the overview on its stderr, then the report path.
    let text = run.overview_text();
    let report = run.run_dir().join("host_leak/leak_overview_1.txt");
    let stderr = run.stderr();
    let want_tail = format!("msmemscope: host leak report: {}\n", report.display());
    assert!(
        stderr.ends_with(&want_tail),
        "stderr must end with {want_tail:?}:\n{stderr}"
    );
    assert!(
        stderr.contains(text.trim_end()),
        "stderr must carry the overview:\n{stderr}"
    );
    assert_eq!(
        run.host_leak_files(),
        ["leak_overview_1.txt", "leak_sites_1.json"],
        "summary mode writes no CSV"
    );

    let ov = run.overview();
    assert_eq!(ov.h("Report mode"), "summary");
    assert_eq!(ov.truncation_bits(), 0);
    assert_eq!(ov.unattributed(), 0);
    assert_eq!(ov.overflow_channel(), ((0, 0), (0, 0)));
    assert_eq!(ov.verdict(), "complete window data");
    assert_eq!(ov.h("Sample rate"), "1 (every allocation tracked)");
    assert_eq!(ov.h("Block size threshold"), "0 (all sizes tracked)");

    // (function, unfreed, allocated, freed) — exact, from the fixture's contract.
    let expected: &[(&str, Counts, Counts, Counts)] = &[
        ("leak_table_at_start", (1, 40000), (1, 40000), (0, 0)),
        ("leak_steady_growth", (50, 10000), (50, 10000), (0, 0)),
        ("leak_posix_memalign", (1, 1000), (1, 1000), (0, 0)),
        ("leak_aligned_alloc", (1, 2048), (1, 2048), (0, 0)),
        ("leak_memalign", (1, 3000), (1, 3000), (0, 0)),
        // valloc / pvalloc record the requested size, not the page-rounded one.
        ("leak_valloc", (1, 5000), (1, 5000), (0, 0)),
        ("leak_pvalloc", (1, 6000), (1, 6000), (0, 0)),
        ("leak_calloc", (1, 7000), (1, 7000), (0, 0)),
        // The malloc(100) site is fully freed (by the first realloc) and so not listed; the
        // realloc call site allocated 200+400+800+1600 and freed the first three.
        ("leak_realloc_chain", (1, 1600), (4, 3000), (3, 1400)),
        ("thread_leaker_1", (10, 1100), (10, 1100), (0, 0)),
        ("thread_leaker_2", (20, 4200), (20, 4200), (0, 0)),
        ("thread_leaker_3", (30, 9300), (30, 9300), (0, 0)),
        ("thread_leaker_4", (40, 16400), (40, 16400), (0, 0)),
        ("ring_push", (16, 1920), (100, 12000), (84, 10080)),
    ];
    let mut known = (0, 0);
    for &(function, unfreed, allocated, freed) in expected {
        let got = ov.expect_function(function);
        assert_eq!(
            got,
            (unfreed, allocated, freed),
            "site {function} in:\n{text}"
        );
        known = (known.0 + unfreed.0, known.1 + unfreed.1);
    }
    // Each of the single-call-site leaks is exactly one site.
    for function in [
        "leak_table_at_start",
        "leak_posix_memalign",
        "leak_aligned_alloc",
        "leak_memalign",
        "leak_valloc",
        "leak_pvalloc",
        "leak_calloc",
        "ring_push",
    ] {
        let n = ov
            .sites
            .iter()
            .filter(|s| s.first_function() == function)
            .count();
        assert_eq!(n, 1, "{function} must be one site in:\n{text}");
    }
    // Frames carry file:line of the fixture for the program's own functions.
    let table = ov.expect_site("leak_table_at_start");
    assert!(
        table.frames[0].contains("host_leaks.c:"),
        "frame {:?}",
        table.frames[0]
    );
    assert!(
        table.frames.iter().any(|f| f.starts_with("main ")),
        "no main frame: {:?}",
        table.frames
    );

    // Temporaries are not leaks.
    assert!(
        ov.by_function("temp_churn").is_none(),
        "temp_churn listed as a leak site:\n{text}"
    );
    for s in &ov.sites {
        assert!(
            !s.frames.iter().any(|f| f.starts_with("temp_churn ")),
            "temp_churn in {s:?}"
        );
    }
    // No stdio buffer: stdout is unbuffered in the fixture.
    assert!(
        !text.contains("_IO_file_doallocate"),
        "unexpected stdio buffer site:\n{text}"
    );

    ov.check_sites_sum_to_total();
    assert_eq!(ov.overflow_unfreed, (0, 0));
    // Whatever else is unfreed (libc thread bookkeeping) is on top of the known leaks.
    assert!(ov.total_unfreed.0 >= known.0 && ov.total_unfreed.1 >= known.1);
    // temp_churn: 2000 allocations and frees; ring 100; the known sites above.
    let tracked = ov.allocations_tracked();
    assert!(
        tracked.0 >= 2000 + 100 + 50 + 10 + 5 + 100,
        "allocations tracked {tracked:?}"
    );
    assert_eq!(
        ov.allocations_tracked().0 - ov.frees_tracked().0,
        ov.total_unfreed.0,
        "allocations - frees must equal unfreed blocks in a complete window without sampling:\n{text}"
    );
    assert_eq!(
        ov.allocations_tracked().1 - ov.frees_tracked().1,
        ov.total_unfreed.1
    );
    // Size distribution of the known leaks alone is at least what the fixture puts there.
    let bucket = |name: &str| {
        ov.unfreed_dist
            .iter()
            .find(|r| r.0 == name)
            .unwrap()
            .clone()
    };
    assert!(bucket("32kB-256kB").1 >= 1 && bucket("32kB-256kB").2 >= 40000);
    assert!(
        bucket("4kB-32kB").1 >= 3,
        "valloc, pvalloc, calloc: {:?}",
        bucket("4kB-32kB")
    );
}

// ------------------------------------------------------------------------------------------
// 2. Caps lowered by environment

/// The "plain" fixture mode: 605 allocations (53800 bytes), 300 frees (14400 bytes), 305
/// blocks / 39400 bytes unfreed, from plain_keep (300 / 14400) and plain_big (5 / 25000).
const PLAIN_STDOUT: &str = "plain done: 305 blocks kept\n";

#[test]
fn plain_mode_counts_are_exact() {
    let run = run_tool(&[], &[], &["plain"]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), PLAIN_STDOUT);
    let ov = run.overview();
    assert_eq!(ov.allocations_tracked(), (605, 53800));
    assert_eq!(ov.frees_tracked(), (300, 14400));
    assert_eq!(ov.total_unfreed, (305, 39400));
    assert_eq!(ov.truncation_bits(), 0);
    assert_eq!(ov.expect_function("plain_keep").0, (300, 14400));
    assert_eq!(ov.expect_function("plain_big").0, (5, 25000));
    assert!(ov.by_function("plain_drop").is_none());
    assert_eq!(
        ov.sites.len(),
        2,
        "only plain_keep and plain_big leak:\n{}",
        ov.text
    );
    ov.check_sites_sum_to_total();
    let bucket = |name: &str| {
        ov.unfreed_dist
            .iter()
            .find(|r| r.0 == name)
            .unwrap()
            .clone()
    };
    assert_eq!(bucket("0-256B"), ("0-256B".into(), 300, 14400));
    assert_eq!(bucket("4kB-32kB"), ("4kB-32kB".into(), 5, 25000));
}

#[test]
fn block_table_overflow_keeps_totals_exact() {
    let plain = run_plain(&["plain"]);
    assert_exited(&plain, 0, "plain run");
    let run = run_tool(&[], &[("MSMEMSCOPE_HOST_BLOCK_CAP", "64")], &["plain"]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.out.stdout, plain.stdout);
    assert_eq!(run.stdout(), PLAIN_STDOUT);
    let ov = run.overview();
    assert_eq!(
        ov.truncation_bits() & 1,
        1,
        "bit0 must be set:\n{}",
        ov.text
    );
    assert_eq!(
        ov.truncation_bits() & 4,
        0,
        "accounting must not stop:\n{}",
        ov.text
    );
    let (ovf_alloc, ovf_free) = ov.overflow_channel();
    assert!(ovf_alloc.0 > 0, "overflow allocations:\n{}", ov.text);
    // Same totals as without caps.
    assert_eq!(ov.allocations_tracked(), (605, 53800));
    assert_eq!(ov.frees_tracked(), (300, 14400));
    assert_eq!(
        ov.total_unfreed,
        (305, 39400),
        "Total Unfreed must stay exact:\n{}",
        ov.text
    );
    assert_eq!(
        ov.overflow_unfreed,
        (ovf_alloc.0 - ovf_free.0, ovf_alloc.1 - ovf_free.1),
        "overflow unfreed vs overflow channel counts:\n{}",
        ov.text
    );
    ov.check_sites_sum_to_total();
    assert!(
        !ov.verdict().contains("not usable"),
        "verdict {:?}",
        ov.verdict()
    );
}

#[test]
fn overflow_ledger_full_stops_accounting_and_says_so() {
    let plain = run_plain(&["plain"]);
    let run = run_tool(
        &[],
        &[
            ("MSMEMSCOPE_HOST_BLOCK_CAP", "64"),
            ("MSMEMSCOPE_HOST_OVERFLOW_CAP", "10"),
        ],
        &["plain"],
    );
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.out.status.code(), plain.status.code());
    assert_eq!(run.out.stdout, plain.stdout);
    let ov = run.overview();
    let bits = ov.truncation_bits();
    assert_eq!(bits & 5, 5, "bit0 and bit2 must be set:\n{}", ov.text);
    assert!(
        ov.h("Truncation").contains("bit2"),
        "{:?}",
        ov.h("Truncation")
    );
    assert!(
        ov.verdict().contains("not usable as a leak conclusion"),
        "verdict {:?}",
        ov.verdict()
    );
    assert!(ov.text.contains("not usable as a leak conclusion"));
    // The prefix recorded is less than the whole run.
    assert!(
        ov.allocations_tracked().0 < 605,
        "{:?}",
        ov.allocations_tracked()
    );
    ov.check_sites_sum_to_total();
}

#[test]
fn stack_table_cap_unknown_bucket_and_recycling() {
    // deep_alloc at recursion depths 0..15: 16 distinct stacks (all shorter than 20 frames).
    let base = run_tool(&[], &[], &["stacks", "keep", "16"]).overview();
    assert_eq!(base.distinct_stacks(), 16, "\n{}", base.text);
    assert_eq!(base.expect_function("deep_alloc").0, (16, 512));
    assert_eq!(base.truncation_bits(), 0);

    // All blocks kept: no dead stack to recycle; stacks past the cap go to the unknown bucket.
    let keep = run_tool(
        &[],
        &[("MSMEMSCOPE_HOST_STACK_CAP", "4")],
        &["stacks", "keep", "16"],
    );
    assert_exited(&keep.out, 0, "tool run");
    assert_eq!(keep.stdout(), "stacks done\n");
    let ov = keep.overview();
    assert_eq!(
        ov.truncation_bits() & 2,
        2,
        "bit1 must be set:\n{}",
        ov.text
    );
    assert_eq!(ov.distinct_stacks(), 4, "\n{}", ov.text);
    assert_eq!(ov.unattributed(), 12, "\n{}", ov.text);
    assert_eq!(ov.recycled(), 0);
    let unknown = ov
        .sites
        .iter()
        .find(|s| s.label == "unknown bucket")
        .expect("unknown bucket site");
    assert_eq!(unknown.unfreed, (12, 384));
    assert_eq!(ov.expect_function("deep_alloc").0, (4, 128));
    assert_eq!(ov.total_unfreed, (16, 512));
    ov.check_sites_sum_to_total();

    // All blocks freed at once: every stack is dead when the next one comes, so each new stack
    // past the cap recycles one.
    let free = run_tool(
        &[],
        &[("MSMEMSCOPE_HOST_STACK_CAP", "4")],
        &["stacks", "free", "16"],
    );
    assert_exited(&free.out, 0, "tool run");
    let ov = free.overview();
    assert_eq!(
        ov.truncation_bits() & 2,
        0,
        "no stack was refused:\n{}",
        ov.text
    );
    assert_eq!(ov.recycled(), 12, "\n{}", ov.text);
    assert_eq!(ov.distinct_stacks(), 16, "\n{}", ov.text);
    assert_eq!(ov.total_unfreed, (0, 0));
    assert_eq!(ov.allocations_tracked(), (16, 512));
    assert_eq!(ov.frees_tracked(), (16, 512));
}

// ------------------------------------------------------------------------------------------
// 3. Threshold and sampling

/// The "sizes" mode: 37 blocks of 100 bytes (20 kept), 8 blocks of 2000 bytes (5 kept).
#[test]
fn block_size_threshold_untracked_counts() {
    let all = run_tool(&[], &[], &["sizes"]).overview();
    assert_eq!(all.allocations_tracked(), (45, 19700));
    assert_eq!(all.frees_tracked(), (20, 7700));
    assert_eq!(all.total_unfreed, (25, 12000));
    assert_eq!(
        all.expect_function("size_small"),
        ((20, 2000), (37, 3700), (17, 1700))
    );
    assert_eq!(
        all.sites.len(),
        2,
        "one site each for size_small and size_large:\n{}",
        all.text
    );
    assert_eq!(
        all.expect_function("size_large"),
        ((5, 10000), (8, 16000), (3, 6000))
    );

    let run = run_tool(&["--block-size-threshold=1024"], &[], &["sizes"]);
    assert_exited(&run.out, 0, "tool run");
    let ov = run.overview();
    assert_eq!(
        ov.h("Block size threshold"),
        "1024 bytes -- untracked below threshold: 37 (3700 bytes)",
        "\n{}",
        ov.text
    );
    assert_eq!(ov.allocations_tracked(), (8, 16000));
    assert_eq!(ov.frees_tracked(), (3, 6000));
    assert_eq!(ov.total_unfreed, (5, 10000));
    assert_eq!(ov.sites.len(), 1, "only the large site:\n{}", ov.text);
    assert_eq!(
        ov.expect_function("size_large"),
        ((5, 10000), (8, 16000), (3, 6000))
    );
    assert!(ov.by_function("size_small").is_none());
    ov.check_sites_sum_to_total();
    let cfg = std::fs::read_to_string(run.run_dir().join("config.json")).unwrap();
    assert!(
        cfg.contains("\"block_size_threshold\": 1024"),
        "config.json:\n{cfg}"
    );
}

#[test]
fn sample_rate_is_rounded_and_reported() {
    let unsampled = run_tool(&[], &[], &["plain"]).overview();
    let run = run_tool(&["--sample-rate=3"], &[], &["plain"]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), PLAIN_STDOUT);
    let ov = run.overview();
    let line = ov.h("Sample rate");
    let prefix = "4, requested 3 -- SAMPLED VIEW";
    assert!(line.starts_with(prefix), "Sample rate line {line:?}");
    // ...; untracked: N (B bytes), F frees
    let untracked = line
        .split_once("untracked: ")
        .unwrap_or_else(|| panic!("no untracked in {line:?}"))
        .1;
    let (alloc_part, free_part) = untracked.split_once("), ").unwrap();
    let untracked_alloc = count_bytes(&format!("{alloc_part})"));
    let untracked_frees = num(free_part
        .strip_suffix(" frees")
        .unwrap_or_else(|| panic!("{line:?}")));
    let tracked = ov.allocations_tracked();
    assert_eq!(
        tracked.0 + untracked_alloc.0,
        605,
        "tracked + untracked allocations: {line:?}"
    );
    assert_eq!(
        tracked.1 + untracked_alloc.1,
        53800,
        "tracked + untracked bytes: {line:?}"
    );
    // A free the sampler skips is not looked up, so the program's 300 frees and the frees of
    // blocks from before the window (counted as pre-window frees in an unsampled run) add up
    // over tracked, untracked and pre-window frees.
    let pre_window_all = count_bytes(unsampled.h("Pre-window frees")).0;
    let pre_window = count_bytes(ov.h("Pre-window frees")).0;
    assert_eq!(
        ov.frees_tracked().0 + untracked_frees + pre_window,
        300 + pre_window_all,
        "tracked + untracked + pre-window frees: {line:?}"
    );
    assert!(
        tracked.0 > 0 && untracked_alloc.0 > 0,
        "a 1/4 sample of 605: {line:?}"
    );
    // Sampled unfreed never exceeds the real unfreed.
    assert!(ov.total_unfreed.0 <= 305 && ov.total_unfreed.1 <= 39400);
    ov.check_sites_sum_to_total();
    for s in &ov.sites {
        assert!(
            ["plain_keep", "plain_big"].contains(&s.first_function()),
            "{s:?}"
        );
    }
    let cfg = std::fs::read_to_string(run.run_dir().join("config.json")).unwrap();
    assert!(cfg.contains("\"sample_rate\": 4"), "config.json:\n{cfg}");
}

// ------------------------------------------------------------------------------------------
// 5. Stress, fork + exec, fork without exec

#[test]
fn stress_threads_cross_thread_frees_and_system() {
    const OPS: &str = "150000"; // per thread; 8 threads, ~8 heap operations per round
    let plain = run_plain(&["stress", OPS]);
    assert_exited(&plain, 0, "plain run");
    let run = run_tool(&[], &[], &["stress", OPS]);
    assert_exited(&run.out, 0, "tool run");
    // The two children may print in either order (different threads); compare line sets.
    let sorted = |b: &[u8]| {
        let mut v: Vec<String> = String::from_utf8_lossy(b)
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        sorted(&run.out.stdout),
        sorted(&plain.stdout),
        "output under the tool differs"
    );
    assert_eq!(
        sorted(&run.out.stdout),
        [
            "child-ran",
            "forked-child-ran",
            "stress done: 8 threads x 150000 rounds"
        ],
    );
    assert!(run
        .stdout()
        .ends_with("stress done: 8 threads x 150000 rounds\n"));
    // The shell started by system() is not the launcher's child: one report only.
    assert_eq!(
        run.host_leak_files(),
        ["leak_overview_1.txt", "leak_sites_1.json"]
    );
    let ov = run.overview();
    assert_eq!(ov.truncation_bits(), 0, "\n{}", ov.text);
    assert_eq!(ov.verdict(), "complete window data");
    let rounds = 8 * 150_000u64;
    // malloc, calloc, realloc (new block) and malloc per round; as many frees.
    assert!(
        ov.allocations_tracked().0 >= 4 * rounds,
        "{:?}",
        ov.allocations_tracked()
    );
    assert!(
        ov.frees_tracked().0 >= 4 * rounds,
        "{:?}",
        ov.frees_tracked()
    );
    // Everything the workers allocate is freed (the queue is drained before exit).
    for s in &ov.sites {
        assert!(
            !s.frames
                .iter()
                .any(|f| f.starts_with("stress_worker ") || f.starts_with("q_push ")),
            "worker block reported unfreed: {s:?}"
        );
    }
    assert_eq!(
        ov.allocations_tracked().0 - ov.frees_tracked().0,
        ov.total_unfreed.0
    );
    assert!(
        ov.total_unfreed.0 < 64,
        "only libc bookkeeping may remain:\n{}",
        ov.text
    );
    ov.check_sites_sum_to_total();
}

fn fork_without_exec(how: &str, child_status: i32) {
    let plain = run_plain(&["fork", how]);
    assert_exited(&plain, 0, "plain run");
    let run = run_tool(&[], &[], &["fork", how]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.out.stdout, plain.stdout);
    assert_eq!(run.stdout(), format!("child status {child_status}\n"));
    // Only the target writes a report; the forked child writes none.
    assert_eq!(
        run.host_leak_files(),
        ["leak_overview_1.txt", "leak_sites_1.json"]
    );
    let reports = run
        .stderr()
        .matches("msmemscope: host leak report: ")
        .count();
    assert_eq!(reports, 1, "stderr:\n{}", run.stderr());
    let ov = run.overview();
    // The child's allocations are not the parent's.
    assert_eq!(ov.allocations_tracked(), (3, 2331), "\n{}", ov.text);
    assert_eq!(ov.frees_tracked(), (0, 0));
    assert_eq!(ov.expect_function("parent_leak").0, (3, 2331));
    assert!(ov.by_function("child_churn").is_none());
}

#[test]
fn fork_child_exiting_with_exit_writes_no_report() {
    fork_without_exec("exit", 3);
}

#[test]
fn fork_child_exiting_with_underscore_exit_writes_no_report() {
    fork_without_exec("_exit", 4);
}

// ------------------------------------------------------------------------------------------
// 6. dlopen

#[test]
fn dlopened_library_leak_is_named() {
    let lib = dl_lib().to_str().unwrap().to_string();
    let run = run_tool(&[], &[], &["dlopen", &lib]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "dlopen done\n");
    let ov = run.overview();
    assert_eq!(
        ov.expect_function("dl_leaker_alloc"),
        ((6, 25926), (6, 25926), (0, 0))
    );
    let site = ov.expect_site("dl_leaker_alloc");
    assert!(
        site.frames[0].contains("dl_leaker.c:"),
        "frames {:?}",
        site.frames
    );
    assert!(
        site.frames[1].starts_with("dl_leaker_leak "),
        "frames {:?}",
        site.frames
    );
    assert!(
        site.frames.iter().any(|f| f.starts_with("main ")),
        "frames {:?}",
        site.frames
    );
    ov.check_sites_sum_to_total();
}

// ------------------------------------------------------------------------------------------
// 7. Exit status, signals, argv

#[test]
fn exit_status_is_passed_through() {
    let run = run_tool(&[], &[], &["exit", "7"]);
    assert_exited(&run.out, 7, "tool run");
    assert_eq!(run.stdout(), "exiting with 7\n");
    // exit() closes the window: the report is written.
    let ov = run.overview();
    assert_eq!(ov.verdict(), "complete window data");
}

#[test]
fn frees_by_atexit_handlers_and_destructors_still_count() {
    let run = run_tool(&[], &[], &["exit-frees"]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "exit frees armed\n");
    let ov = run.overview();
    assert_eq!(
        ov.expect_function("exit_leak"),
        ((1, 700), (1, 700), (0, 0))
    );
    // Sites are listed only while they hold unfreed blocks.
    assert_eq!(
        ov.by_function("alloc_freed_by_atexit"),
        None,
        "an atexit handler's free was missed"
    );
    assert_eq!(
        ov.by_function("alloc_freed_by_destructor"),
        None,
        "a destructor's free was missed"
    );
    assert!(ov.frees_tracked().1 >= 8000, "{}", ov.text);
}

#[test]
fn signal_death_is_passed_through() {
    let plain = run_plain(&["abort"]);
    assert_eq!(plain.status.signal(), Some(libc::SIGABRT));
    let run = run_tool(&[], &[], &["abort"]);
    let st = run.out.status;
    assert!(
        st.signal() == Some(libc::SIGABRT) || st.code() == Some(128 + libc::SIGABRT),
        "launcher status {st:?} for a target killed by SIGABRT\nstderr:\n{}",
        run.stderr()
    );
    assert_eq!(run.out.stdout, plain.stdout);
    assert_eq!(run.stdout(), "about to abort\n");
}

#[test]
fn target_argv_is_passed_exactly() {
    let args = [
        "argv",
        "--analysis=x",
        "-o",
        "a b",
        "",
        "--help",
        "--",
        "-",
        "\"q\"",
        "--sample-rate=3",
    ];
    let plain = run_plain(&args);
    let run = run_tool(&[], &[], &args);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.out.stdout, plain.stdout);
    let want = "[0]=<--analysis=x>\n[1]=<-o>\n[2]=<a b>\n[3]=<>\n[4]=<--help>\n[5]=<-->\n[6]=<->\n\
                [7]=<\"q\">\n[8]=<--sample-rate=3>\n";
    assert_eq!(run.stdout(), want);
    // The target's options did not change the tool's settings.
    let ov = run.overview();
    assert_eq!(ov.h("Sample rate"), "1 (every allocation tracked)");
}
