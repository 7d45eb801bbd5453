//! Repeated windows: a program that closes and reopens its window many times with the C ABI
//! (`msmemscope_stop()` / `msmemscope_start()`) while other threads allocate keeps its memory
//! flat, because a closed window gives its tables back (only each ledger's small header stays),
//! and every window's report still has exact counts. tests/fixtures/windows/many_windows.c under
//! the real `msmemscope-cli --analysis=host-leaks`.
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary)
//! and gcc on PATH.

use std::path::PathBuf;

use crate::util::built_once;
use crate::util::host_leak::*;

/// As in the fixture.
const WINDOWS: u64 = 50;
const CHURN: u64 = 20_000;
const CHURN_SIZE: u64 = 64;
const CHURN_KEPT: u64 = 10;
const LEAKS: u64 = 3;

/// RSS growth allowed between the 5th and the 50th window. Leaking every closed window's
/// tables grew the fixture by 38.5 to 38.7 MB over those 45 windows (the block table alone
/// holds 20 000 live blocks per window); giving them back leaves the ledger headers (~26 KB
/// each, ~1.2 MB in all) and allocator noise: 0.7 to 2.1 MB measured.
const RSS_GROWTH_BOUND_KB: u64 = 10 * 1024;

fn many_windows() -> PathBuf {
    built_once(
        "many-windows",
        "windows/many_windows.c",
        "many_windows",
        &["-O2", "-g", "-pthread"],
        &["-ldl"],
    )
}

/// `label=N kB` on the program's stdout.
fn rss_kb(stdout: &str, label: &str) -> u64 {
    let prefix = format!("{label}=");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {label} in the program's output:\n{stdout}"));
    num(line.strip_suffix(" kB").expect("N kB"))
}

fn leak_size(window: u64) -> u64 {
    1000 + window
}

#[test]
fn fifty_windows_keep_rss_flat_and_count_exactly() {
    // Beats every 10 ms: program threads take beats (reading the stack counters) while windows
    // close under them.
    let run = run_tool_cmd(
        &[],
        &[("MSMEMSCOPE_HOST_BEAT_MS", "10")],
        many_windows().to_str().unwrap(),
        &[],
    );
    assert_exited(&run.out, 0, "many_windows");
    let stdout = run.stdout();
    assert!(stdout.ends_with("windows done\n"), "{stdout}");

    let files = run.host_leak_files();
    let mut want: Vec<String> = (1..=WINDOWS)
        .flat_map(|w| {
            [
                format!("leak_overview_{w}.txt"),
                format!("leak_sites_{w}.json"),
            ]
        })
        .collect();
    want.sort();
    assert_eq!(files, want);

    for w in 1..=WINDOWS {
        let ov = Overview::parse(&run.overview_text_of(w as u32));
        assert!(
            ov.text
                .starts_with(&format!("====== Host Leak Overview: stage={w}, pid=")),
            "window {w}:\n{}",
            ov.text
        );
        assert_eq!(ov.truncation_bits(), 0, "window {w}:\n{}", ov.text);
        assert_eq!(ov.verdict(), "complete window data", "window {w}");
        ov.check_sites_sum_to_total();
        // This window's own leak, whose size says which window made it.
        let leak = LEAKS * leak_size(w);
        assert_eq!(
            ov.expect_function("leak_some"),
            ((LEAKS, leak), (LEAKS, leak), (0, 0)),
            "window {w}:\n{}",
            ov.text
        );
        assert_eq!(
            ov.expect_function("churn_fill"),
            (
                (CHURN_KEPT, CHURN_KEPT * CHURN_SIZE),
                (CHURN, CHURN * CHURN_SIZE),
                (CHURN - CHURN_KEPT, (CHURN - CHURN_KEPT) * CHURN_SIZE)
            ),
            "window {w}:\n{}",
            ov.text
        );
        // Blocks the main thread made in earlier windows are no one's leak here.
        for site in &ov.sites {
            if site.first_function() == "leak_some" {
                assert_eq!(site.unfreed.1, leak, "window {w}: {site:?}");
            }
        }
    }

    let after_5 = rss_kb(&stdout, "rss_after_5");
    let after_last = rss_kb(&stdout, "rss_after_last");
    let growth = after_last.saturating_sub(after_5);
    assert!(
        growth < RSS_GROWTH_BOUND_KB,
        "RSS grew by {growth} kB from window 5 ({after_5} kB) to window {WINDOWS} \
         ({after_last} kB): closed windows keep their tables"
    );
}
