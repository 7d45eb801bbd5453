use super::*;
use crate::events::row::format_ptr;

pub fn step(n: u64) -> EventRow {
    EventRow::new(Event::System, EventType::Step, n.to_string())
}

pub fn launch(name: &str, device: DeviceId) -> EventRow {
    let mut r = EventRow::new(Event::OpLaunch, EventType::AtenStart, name);
    r.device = device;
    r
}

/// A MALLOC/FREE row with a raw Attr, as the writer hands it over.
pub fn block(
    event: Event,
    pool: EventType,
    device: DeviceId,
    ptr: u64,
    size: u64,
    used: u64,
) -> EventRow {
    let mut r = EventRow::new(event, pool, "");
    r.device = device;
    r.ptr = Some(ptr);
    r.attrs_json = Some(format!(
        "{{\"allocation_id\":1,\"addr\":\"{}\",\"size\":{size},\"used\":{used},\"owner\":\"PTA\"}}",
        format_ptr(ptr)
    ));
    r
}

fn run(rows: Vec<EventRow>) -> (AnalysisOutput, Leaks) {
    let mut leaks = Leaks::new();
    for (i, mut row) in rows.into_iter().enumerate() {
        row.id = i as u64 + 1;
        leaks.feed(&row);
    }
    let out = leaks.finish();
    (out, leaks)
}

const CPU: DeviceId = DeviceId::Cpu;

/// A PTA MALLOC on cpu allocated at `site` (a line of train.py) by `op`.
fn malloc_at(ptr: u64, size: u64, line: u32, op: &str) -> EventRow {
    let mut r = block(Event::Malloc, EventType::Pta, CPU, ptr, size, 0);
    r.attrs_json = Some(format!(
        "{{\"allocation_id\":1,\"addr\":\"{}\",\"size\":{size},\"owner\":\"PTA@activation\",\
         \"site\":\"/w/train.py:{line} (main)\",\"frame\":\"/lib/model.py:7 (forward)\",\
         \"op\":\"{op}\"}}",
        format_ptr(ptr)
    ));
    r
}

fn malloc(ptr: u64, size: u64) -> EventRow {
    block(Event::Malloc, EventType::Pta, CPU, ptr, size, 0)
}

fn free(ptr: u64, size: u64) -> EventRow {
    block(Event::Free, EventType::Pta, CPU, ptr, size, 0)
}

fn file_text(out: &AnalysisOutput, name: &str) -> String {
    out.files
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.clone())
        .unwrap()
}

/// Steps 1..=7: line 10 keeps a 1 KiB block every step (a leak), line 20 makes 4 KiB once
/// in step 3 and keeps it (resident), line 30 allocates and frees within two steps.
fn training(holder: bool) -> Vec<EventRow> {
    let mut rows = Vec::new();
    for s in 1..=7u64 {
        rows.push(step(s));
        rows.push(launch("aten::addmm", DeviceId::None));
        rows.push(malloc_at(0x1000 + s * 0x100, 1024, 10, "aten::addmm"));
        if s == 3 {
            rows.push(malloc_at(0x9000, 4096, 20, "aten::zeros"));
        }
        rows.push(malloc_at(0x5000 + s * 0x100, 512, 30, "aten::mul"));
        if s > 1 {
            rows.push(free(0x5000 + (s - 1) * 0x100, 512));
        }
    }
    if holder {
        let mut h = EventRow::new(
            Event::System,
            EventType::Holder,
            "kept (global of train.py) -> list[3] -> Tensor 256 float32",
        );
        h.device = CPU;
        h.ptr = Some(0x1500);
        rows.push(h);
    }
    rows
}

#[test]
fn a_site_that_grows_leaks_and_one_made_once_is_resident() {
    let (out, leaks) = run(training(true));
    // Line 10's blocks of steps 2..=5 became candidates at the ends of steps 3..=6 (four
    // rises); step 6's only at the end of the input, counted for the growing site.
    let steps: Vec<u64> = leaks.leaks().iter().map(|l| l.step).collect();
    assert_eq!(steps, vec![2, 3, 4, 5, 6]);
    let expected_leaks = "\
====== ERROR: Detected memory leaks on device cpu ======
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001200 in kernel_1 at step 2.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001300 in kernel_2 at step 3.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001400 in kernel_3 at step 4.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001500 in kernel_4 at step 5.
Direct PTA leak of 0.001 Mb(s) at 0x0000000000001600 in kernel_5 at step 6.
====== SUMMARY: 0.005 Mb(s) leaked in 5 allocation(s) ======
";
    let expected_sites = "\
====== Leaking sites on device cpu: 1 (live memory that grows step over step) ======
[1] /w/train.py:10 (main): +1.00 KiB (1024 bytes) in 1 block(s) per step, growing from step 3 to step 6; 5.00 KiB leaked in 5 block(s)
    op aten::addmm; owner activation; inside /lib/model.py:7 (forward)
    held by: kept (global of train.py) -> list[3] -> Tensor 256 float32
====== Resident on device cpu: 1 site(s) kept but not growing (not leaks) ======
  /w/train.py:20 (main): 4.00 KiB (4096 bytes) in 1 block(s) since step 4; op aten::zeros; owner activation; inside /lib/model.py:7 (forward)
====== Peak on device cpu: 12.0 KiB of tensors live at step 7, in aten::mul (forward) ======
  by owner: activation 12.0 KiB
  [1] /w/train.py:10 (main): 7.00 KiB in 7 block(s); op aten::addmm; inside /lib/model.py:7 (forward)
  [2] /w/train.py:20 (main): 4.00 KiB in 1 block(s); op aten::zeros; inside /lib/model.py:7 (forward)
  [3] /w/train.py:30 (main): 1.00 KiB in 2 block(s); op aten::mul; inside /lib/model.py:7 (forward)
";
    assert_eq!(out.console, format!("{expected_leaks}{expected_sites}"));
    // The report file is the leaks' (the peak has its own file).
    let (sites_only, _) = expected_sites.split_once("====== Peak").unwrap();
    assert_eq!(
        file_text(&out, REPORT_FILE),
        format!("{expected_leaks}{sites_only}")
    );
    let peak: serde_json::Value = serde_json::from_str(&file_text(&out, peak::PEAK_FILE)).unwrap();
    let device = &peak["devices"][0];
    assert_eq!(device["peak"]["bytes"], 12 * 1024);
    assert_eq!(device["peak"]["step"], 7);
    assert_eq!(device["peak"]["op"], "aten::mul");
    assert_eq!(
        device["peak"]["owners"],
        serde_json::json!([{"owner": "activation", "bytes": 12 * 1024}])
    );
    assert_eq!(device["peak"]["lines"][0]["line"], 10);
    assert_eq!(device["peak"]["lines"][0]["blocks"], 7);
    // Each step's peak: step 1 holds line 10's first block and line 30's.
    assert_eq!(
        device["steps"][0],
        serde_json::json!({"step": 1, "bytes": 1536, "op": "aten::mul", "phase": "forward"})
    );
    assert_eq!(device["steps"].as_array().unwrap().len(), 7);
    let json: serde_json::Value =
        serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
    assert_eq!(json["schema"], findings::SCHEMA);
    assert_eq!(json["steps_marked"], 7);
    let leak = &json["leaks"][0];
    assert_eq!(leak["file"], "/w/train.py");
    assert_eq!(leak["line"], 10);
    assert_eq!(leak["function"], "main");
    assert_eq!(leak["bytes_per_step"], 1024);
    assert_eq!(leak["steps"], serde_json::json!([2, 3, 4, 5, 6]));
    assert_eq!(
        leak["series"],
        serde_json::json!([[3, 1024], [4, 2048], [5, 3072], [6, 4096]])
    );
    assert_eq!(leak["leaked_bytes"], 5120);
    assert_eq!(json["resident"][0]["bytes"], 4096);
    assert_eq!(json["resident"][0]["since_step"], 4);
}

/// `deque(maxlen=window)` of each step's 1 KiB block, over `steps` steps.
fn window(steps: u64, window: u64) -> Vec<EventRow> {
    let mut rows = Vec::new();
    for s in 1..=steps {
        rows.push(step(s));
        rows.push(malloc_at(0x1000 + s * 0x100, 1024, 10, "aten::relu"));
        if s > window {
            rows.push(free(0x1000 + (s - window) * 0x100, 1024));
        }
    }
    rows
}

/// `recent = deque(maxlen=3)` of each step's block over 12 steps: live bytes rise while the
/// window fills, then stay flat for the rest of the run.
#[test]
fn a_window_that_fills_and_stays_flat_is_bounded_not_a_leak() {
    let (out, leaks) = run(window(12, 3));
    assert!(leaks.leaks().is_empty(), "{}", out.console);
    assert_eq!(
        out.console,
        "====== Resident on device cpu: 1 site(s) kept but not growing (not leaks) ======\n  \
         /w/train.py:10 (main): 2.00 KiB (2048 bytes) in 2 block(s) grew from step 3, \
         bounded: stopped growing at step 4; op aten::relu; owner activation; inside \
         /lib/model.py:7 (forward)\n\
         ====== Peak on device cpu: 4.00 KiB of tensors live at step 4, in aten::relu \
         (forward) ======\n  by owner: activation 4.00 KiB\n  [1] /w/train.py:10 (main): \
         4.00 KiB in 4 block(s); op aten::relu; inside /lib/model.py:7 (forward)\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
    assert_eq!(json["resident"][0]["bounded"], true);
    assert_eq!(json["resident"][0]["stopped_at_step"], 4);
    assert_eq!(json["resident"][0]["growth"], "new_blocks");
}

/// The same window, still filling when the run ends (it grew for longer than it has been
/// flat): a leak.
#[test]
fn growth_that_stopped_only_lately_is_still_a_leak() {
    let (out, leaks) = run(window(9, 6));
    // Rises at the ends of steps 3..=7, flat at step end 8: still a leak.
    assert!(!leaks.leaks().is_empty(), "{}", out.console);
    assert!(
        out.console.contains("growing from step 3 to step 7"),
        "{}",
        out.console
    );
}

/// `self.seen = torch.cat([self.seen, x])` each step: one live block, 8 KiB larger every
/// step, each old one freed (never a candidate).
#[test]
fn one_block_replaced_by_a_larger_one_each_step_is_a_leak() {
    // The cat's block of step `s`, and the free of step `s - 1`'s.
    let grown = |s: u64| {
        let mut rows = vec![malloc_at(0x1000 + s * 0x10000, s * 8192, 15, "aten::cat")];
        if s > 1 {
            rows.push(free(0x1000 + (s - 1) * 0x10000, (s - 1) * 8192));
        }
        rows
    };
    let mut rows = Vec::new();
    for s in 1..=8u64 {
        rows.push(step(s));
        rows.extend(grown(s));
        // A per-step temporary at another line, alive at the step end with a size that
        // varies: its live bytes fall, so it does not grow this way.
        let size = [4096, 8192, 2048][(s % 3) as usize];
        rows.push(malloc_at(0x90_0000 + s * 0x10000, size, 30, "aten::mul"));
        if s > 1 {
            let before = [4096, 8192, 2048][((s - 1) % 3) as usize];
            rows.push(free(0x90_0000 + (s - 1) * 0x10000, before));
        }
    }
    let (out, leaks) = run(rows);
    // The block live at the end (step 8's) is the leak's `Direct ... leak` line.
    assert_eq!(leaks.leaks().len(), 1, "{}", out.console);
    assert_eq!(leaks.leaks()[0].size, 8 * 8192);
    assert!(
        out.console.contains(
            "[1] /w/train.py:15 (main): +8.00 KiB (8192 bytes) in one block replaced by a \
             larger one per step, growing from step 3 to step 7; 64.0 KiB leaked in 1 block(s)"
        ),
        "{}",
        out.console
    );
    let json: serde_json::Value =
        serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
    assert_eq!(json["leaks"][0]["growth"], "replaced");
    assert_eq!(json["leaks"][0]["series"][0], serde_json::json!([2, 16384]));
    // Its live block is what the holder search looks for.
    let mut again = Leaks::new();
    let rows = (1..=8u64).flat_map(|s| std::iter::once(step(s)).chain(grown(s)));
    for (i, mut row) in rows.enumerate() {
        row.id = i as u64 + 1;
        again.feed(&row);
    }
    let ptrs: Vec<u64> = again.suspects(10, 3).iter().map(|s| s.1).collect();
    assert_eq!(ptrs, vec![0x1000 + 8 * 0x10000]);
}

/// The peak's owner split follows OWNER rows and adds up to the peak.
#[test]
fn the_peak_is_split_by_owner_as_relabelled() {
    let with_owner = |mut r: EventRow, owner: &str| {
        let raw = r.attrs_json.take().unwrap();
        r.attrs_json = Some(raw.replace("PTA@activation", owner));
        r
    };
    let mut moved = EventRow::new(Event::System, EventType::Owner, "PTA@gradient");
    moved.device = CPU;
    moved.ptr = Some(0x2000);
    let rows = vec![
        with_owner(malloc_at(0x1000, 4096, 5, "aten::empty"), "PTA@weight"),
        step(1),
        malloc_at(0x2000, 1024, 10, "aten::mm"),
        moved,
        malloc_at(0x3000, 512, 11, "aten::relu"),
        free(0x3000, 512),
        step(2),
    ];
    let (out, _) = run(rows);
    let peak: serde_json::Value = serde_json::from_str(&file_text(&out, peak::PEAK_FILE)).unwrap();
    let p = &peak["devices"][0]["peak"];
    assert_eq!(p["bytes"], 4096 + 1024 + 512);
    assert_eq!(
        p["owners"],
        serde_json::json!([
            {"owner": "weight", "bytes": 4096},
            {"owner": "gradient", "bytes": 1024},
            {"owner": "activation", "bytes": 512},
        ])
    );
    assert!(out
        .console
        .contains("  by owner: weight 4.00 KiB, gradient 1.00 KiB, activation 512 B\n"));
}

/// A line run by several modules (one layer class, many layers) is one line at the peak,
/// naming the modules.
#[test]
fn the_peaks_lines_name_their_modules() {
    let in_module = |mut r: EventRow, module: &str| {
        let raw = r.attrs_json.take().unwrap();
        r.attrs_json = Some(raw.replace("\"op\"", &format!("\"module\":\"{module}\",\"op\"")));
        r
    };
    let rows = vec![
        step(1),
        in_module(
            malloc_at(0x1000, 4096, 17, "aten::_softmax"),
            "model.0.attn",
        ),
        in_module(
            malloc_at(0x2000, 4096, 17, "aten::_softmax"),
            "model.1.attn",
        ),
        malloc_at(0x3000, 512, 30, "aten::mul"),
        free(0x3000, 512),
        step(2),
    ];
    let (out, _) = run(rows);
    let peak: serde_json::Value = serde_json::from_str(&file_text(&out, peak::PEAK_FILE)).unwrap();
    let top = &peak["devices"][0]["peak"]["lines"][0];
    assert_eq!(top["line"], 17);
    assert_eq!(top["bytes"], 8192);
    assert_eq!(
        top["modules"],
        serde_json::json!(["model.0.attn", "model.1.attn"])
    );
    assert!(
        out.console.contains(
            "  [1] /w/train.py:17 (main): 8.00 KiB in 2 block(s); op aten::_softmax; in \
             model.0.attn, model.1.attn\n"
        ),
        "{}",
        out.console
    );
}

#[test]
fn suspects_are_the_live_blocks_of_leaking_sites() {
    let mut leaks = Leaks::new();
    for (i, mut row) in training(false).into_iter().enumerate() {
        row.id = i as u64 + 1;
        leaks.feed(&row);
    }
    let ptrs: Vec<u64> = leaks.suspects(10, 2).iter().map(|s| s.1).collect();
    // The newest two candidates of line 10 (step 5's, then step 4's); none of line 20.
    assert_eq!(ptrs, vec![0x1500, 0x1400]);
    assert_eq!(leaks.suspects(10, 1)[0].3, "/w/train.py:10 (main)");
}

#[test]
fn an_accumulation_window_that_is_freed_and_made_again_is_resident() {
    // Gradients made in step 2, freed in step 6, made again in step 6 and freed in step 10:
    // the site's live candidate bytes go 4096, 0, 4096 and never pass their first high.
    let mut rows = Vec::new();
    for s in 1..=11u64 {
        rows.push(step(s));
        if s == 6 || s == 10 {
            rows.push(free(0x7000 + (s - 4) * 0x100, 4096));
        }
        if s == 2 || s == 6 {
            rows.push(malloc_at(0x7000 + s * 0x100, 4096, 40, "aten::add"));
        }
    }
    let (out, leaks) = run(rows);
    assert!(leaks.leaks().is_empty(), "{:?}", leaks.leaks());
    assert!(!out.console.contains("Direct"), "{}", out.console);
    assert!(out.console.contains("Resident on device cpu: 1 site(s)"));
}

#[test]
fn blocks_that_only_outlive_the_last_step_judge_nothing() {
    // Step 4's block is live when the input ends (the program's last step): no step the
    // program marked ended after it, so it is neither a leak nor resident.
    let rows = vec![step(1), step(2), step(3), step(4), malloc(0x30, 1024)];
    let (out, leaks) = run(rows.clone());
    assert!(leaks.leaks().is_empty());
    assert_eq!(
        file_text(&out, REPORT_FILE),
        "====== No memory leaks detected ======\n"
    );
    // Too few steps to judge: the console says so.
    assert_eq!(
        out.console,
        "====== Peak on device cpu: 1.00 KiB of tensors live at step 4 ======\n  [1] (no \
         Python line recorded for these blocks): 1.00 KiB in 1 block(s)\n\
         msmemscope: the leaks analysis saw 4 step(s); a leak is judged by growth at two \
         step ends from step 2 on, which takes 5 steps\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&file_text(&out, findings::FINDINGS_FILE)).unwrap();
    assert_eq!(json["unjudged_blocks"], 0);
    assert_eq!(json["leaks"], serde_json::json!([]));
}

#[test]
fn a_run_without_steps_says_how_to_give_them() {
    let (out, _) = run(vec![malloc(0x30, 1024)]);
    assert!(out
        .console
        .contains("\nmsmemscope: the leaks analysis saw no steps"));
}

#[test]
fn block_freed_within_a_step_of_its_allocation_is_not_a_leak() {
    let rows = vec![
        step(1),
        step(2),
        malloc(0x30, 1024),
        step(3),
        free(0x30, 1024),
        malloc(0x30, 2048), // the address reused in step 3, freed in step 4
        step(4),
        free(0x30, 2048),
        step(5),
        step(6),
    ];
    let (out, leaks) = run(rows);
    assert!(leaks.leaks().is_empty(), "{:?}", leaks.leaks());
    // Only the peak: step 3's 2 KiB block, the 1 KiB one freed before it.
    assert_eq!(
        out.console,
        "====== Peak on device cpu: 2.00 KiB of tensors live at step 3 ======\n  [1] (no \
         Python line recorded for these blocks): 2.00 KiB in 1 block(s)\n"
    );
}

#[test]
fn hal_blocks_live_at_exit_and_sites_from_python_stacks() {
    let cuda = DeviceId::Cuda(0);
    let mut kernel = EventRow::new(Event::KernelLaunch, EventType::KernelLaunch, "gemm");
    kernel.device = cuda;
    let mut rows = vec![
        block(Event::Malloc, EventType::Hal, cuda, 0x7000, 2 << 20, 0), // HAL, step 0
        step(1),
        kernel.clone(),
    ];
    // A dump without `site` Attrs: the first Python frame names the site.
    for s in 2..=6u64 {
        rows.push(step(s));
        let mut m = block(Event::Malloc, EventType::Pta, cuda, 0x9000 + s, 512, 0);
        m.python_stack = "/w/run.py(12): loop\n/w/run.py(30): <module>".into();
        rows.push(m);
    }
    let (out, leaks) = run(rows);
    assert_eq!(leaks.leaks().len(), 5, "{}", out.console); // 4 PTA + the HAL block
    assert!(out.console.contains(
        "Direct HAL leak of 2.000 Mb(s) at 0x0000000000007000 in kernel_N/A at step 0.\n"
    ));
    assert!(out.console.contains(
        "[1] /w/run.py:12 (loop): +512 B (512 bytes) in 1 block(s) per step, growing from step 3 to step 5"
    ), "{}", out.console);
}

#[test]
fn parsed_attrs_and_step_numbers_from_names() {
    // Rows read back from a dump have `attrs` parsed and no raw JSON.
    let mut rows = Vec::new();
    for s in [5u64, 6, 7, 8, 9] {
        rows.push(step(s));
        let mut m = EventRow::new(Event::Malloc, EventType::Pta, "");
        m.device = CPU;
        m.ptr = Some(0xabc + s);
        m.attrs.insert("size".into(), 3_145_728u64.into());
        m.attrs.insert("site".into(), "/w/a \"q\".py:3 (f)".into());
        rows.push(m);
    }
    let (out, leaks) = run(rows);
    assert_eq!(leaks.leaks()[0].step, 5);
    assert!(out.console.contains("Direct PTA leak of 3.000 Mb(s)"));
    assert!(
        out.console.contains("[1] /w/a \"q\".py:3 (f): +3.00 MiB"),
        "{}",
        out.console
    );
}

#[test]
fn mb_rounding() {
    assert_eq!(mb(0), "0.000");
    assert_eq!(mb(524), "0.000"); // 0.00049…
    assert_eq!(mb(525), "0.001"); // 0.00050…
    assert_eq!(mb(15_728), "0.015");
    assert_eq!(mb(1_048_576 * 3 / 2), "1.500");
}

#[test]
fn human_sizes_and_site_texts() {
    use findings::{human, split_site};
    assert_eq!(human(512), "512 B");
    assert_eq!(human(64_000), "62.5 KiB");
    assert_eq!(human(4_718_592), "4.50 MiB");
    assert_eq!(human(300 << 20), "300 MiB");
    assert_eq!(
        split_site("/a:b/train.py:42 (main)"),
        Some(("/a:b/train.py", 42, "main"))
    );
    assert_eq!(split_site("no line here"), None);
}
