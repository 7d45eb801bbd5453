//! `--report`, `msmemscope report DIR` and `msmemscope export --format torch-snapshot DIR` on a
//! real launched run of the C producer tests/fixtures/emit_leaks.c (steps, marks, ops, cpu PTA
//! blocks and a 2 MiB HAL block on cuda:0). The page's data island is checked here; the page in
//! a browser and the snapshot in PyTorch are tests/python/test_report.py's.

use std::path::{Path, PathBuf};

use crate::util::{cli, launch_ok, only_run_dir, producer, stderr, Scratch};

/// Runs the leaking producer with `--report`; returns the run directory and the launcher's stderr.
fn launched(scratch: &Scratch) -> (PathBuf, String) {
    let out_dir = scratch.path().join("out");
    let out = launch_ok(
        &["--report"],
        &out_dir,
        &[producer("emit_leaks").as_os_str(), "leak".as_ref()],
    );
    (only_run_dir(&out_dir), stderr(&out))
}

/// The JSON the page carries.
fn page_data(page: &Path) -> serde_json::Value {
    let html = std::fs::read_to_string(page).unwrap();
    let start = "<script id=\"report-data\" type=\"application/json\">";
    let island = html.split(start).nth(1).expect("the data island");
    let json = island.split("</script>").next().unwrap();
    serde_json::from_str(&json.replace("<\\/", "</")).unwrap()
}

#[test]
fn launched_run_gets_its_page() {
    let scratch = Scratch::new("report-launch");
    let (run, launcher_stderr) = launched(&scratch);
    let page = run.join("msmemscope_report.html");
    assert!(
        launcher_stderr.contains(&format!("msmemscope: report: {}\n", page.display())),
        "{launcher_stderr}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: no URL is fetched by the page.
    assert!(!html.contains("src=\"http"), "no external scripts");
    assert!(!html.contains("<link"), "no external styles");
    let data = page_data(&page);

    let timelines = data["timelines"].as_array().unwrap();
    let labels: Vec<&str> = timelines
        .iter()
        .map(|t| t["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["0", "cpu"]);
    // device 0: the 2 MiB HAL block; cpu: 64 KiB activation + losses of 4, 8, 12, 16 KiB.
    let peaks: Vec<u64> = timelines
        .iter()
        .map(|t| t["peak"]["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(peaks, [2 << 20, 65536 + 4096 * 10]);
    for t in timelines {
        let max = t["max"].as_array().unwrap();
        let bucket_peak = max.iter().map(|v| v.as_u64().unwrap()).max().unwrap();
        assert_eq!(bucket_peak, t["peak"]["bytes"].as_u64().unwrap());
        let steps: Vec<&str> = t["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[1].as_str().unwrap())
            .collect();
        assert_eq!(steps, ["1", "2", "3", "4"]);
        assert_eq!(t["marks"].as_array().unwrap().len(), 4);
    }
    let cpu = &timelines[1];
    assert_eq!(
        (cpu["mallocs"].as_u64(), cpu["frees"].as_u64()),
        (Some(8), Some(4))
    );
    assert_eq!(cpu["owners"][0]["name"], "PTA");
    // Hover: each loss, alone in its bucket (the producer sleeps 1 ms before and after it), was
    // allocated after aten::mse_loss (the producer's ops are empty).
    let hovers = cpu["hover"].as_array().unwrap();
    for step in 1..=4u64 {
        assert!(
            hovers.iter().any(|h| h[0] == 4096 * step
                && h[1] == "aten::mse_loss"
                && h[2] == "PTA"
                && h[4] == false),
            "step {step}'s loss: {hovers:?}"
        );
    }

    // The leak view is the leaks analysis: the same text as the run's own report.
    let online = std::fs::read_to_string(run.join("leaks/leak_report.txt")).unwrap();
    assert_eq!(data["leaks"]["text"].as_str().unwrap(), online);
    let rows: Vec<(&str, u64)> = data["leaks"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["ptr"].as_str().unwrap(), r["step"].as_u64().unwrap()))
        .collect();
    // Four steps judge no growth: the kept losses are resident; the HAL block live at exit is
    // the one leak.
    assert_eq!(rows, [("0x00007f0000000000", 1)]);
    assert_eq!(
        data["leaks"]["findings"]["resident"][0]["bytes"].as_u64(),
        Some(8192)
    );

    // `report` on the output directory finds the run and writes the same data again.
    let out_dir = scratch.path().join("out");
    let out = cli(&["report".as_ref(), out_dir.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", page.display())
    );
    let again = page_data(&page);
    assert_eq!(again["timelines"], data["timelines"]);
    assert_eq!(again["leaks"], data["leaks"]);
}

#[test]
fn export_writes_a_pickle() {
    let scratch = Scratch::new("report-export");
    let (run, _) = launched(&scratch);
    let out = cli(&[
        "export".as_ref(),
        "--format=torch-snapshot".as_ref(),
        run.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = run.join("torch_snapshot.pickle");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", path.display())
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..2], b"\x80\x02", "a protocol-2 pickle");
    assert_eq!(bytes.last(), Some(&b'.'), "ends with STOP");
    // Each action name is written once (BINUNICODE, length, text) and referenced after (memo).
    let written = |text: &str| {
        let mut needle = vec![b'X'];
        needle.extend((text.len() as u32).to_le_bytes());
        needle.extend(text.as_bytes());
        bytes.windows(needle.len()).filter(|w| *w == needle).count()
    };
    for action in ["alloc", "free_requested", "free_completed", "segment_alloc"] {
        assert_eq!(written(action), 1, "{action}");
    }
    assert_eq!(written("segment_free"), 0, "the HAL block is never freed");
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    let scratch = Scratch::new("report-usage");
    let dir = scratch.path();
    let missing = dir.join("missing");
    let cases: Vec<(Vec<&std::ffi::OsStr>, String)> = vec![
        (
            vec!["report".as_ref()],
            "msmemscope: report needs a directory: msmemscope report DIR (a run directory or the output directory holding runs)".into(),
        ),
        (
            vec!["report".as_ref(), "a".as_ref(), "b".as_ref()],
            "msmemscope: report takes one directory and no options, got \"a\" \"b\"; usage: msmemscope report DIR".into(),
        ),
        (
            vec!["export".as_ref(), dir.as_os_str()],
            "msmemscope: export needs --format torch-snapshot or parquet; usage: msmemscope export --format torch-snapshot|parquet DIR".into(),
        ),
        (
            vec!["export".as_ref(), "--format".as_ref(), "svg".as_ref(), dir.as_os_str()],
            "msmemscope: invalid export --format \"svg\": accepted values are torch-snapshot, parquet".into(),
        ),
        (
            vec!["export".as_ref(), "--format=torch-snapshot".as_ref()],
            "msmemscope: export needs a directory; usage: msmemscope export --format torch-snapshot|parquet DIR".into(),
        ),
        (
            vec!["report".as_ref(), missing.as_os_str()],
            format!("msmemscope: {}: no such directory; give a run directory (msmemscope_PID_TIMESTAMP) or the output directory holding runs", missing.display()),
        ),
        (
            vec!["report".as_ref(), dir.as_os_str()],
            format!("msmemscope: {}: not a run directory (no config.json, device_*/dump/ or host_leak/) and it holds no msmemscope_* runs", dir.display()),
        ),
        (
            vec!["--report".as_ref(), "--compare".as_ref(), "--input-path=a,b".as_ref()],
            "msmemscope: --report writes the page of the run it launches and cannot be combined with --compare; for existing results run msmemscope report DIR".into(),
        ),
    ];
    for (args, line) in cases {
        let out = cli(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), format!("{line}\n"), "{args:?}");
    }

    // A dump that is not one: its file and line, exit 2, no page.
    let run = dir.join("msmemscope_1_20260101000000");
    let dump_dir = run.join("device_cpu/dump");
    std::fs::create_dir_all(&dump_dir).unwrap();
    let dump = dump_dir.join("memscope_dump_1.csv");
    std::fs::write(&dump, "not,a,dump\n").unwrap();
    let out = cli(&["report".as_ref(), run.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with(&format!(
            "msmemscope: {}: not a memscope dump: the header is not ID,Event,",
            dump.display()
        )),
        "{}",
        stderr(&out)
    );
    assert!(!run.join("msmemscope_report.html").exists());

    let help = cli(&["--help".as_ref()]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("  --report\n"), "{help}");
    assert!(help.contains("msmemscope report DIR"), "{help}");
    assert!(
        help.contains("msmemscope export --format torch-snapshot DIR"),
        "{help}"
    );
    assert!(
        help.contains("msmemscope export --format parquet DIR"),
        "{help}"
    );
}
