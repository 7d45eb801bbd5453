//! Inefficient memory (docs/analyses.md#inefficient): the hand-written dumps in
//! tests/fixtures/dumps/inefficient_* checked offline through core, and a C producer
//! (tests/fixtures/emit_inefficient.c) run online under the real CLI with `--analysis=inefficient`,
//! whose marks must equal both the fixture's known answer and the offline check of the dump it left
//! (CSV and DB).

use std::path::{Path, PathBuf};

use msmemscope_core::analysis::inefficient::{
    check_inefficient, InefficientBlock, InefficientType, Options, BLOCKS_FILE, BLOCKS_HEADER,
};
use msmemscope_core::events::DeviceId;

use InefficientType::*;

use crate::util::{self, dump_fixture, launch_ok, only_dump, stderr, Scratch};

fn producer() -> PathBuf {
    util::producer("emit_inefficient")
}

/// (MALLOC row ID, Ptr, size, kind) of each mark.
fn marks(path: &Path, options: &Options) -> Vec<(u64, u64, u64, InefficientType)> {
    check_inefficient(path, options)
        .unwrap()
        .into_iter()
        .map(|m| {
            assert_eq!(m.device, DeviceId::Cpu);
            (m.id, m.ptr, m.size, m.kind)
        })
        .collect()
}

#[test]
fn hand_written_early_allocation() {
    // A (row 3, 4096 B) is allocated in op 1, first written in op 3; B is freed after op 2.
    let path = dump_fixture("inefficient_early.csv");
    assert_eq!(
        marks(&path, &Options::default()),
        vec![(3, 0x1000, 4096, EarlyAllocation)]
    );
}

#[test]
fn hand_written_late_deallocation() {
    // A (row 3, 2048 B) is last read in op 2 and freed after op 4; B is allocated in op 3.
    let path = dump_fixture("inefficient_late.csv");
    assert_eq!(
        marks(&path, &Options::default()),
        vec![(3, 0x1000, 2048, LateDeallocation)]
    );
}

#[test]
fn hand_written_temporary_idleness() {
    // A (row 3) has 3001 ops between its two accesses, B (row 4) 3000.
    let path = dump_fixture("inefficient_idle.csv");
    assert_eq!(
        marks(&path, &Options::default()),
        vec![(3, 0x1000, 8192, TemporaryIdleness)]
    );
    let lower = Options {
        idle_threshold: 2999,
        ..Options::default()
    };
    assert_eq!(
        marks(&path, &lower),
        vec![
            (3, 0x1000, 8192, TemporaryIdleness),
            (4, 0x2000, 64, TemporaryIdleness)
        ]
    );
    // The filters: size and kind.
    let big = Options {
        mem_size: 65,
        ..lower.clone()
    };
    assert_eq!(marks(&path, &big).len(), 1);
    let other_kind = Options {
        kind: Some(EarlyAllocation),
        ..lower
    };
    assert_eq!(marks(&path, &other_kind), vec![]);
}

/// Runs the producer online; returns the scratch dir, the run directory and the launcher's
/// stderr.
fn run_online(format: &str) -> (Scratch, PathBuf, String) {
    let scratch = Scratch::new(&format!("ineff-{format}"));
    let out_dir = scratch.path().join("out");
    let format_arg = format!("--format={format}");
    let out = launch_ok(
        &[
            "--analysis=inefficient",
            "--events=alloc,free,launch,access",
            &format_arg,
        ],
        &out_dir,
        &[producer().as_os_str()],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "inefficient done\n");
    let run = std::fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("a run directory");
    (scratch, run, stderr(&out))
}

/// The online file's lines as marks.
fn online_marks(run: &Path) -> Vec<InefficientBlock> {
    let text = std::fs::read_to_string(run.join(BLOCKS_FILE)).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(BLOCKS_HEADER));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 5, "{l}");
            InefficientBlock {
                id: f[0].parse().unwrap(),
                ptr: u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap(),
                size: f[2].parse().unwrap(),
                device: DeviceId::parse(f[3]).unwrap(),
                kind: InefficientType::parse(f[4]).unwrap(),
            }
        })
        .collect()
}

fn online_run_agrees_with_fixture_and_offline(format: &str) {
    let (_scratch, run, stderr) = run_online(format);
    let online = online_marks(&run);
    let want = [
        (0x1000, 4096, DeviceId::Cpu, EarlyAllocation),
        (0x1000, 4096, DeviceId::Cpu, TemporaryIdleness),
        (0x9000, 256, DeviceId::Cuda(0), LateDeallocation),
        (0x3000, 2048, DeviceId::Cpu, LateDeallocation),
    ];
    let got: Vec<_> = online
        .iter()
        .map(|m| (m.ptr, m.size, m.device, m.kind))
        .collect();
    assert_eq!(got, want, "{online:?}");
    // The IDs are the MALLOC rows' (A's row precedes G's, which precedes L's).
    assert!(online[0].id == online[1].id && online[0].id < online[2].id);
    assert!(online[2].id < online[3].id);
    // Offline, each device's dump gives that device's marks, IDs included.
    for (device, dir) in [
        (DeviceId::Cpu, "device_cpu"),
        (DeviceId::Cuda(0), "device_0"),
    ] {
        let offline = check_inefficient(&only_dump(&run, dir), &Options::default()).unwrap();
        let expected: Vec<InefficientBlock> = online
            .iter()
            .filter(|m| m.device == device)
            .cloned()
            .collect();
        assert_eq!(offline, expected, "{dir}");
    }
    assert!(
        stderr.contains(
            "Device cpu: early allocation 1 block (4096 bytes), late deallocation 1 block \
             (2048 bytes), temporary idleness 1 block (4096 bytes)."
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "Device 0: early allocation 0 blocks (0 bytes), late deallocation 1 block (256 bytes)"
        ),
        "{stderr}"
    );
}

#[test]
fn online_csv_run_agrees_with_the_fixture_and_offline() {
    online_run_agrees_with_fixture_and_offline("csv");
}

#[test]
fn online_db_run_agrees_with_the_fixture_and_offline() {
    online_run_agrees_with_fixture_and_offline("db");
}
