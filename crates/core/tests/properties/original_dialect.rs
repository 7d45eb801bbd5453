//! Any dump of ours, rewritten in the original msMemScope's dialect (Attr `{key:value}`
//! without quotes, op names as `torch._ops.aten.X.default`, `host` for the CPU, MALLOC rows
//! written beside their FREE, START_TRACE/STOP_TRACE last, then shuffled), reads back as the
//! same rows and gives the same results in every offline analysis: compare (op and kernel
//! level), check_leaks, check_decompose and check_inefficient.

use std::path::Path;

use msmemscope_core::analysis::check_leaks::check_leaks;
use msmemscope_core::analysis::compare::{write_csv, OpCollector};
use msmemscope_core::analysis::decompose::check_decompose;
use msmemscope_core::analysis::inefficient::{check_inefficient, Options};
use msmemscope_core::config::Level;
use msmemscope_core::events::csv::HEADER;
use msmemscope_core::events::reader;
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use crate::util::csv_of;

/// What a generated step does: an op, allocating and freeing blocks; marks between ops.
#[derive(Clone, Debug)]
enum Act {
    Op {
        name: usize,
        allocs: Vec<(u64, bool)>,
        frees: usize,
        access: bool,
        kernel: bool,
    },
    Mark,
}

const OPS: [&str; 4] = ["aten::addmm", "aten::relu", "aten::empty", "aten::mse_loss"];

fn acts() -> impl Strategy<Value = Vec<Act>> {
    let op = (
        0..OPS.len(),
        prop::collection::vec((1u64..1 << 20, any::<bool>()), 0..4),
        0usize..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(name, allocs, frees, access, kernel)| Act::Op {
            name,
            allocs,
            frees,
            access,
            kernel,
        });
    prop::collection::vec(prop_oneof![4 => op, 1 => Just(Act::Mark)], 1..40)
}

/// A dump of ours, in ID and time order, as the PyTorch tracker writes one.
fn dump_of(acts: &[Act]) -> Vec<EventRow> {
    let mut rows = Vec::new();
    let mut ts = 1_764_753_083_000_000_000u64;
    let mut push = |rows: &mut Vec<EventRow>, mut row: EventRow| {
        ts += 1000;
        // With gaps, as in a device's file of a run (the writer numbers rows run-wide).
        row.id = rows.last().map_or(1, |r: &EventRow| r.id + 1 + r.id % 3);
        row.ts_ns = ts;
        row.pid = 4242;
        row.tid = 4242;
        rows.push(row);
    };
    push(
        &mut rows,
        EventRow::new(Event::System, EventType::StartTrace, ""),
    );
    let (mut live, mut next_ptr, mut used, mut allocation) =
        (Vec::new(), 0x7f00_0000_0000u64, 0u64, 0u64);
    for act in acts {
        match act {
            Act::Mark => push(
                &mut rows,
                EventRow::new(Event::Mstx, EventType::Mark, "step"),
            ),
            Act::Op {
                name,
                allocs,
                frees,
                access,
                kernel,
            } => {
                let mut start = EventRow::new(Event::OpLaunch, EventType::AtenStart, OPS[*name]);
                start.device = DeviceId::Cuda(0);
                push(&mut rows, start);
                for &(size, on_cpu) in allocs {
                    let device = if on_cpu {
                        DeviceId::Cpu
                    } else {
                        DeviceId::Cuda(0)
                    };
                    allocation += 1;
                    used += size;
                    let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
                    row.device = device;
                    row.ptr = Some(next_ptr);
                    row.attrs_json = Some(format!(
                        "{{\"allocation_id\":{allocation},\"size\":{size},\"total\":{},\"used\":{used},\"owner\":\"PTA@model@{}\"}}",
                        used + 4096,
                        OPS[*name].trim_start_matches("aten::")
                    ));
                    push(&mut rows, row);
                    live.push((next_ptr, size, device));
                    next_ptr += size.div_ceil(512) * 512;
                }
                if *access {
                    if let Some(&(ptr, _, device)) = live.last() {
                        let mut row = EventRow::new(Event::Access, EventType::Read, "");
                        row.device = device;
                        row.ptr = Some(ptr);
                        push(&mut rows, row);
                    }
                }
                if *kernel {
                    let mut row = EventRow::new(Event::KernelLaunch, EventType::KernelLaunch, "k");
                    row.device = DeviceId::Cuda(0);
                    push(&mut rows, row);
                }
                for _ in 0..*frees {
                    if live.is_empty() {
                        break;
                    }
                    let (ptr, size, device) = live.remove(0);
                    used -= size;
                    let mut row = EventRow::new(Event::Free, EventType::Pta, "");
                    row.device = device;
                    row.ptr = Some(ptr);
                    row.attrs_json = Some(format!("{{\"size\":{size},\"used\":{used}}}"));
                    push(&mut rows, row);
                }
                let mut end = EventRow::new(Event::OpLaunch, EventType::AtenEnd, OPS[*name]);
                end.device = DeviceId::Cuda(0);
                push(&mut rows, end);
            }
        }
    }
    push(
        &mut rows,
        EventRow::new(Event::System, EventType::StopTrace, ""),
    );
    rows
}

/// `{"a":1,"b":"x"}` as the original writes it: `{a:1,b:x}`; no Attr at all as nothing.
fn unquoted(json: &str) -> String {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json).unwrap();
    if object.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = object
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}:{s}"),
            v => format!("{k}:{v}"),
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// The same rows in the original's dialect and order: each MALLOC row written just before
/// its block's FREE (a block never freed: at the end), START_TRACE and STOP_TRACE last, then
/// the rows moved by `swaps` (pairs of positions).
fn original(rows: &[EventRow], swaps: &[(usize, usize)]) -> String {
    let ours = csv_of(rows);
    let mut lines: Vec<Vec<String>> = csv::Reader::from_reader(ours.as_bytes())
        .records()
        .map(|r| r.unwrap().iter().map(str::to_string).collect())
        .collect();
    for fields in &mut lines {
        fields[9] = unquoted(&fields[9]);
        if fields[1] == "OP_LAUNCH" {
            let op = fields[3].trim_start_matches("aten::");
            fields[3] = format!("torch._ops.aten.{op}.default");
        }
        if fields[7] == "cpu" {
            fields[7] = "host".into();
        }
    }
    let (mut order, mut held): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut system = Vec::new();
    for (i, fields) in lines.iter().enumerate() {
        match fields[1].as_str() {
            "SYSTEM" => system.push(i),
            "MALLOC" => held.push(i),
            "FREE" => {
                if let Some(at) = held.iter().position(|&m| lines[m][8] == fields[8]) {
                    order.push(held.remove(at));
                }
                order.push(i);
            }
            _ => order.push(i),
        }
    }
    order.extend(held);
    order.extend(system);
    for &(a, b) in swaps {
        let n = order.len();
        order.swap(a % n, b % n);
    }
    let mut out = csv::Writer::from_writer(Vec::new());
    out.write_record(HEADER.split(',')).unwrap();
    for i in order {
        out.write_record(&lines[i]).unwrap();
    }
    String::from_utf8(out.into_inner().unwrap()).unwrap()
}

/// Every offline analysis's result on the dump at `path`, as text.
fn results(path: &Path) -> Vec<String> {
    let sequence = |level| {
        let mut collector = OpCollector::new(level);
        let mut rows = reader::open_rows(path).unwrap();
        while let Some(row) = rows.next_row().unwrap() {
            collector.feed(row).unwrap();
        }
        collector.finish()
    };
    let compare = |level| {
        let (a, b) = (sequence(level), sequence(level));
        let mut text = Vec::new();
        write_csv(&a, &b, &mut text).unwrap();
        String::from_utf8(text).unwrap()
    };
    let leaks = match check_leaks(path, "step", 0) {
        Ok(result) => format!("{result:?}"),
        Err(e) => e.to_string(),
    };
    vec![
        compare(Level::Op),
        compare(Level::Kernel),
        leaks,
        format!("{:?}", check_decompose(path).unwrap()),
        format!(
            "{:?}",
            check_inefficient(path, &Options::default()).unwrap()
        ),
    ]
}

fn all_rows(path: &Path) -> Vec<EventRow> {
    reader::open(path).unwrap().map(Result::unwrap).collect()
}

proptest! {
    // Failures saved beside this file (`original_dialect.proptest-regressions`): the default,
    // `SourceParallel`, would look in `tests/proptest-regressions/` since `main.rs` is here.
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions"
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_dump_in_the_original_dialect_reads_and_analyses_as_ours(
        acts in acts(),
        swaps in prop::collection::vec((any::<usize>(), any::<usize>()), 0..20),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let rows = dump_of(&acts);
        let (ours_path, theirs_path) = (dir.path().join("ours.csv"), dir.path().join("theirs.csv"));
        std::fs::write(&ours_path, csv_of(&rows)).unwrap();
        std::fs::write(&theirs_path, original(&rows, &swaps)).unwrap();
        prop_assert_eq!(all_rows(&theirs_path), all_rows(&ours_path));
        prop_assert_eq!(results(&theirs_path), results(&ours_path));
    }
}
