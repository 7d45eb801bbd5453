//! Host leaks in event mode: the block detail CSV beside the overview, against the fixture
//! tests/fixtures/host_leaks.c (built by `known_leaks`).

use crate::util::host_leak::*;
use crate::util::parse_csv;

use super::known_leaks::run_tool;

// ------------------------------------------------------------------------------------------
// 4. Event mode

const CSV_HEADER: [&str; 6] = [
    "addr",
    "size",
    "alloc_ts",
    "Call Stack(C)",
    "Call Stack(Python)",
    "Domain",
];

/// Checks the block detail against the overview; returns the data rows.
fn check_block_detail(run: &Run, ov: &Overview) -> Vec<Vec<String>> {
    assert_eq!(
        run.host_leak_files(),
        [
            "block_detail_1.csv",
            "leak_overview_1.txt",
            "leak_sites_1.json"
        ]
    );
    let text = std::fs::read_to_string(run.run_dir().join("host_leak/block_detail_1.csv")).unwrap();
    let first_line = text.lines().next().unwrap_or("");
    assert_eq!(
        first_line,
        "addr,size,alloc_ts,Call Stack(C),Call Stack(Python),Domain"
    );
    let records = parse_csv(&text);
    assert_eq!(records[0], CSV_HEADER);
    let rows = records[1..].to_vec();
    assert_eq!(
        rows.len() as u64,
        ov.total_unfreed.0,
        "one row per unfreed block"
    );
    let mut addrs = std::collections::HashSet::new();
    let mut total = 0;
    let mut prev = u64::MAX;
    for r in &rows {
        assert_eq!(r.len(), 6, "row {r:?}");
        let addr =
            u64::from_str_radix(r[0].strip_prefix("0x").expect("hex addr"), 16).expect("addr");
        assert!(addrs.insert(addr), "duplicate address {}", r[0]);
        let size = num(&r[1]);
        assert!(
            size <= prev,
            "rows must be sorted by size descending: {size} after {prev}"
        );
        prev = size;
        total += size;
        let ts = num(&r[2]);
        assert!(ts > 0);
        assert!(!r[3].is_empty(), "C stack of {r:?}");
        assert_eq!(r[4], "", "no Python stack for a C program");
        assert_eq!(r[5], "malloc", "a C program's blocks are all malloc's");
    }
    assert_eq!(
        total, ov.total_unfreed.1,
        "bytes of all rows vs Total Unfreed"
    );
    rows
}

#[test]
fn event_mode_writes_block_detail_csv() {
    let run = run_tool(&["--host-leak-mode=event"], &[], &["event"]);
    assert_exited(&run.out, 0, "tool run");
    let ov = run.overview();
    assert!(
        ov.h("Report mode").starts_with("event"),
        "{:?}",
        ov.h("Report mode")
    );
    assert_eq!(ov.total_unfreed, (12, 78000));
    assert_eq!(ov.expect_function("event_site_a").0, (6, 57000));
    assert_eq!(ov.expect_function("event_site_b").0, (6, 21000));
    let rows = check_block_detail(&run, &ov);
    let sizes: Vec<u64> = rows.iter().map(|r| num(&r[1])).collect();
    assert_eq!(
        sizes,
        (1..=12).rev().map(|k| k * 1000).collect::<Vec<u64>>()
    );
    for r in &rows {
        let size = num(&r[1]);
        let frames: Vec<&str> = r[3].lines().collect();
        let want = if size >= 7000 {
            "event_site_a "
        } else {
            "event_site_b "
        };
        assert!(frames[0].starts_with(want), "size {size}: stack {:?}", r[3]);
        assert!(frames[0].contains("host_leaks.c:"), "{:?}", frames[0]);
        assert!(frames.iter().any(|f| f.starts_with("main ")), "{:?}", r[3]);
    }
    // alloc_ts follows the fixture's allocation order.
    let order = [
        6000, 12000, 1000, 9000, 4000, 11000, 2000, 8000, 3000, 10000, 5000, 7000,
    ];
    let ts_of = |size: u64| num(&rows.iter().find(|r| num(&r[1]) == size).unwrap()[2]);
    for w in order.windows(2) {
        assert!(
            ts_of(w[0]) <= ts_of(w[1]),
            "alloc_ts of {} after {}",
            w[0],
            w[1]
        );
    }
}

#[test]
fn event_mode_block_detail_matches_overview_with_threads() {
    let run = run_tool(&["--host-leak-mode=event"], &[], &["sites"]);
    assert_exited(&run.out, 0, "tool run");
    let ov = run.overview();
    assert_eq!(ov.truncation_bits(), 0);
    let rows = check_block_detail(&run, &ov);
    // Per first-frame function, the rows agree with the sites.
    for function in [
        "leak_steady_growth",
        "thread_leaker_3",
        "ring_push",
        "leak_pvalloc",
    ] {
        let mine: Vec<&Vec<String>> = rows
            .iter()
            .filter(|r| r[3].split(' ').next() == Some(function))
            .collect();
        let bytes: u64 = mine.iter().map(|r| num(&r[1])).sum();
        assert_eq!(
            (mine.len() as u64, bytes),
            ov.expect_function(function).0,
            "{function}"
        );
    }
}
