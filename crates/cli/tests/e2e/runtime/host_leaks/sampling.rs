//! Host leaks sampled by bytes (`--sample-bytes`, docs/analyses.md#sampling-by-bytes): the real
//! CLI runs tests/fixtures/sampled_leaks.c, whose totals are known, and the report's estimates
//! are checked against them. Sampling is random (a fresh countdown per thread and run), so the
//! checks allow the spread the number of samples implies, at about four standard deviations.

use std::path::PathBuf;

use crate::util::host_leak::*;
use crate::util::{built_once, parse_csv};

const MIB: u64 = 1 << 20;

fn prog() -> PathBuf {
    built_once(
        "host-leaks",
        "sampled_leaks.c",
        "sampled_leaks",
        &["-O2", "-g", "-fomit-frame-pointer"],
        &[],
    )
}

fn run_sampled(tool_args: &[&str], mode: &str) -> Run {
    run_tool_cmd(tool_args, &[], prog().to_str().unwrap(), &[mode])
}

/// The fixture's line of `needle` (1-based).
fn fixture_line(needle: &str) -> usize {
    let src = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sampled_leaks.c"),
    )
    .expect("fixture source");
    src.lines()
        .position(|l| l.contains(needle))
        .expect("needle in the fixture")
        + 1
}

/// One 1 MiB block kept per step among 8 MiB of churn a step: at the recommended interval the
/// leak is the top site, at its line, and its estimated bytes are within 20% of the 60 MiB kept.
#[test]
fn a_leak_of_one_mebibyte_per_step_is_found_and_estimated() {
    let run = run_sampled(&["--sample-bytes=524288", "--host-leak-mode=event"], "leak");
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "leaked 60 MiB\n");
    let ov = run.overview();
    assert!(
        ov.h("Sampling")
            .starts_with("by bytes, one sample per 524288 bytes allocated on average -- ESTIMATES"),
        "{}",
        ov.text
    );
    assert!(ov.h("Pre-window frees").starts_with("not told apart"));
    let top = ov.sites.iter().find(|s| !s.resident).expect("a TOP site");
    assert_eq!(top.first_function(), "leak_one_mib", "{}", ov.text);
    let line = format!("sampled_leaks.c:{}", fixture_line("void *p = malloc(MIB);"));
    assert!(
        top.frames[0].contains(&line),
        "{:?} lacks {line}",
        top.frames
    );
    assert_eq!(top.class, "suspected_leak", "{}", ov.text);
    let truth = 60 * MIB;
    let estimate = top.unfreed.1;
    assert!(
        estimate.abs_diff(truth) * 5 <= truth,
        "estimated {estimate} bytes of {truth}:\n{}",
        ov.text
    );
    // About 52 of the 60 blocks are sampled (p = 1 - e^-2): enough not to be uncertain.
    let (samples, uncertain) = top.samples.expect("a sampled site says its samples");
    assert!((40..=60).contains(&samples), "{samples} samples");
    assert!(!uncertain);
    // Each sample of 1 MiB stands for 1 MiB / 0.8647 bytes.
    let per_sample = (MIB as f64 / (1.0 - (-2f64).exp())).round() as u64;
    assert_eq!(top.unfreed, (samples, samples * per_sample));
    // The churn is freed: nothing of it is a leak.
    assert!(ov
        .sites
        .iter()
        .all(|s| s.first_function() != "churn" || s.class != "suspected_leak"));

    // The block detail lists the samples, each with what it stands for.
    let text = std::fs::read_to_string(run.run_dir().join("host_leak/block_detail_1.csv"))
        .expect("block detail");
    let rows = parse_csv(&text);
    assert_eq!(
        rows[0].join(","),
        "addr,size,alloc_ts,Call Stack(C),Call Stack(Python),Domain,Sampled,Estimated Bytes"
    );
    let leak_rows: Vec<&Vec<String>> = rows[1..].iter().filter(|r| r[1] == "1048576").collect();
    assert_eq!(leak_rows.len() as u64, samples);
    for r in &rows[1..] {
        assert_eq!(r[6], "yes", "{r:?}");
    }
    for r in leak_rows {
        assert_eq!(num(&r[7]), per_sample, "{r:?}");
    }
}

/// Allocating and freeing the same amount for seconds, the ring still live at the end: no site
/// is a suspected leak or on watch, and the estimate of what is live is the ring's size.
#[test]
fn a_steady_program_is_not_reported_as_leaking() {
    let run = run_sampled(&["--sample-bytes=524288"], "steady");
    assert_exited(&run.out, 0, "tool run");
    assert_eq!(run.stdout(), "steady done\n");
    let ov = run.overview();
    for s in &ov.sites {
        assert!(
            s.resident || !s.class.starts_with("suspected_leak"),
            "{s:?}\n{}",
            ov.text
        );
        assert!(!s.class.starts_with("growth_watch"), "{s:?}\n{}", ov.text);
    }
    // 512 blocks of 64 B to 64 KiB: about 16.4 MiB live, about 32 samples.
    let (_, live) = ov.total_unfreed;
    assert!(
        (8 * MIB..=26 * MIB).contains(&live),
        "estimated {live} live bytes:\n{}",
        ov.text
    );
}

/// The exact mode stays the default, and says so.
#[test]
fn without_the_option_the_report_is_exact() {
    let run = run_sampled(&[], "leak");
    assert_exited(&run.out, 0, "tool run");
    let ov = run.overview();
    assert_eq!(ov.h("Sample rate"), "1 (every allocation tracked)");
    assert!(!ov.text.contains("Sampling: "));
    assert_eq!(ov.expect_site("leak_one_mib").unfreed, (60, 60 * MIB));
    assert!(ov.sites.iter().all(|s| s.samples.is_none()));
}

#[test]
fn sampling_by_count_and_by_bytes_do_not_combine() {
    let run = run_sampled(&["--sample-bytes=4096", "--sample-rate=8"], "leak");
    assert_exited(&run.out, 2, "usage error");
    assert_eq!(
        run.stderr().lines().next().unwrap_or(""),
        "msmemscope: --sample-bytes=4096 samples by bytes and cannot be combined with --sample-rate=8"
    );
}
