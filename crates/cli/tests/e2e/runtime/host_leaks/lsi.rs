//! The Leak Suspicion Index on the fixture tests/fixtures/host_leaks.c (built by `known_leaks`):
//! leaks told from caches and rings, the adaptive beat, series too short to judge.

use crate::util::host_leak::*;

use super::known_leaks::{run_plain, run_tool};

// ------------------------------------------------------------------------------------------
// 8. Leak Suspicion Index

#[test]
fn lsi_separates_leaks_from_caches_and_rings() {
    let plain = run_plain(&["lsi"]);
    assert_exited(&plain, 0, "plain run");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "lsi done, threads=1\n"
    );
    // 100 ms beats: the ~4 s run gives about 40 beats, taken on the program's own threads:
    // its thread count is unchanged.
    let run = run_tool(
        &[],
        &[
            ("MSMEMSCOPE_HOST_BEAT_MS", "100"),
            ("MSMEMSCOPE_NO_CONTROL", "1"),
        ],
        &["lsi"],
    );
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.out.stdout, plain.stdout);
    // With the control channel ready for an attach: still no thread of ours (its listener
    // starts only when someone attaches).
    let attachable = run_tool(&[], &[("MSMEMSCOPE_HOST_BEAT_MS", "100")], &["lsi"]);
    assert_eq!(
        String::from_utf8_lossy(&attachable.out.stdout),
        "lsi done, threads=1\n"
    );
    let ov = run.overview();
    ov.check_sites_sum_to_total();
    let series = ov
        .text
        .lines()
        .find(|l| l.starts_with("Series: "))
        .expect("series line");
    assert!(
        series.starts_with("Series: top-k=256, max-stacks=1024, beats="),
        "{series}"
    );
    assert!(series.contains("(100 ms each)"), "{series}");

    let top: Vec<&Site> = ov.sites.iter().filter(|s| !s.resident).collect();
    let first = top.first().expect("a TOP row");
    assert_eq!(first.first_function(), "lsi_steady_leak", "{}", ov.text);
    assert_eq!(first.class, "suspected_leak", "{}", ov.text);
    assert!(first.lsi >= 60.0, "{}", ov.text);
    assert_eq!(first.unfreed, (400, 400_000));
    assert_eq!(first.factors["Release"], "1.00");
    assert_eq!(first.factors["Scale"], "1.00");
    assert_eq!(first.factors["Lifetime"], "0.50"); // no frees
    let growth: f64 = first.factors["Growth"].parse().expect("Growth printed");
    assert!(growth > 0.8, "{}", ov.text);
    assert!(
        first.factors["Pattern"].parse::<f64>().is_ok(),
        "{}",
        ov.text
    );
    assert!(!first.factors.contains_key("degraded"), "{}", ov.text);

    let slow = top
        .iter()
        .find(|s| s.first_function() == "lsi_slow_leak")
        .expect("slow leak row");
    assert_eq!(slow.unfreed, (16, 1024));
    assert!(
        slow.class == "suspected_leak" || slow.class == "growth_watch",
        "{}",
        ov.text
    );

    let table = ov.expect_site("lsi_table_at_start");
    assert!(table.resident, "{}", ov.text);
    assert_eq!(table.class, "resident/early");
    assert_eq!(table.factors["Growth"], "0.00");

    let ring = ov.expect_site("lsi_ring_entry");
    assert_eq!(ring.unfreed, (32, 4096));
    assert_eq!(ring.allocated, (2000, 256_000));
    assert!(
        ring.resident,
        "the ring must not be in the TOP N:\n{}",
        ov.text
    );
    assert_eq!(ring.class, "resident/turnover");
    assert_eq!(ov.by_function("lsi_temporary"), None);
}

#[test]
fn a_three_second_window_classifies_with_the_adaptive_beat() {
    // No MSMEMSCOPE_HOST_BEAT_MS: the beat starts at 62.5 ms and stays there, 3 s being less
    // than the 8 s that 128 points of 62.5 ms cover.
    let run = run_tool(&[], &[], &["lsi-short"]);
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "lsi-short done\n");
    let ov = run.overview();
    ov.check_sites_sum_to_total();
    let series = ov
        .text
        .lines()
        .find(|l| l.starts_with("Series: "))
        .expect("series line");
    let rest = series
        .strip_prefix("Series: top-k=256, max-stacks=1024, beats=")
        .unwrap_or_else(|| panic!("{series}"));
    let (beats, rest) = rest.split_once(' ').unwrap();
    // 48 beats in 3 s and the closing sample; a beat is taken by the first allocation after
    // it falls due, so a sleep that wakes late on a loaded machine may skip one.
    assert!((40..=50).contains(&num(beats)), "{series}");
    let rest = rest
        .strip_prefix("(start 62.5 ms, now 62.5 ms each), window=")
        .unwrap_or_else(|| panic!("{series}"));
    let (window, rest) = rest.split_once(' ').unwrap();
    let window: f64 = window.parse().unwrap();
    assert!((2.9..4.0).contains(&window), "{series}");
    assert!(rest.starts_with("beats of 1000 ms, series="), "{series}");

    let leak = ov.expect_site("short_steady_leak");
    assert_eq!(leak.class, "suspected_leak", "{}", ov.text);
    assert!(!leak.factors.contains_key("degraded"), "{}", ov.text);
    assert_eq!(leak.unfreed, (300, 300_000));
    assert_eq!(leak.factors["Release"], "1.00");
    assert_eq!(leak.factors["Scale"], "1.00");
    assert_eq!(leak.factors["Lifetime"], "0.50"); // no frees
    let growth: f64 = leak.factors["Growth"].parse().expect("Growth printed");
    assert!(growth > 0.9, "{}", ov.text);
    let pattern: f64 = leak.factors["Pattern"].parse().expect("Pattern printed");
    assert!(pattern > 0.9, "{}", ov.text);
    // The points after the 0.75 s warm-up: 37 when no beat was skipped.
    let fitted = num(&leak.factors["beats"]);
    assert!((30..=37).contains(&fitted), "{}", ov.text);

    let table = ov.expect_site("short_table_at_start");
    assert!(table.resident, "{}", ov.text);
    assert_eq!(table.class, "resident/early", "{}", ov.text);
    assert!(!table.factors.contains_key("degraded"), "{}", ov.text);
    assert_eq!(table.unfreed, (1, 65_536));
    assert_eq!(table.factors["Growth"], "0.00");
}

#[test]
fn short_program_rows_are_insufficient_series() {
    let run = run_tool(&[], &[], &["plain"]);
    assert_exited(&run.out, 0, "tool run");
    let ov = run.overview();
    assert!(!ov.sites.is_empty());
    for site in &ov.sites {
        assert_eq!(
            site.factors.get("degraded").map(String::as_str),
            Some("insufficient_series"),
            "{site:?}"
        );
        assert_eq!(site.factors["Growth"], "-");
        assert_eq!(site.factors["Pattern"], "-");
        assert_eq!(site.factors["slope"], "-");
        assert!(
            !site.resident,
            "a short window must not be classified resident: {site:?}"
        );
    }
}
