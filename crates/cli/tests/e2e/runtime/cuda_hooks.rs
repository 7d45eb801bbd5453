//! The CUDA backend end to end, without a GPU: stand-in CUDA libraries built here from
//! tests/fixtures/fake_cuda/ (a libcuda.so.1 and a libcudart.so.12 that export the real names
//! with the real signatures over a pretend device memory) and C programs that reach them by
//! direct linking, by dlopen + dlsym, by cuGetProcAddress, and through the runtime API
//! (tests/fixtures/cuda_driver.c, cuda_runtime.c), run under the real CLI. The dumps are checked
//! row by row: HAL MALLOC/FREE with sizes, devices, allocation ids and pool totals, kernel
//! launches with names and streams, the OOM trigger, and the race checker's verdict on the
//! synchronization calls. Every program prints its results, and must print the same under the
//! tool as without it.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use msmemscope_core::events::{reader, EventRow};

use crate::util::{build_dir, gcc, launch_ok, repo, venv_python, Scratch, BIN};

/// The stand-in libraries and the programs, built once per test process.
struct Built {
    driver_direct: PathBuf,
    driver_dynamic: PathBuf,
    runtime: PathBuf,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let fixtures = repo().join("tests/fixtures");
        let dir = build_dir("fake-cuda");
        let d = dir.to_str().unwrap();
        let src = |name: &str| fixtures.join(name).to_str().unwrap().to_string();
        let rpath = format!("-Wl,-rpath,{d}");
        let include = format!("-I{}", fixtures.display());
        gcc(&[
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            &format!("{d}/libcuda.so.1"),
            &src("fake_cuda/libcuda.c"),
        ]);
        gcc(&[
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libcudart.so.12",
            "-Wl,-rpath,$ORIGIN",
            "-o",
            &format!("{d}/libcudart.so.12"),
            &src("fake_cuda/libcudart.c"),
            "-ldl",
            "-lpthread",
        ]);
        for (link, target) in [
            ("libcuda.so", "libcuda.so.1"),
            ("libcudart.so", "libcudart.so.12"),
        ] {
            let _ = std::fs::remove_file(dir.join(link));
            std::os::unix::fs::symlink(target, dir.join(link)).unwrap();
        }
        let built = Built {
            driver_direct: dir.join("cuda_driver_direct"),
            driver_dynamic: dir.join("cuda_driver_dynamic"),
            runtime: dir.join("cuda_runtime"),
        };
        gcc(&[
            "-O1",
            "-g",
            "-DDIRECT_LINK",
            &include,
            "-o",
            built.driver_direct.to_str().unwrap(),
            &src("cuda_driver.c"),
            &format!("-L{d}"),
            "-lcuda",
            &rpath,
            "-ldl",
        ]);
        gcc(&[
            "-O1",
            "-g",
            &include,
            "-o",
            built.driver_dynamic.to_str().unwrap(),
            &src("cuda_driver.c"),
            &rpath,
            "-ldl",
        ]);
        gcc(&[
            "-O1",
            "-g",
            "-rdynamic",
            &include,
            "-o",
            built.runtime.to_str().unwrap(),
            &src("cuda_runtime.c"),
            &format!("-L{d}"),
            "-lcudart",
            &rpath,
        ]);
        built
    })
}

/// A run under the CLI: its stdout, what the launcher printed (stderr), and the rows of each
/// device's dump (SYSTEM rows left out; the reader gives `N/A` names as empty).
struct Run {
    stdout: String,
    report: String,
    rows: BTreeMap<String, Vec<EventRow>>,
    dumps: BTreeMap<String, PathBuf>,
}

fn plain(program: &Path, mode: &str) -> String {
    let out = Command::new(program)
        .arg(mode)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8(out.stdout).unwrap()
}

fn traced(scratch: &Scratch, options: &[&str], program: &Path, mode: &str) -> Run {
    let out_dir = scratch.path().join("out");
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = launch_ok(options, &out_dir, &[program.as_os_str(), OsStr::new(mode)]);
    let mut rows = BTreeMap::new();
    let mut dumps = BTreeMap::new();
    for run in std::fs::read_dir(&out_dir).unwrap().flatten() {
        for device in std::fs::read_dir(run.path()).unwrap().flatten() {
            let name = device.file_name().to_string_lossy().into_owned();
            let Some(device_name) = name.strip_prefix("device_") else {
                continue;
            };
            for file in std::fs::read_dir(device.path().join("dump"))
                .unwrap()
                .flatten()
            {
                let kept: Vec<EventRow> = reader::open(&file.path())
                    .unwrap()
                    .map(|r| r.unwrap())
                    .filter(|r| r.event.as_str() != "SYSTEM")
                    .collect();
                rows.insert(device_name.to_string(), kept);
                dumps.insert(device_name.to_string(), file.path());
            }
        }
    }
    Run {
        stdout: String::from_utf8(out.stdout).unwrap(),
        report: String::from_utf8(out.stderr).unwrap(),
        rows,
        dumps,
    }
}

/// (Event, Event Type, Name, Ptr, Attr) of a device's rows.
fn summary(run: &Run, device: &str) -> Vec<(String, String, String, String, String)> {
    run.rows
        .get(device)
        .unwrap_or_else(|| panic!("no dump for device {device}: {:?}", run.rows.keys()))
        .iter()
        .map(|r| {
            (
                r.event.as_str().to_string(),
                r.event_type.as_str().to_string(),
                r.name.clone(),
                r.ptr.map_or("N/A".into(), |p| format!("0x{p:x}")),
                r.attrs_text(),
            )
        })
        .collect()
}

type Expected = (&'static str, &'static str, String, String, String);

fn malloc(id: u64, addr: u64, size: u64, used: u64, api: &str) -> Expected {
    (
        "MALLOC",
        "HAL",
        String::new(),
        format!("0x{addr:x}"),
        format!(
            "{{\"allocation_id\":{id},\"addr\":\"0x{addr:016x}\",\"size\":{size},\"used\":{used},\
             \"total\":{used},\"owner\":\"HAL\",\"api\":\"{api}\"}}"
        ),
    )
}

fn free(id: u64, addr: u64, size: u64, used: u64) -> Expected {
    (
        "FREE",
        "HAL",
        String::new(),
        format!("0x{addr:x}"),
        format!(
            "{{\"allocation_id\":{id},\"addr\":\"0x{addr:016x}\",\"size\":{size},\"used\":{used},\
             \"total\":{used}}}"
        ),
    )
}

fn kernel(name: &str, stream: u64) -> Expected {
    (
        "KERNEL_LAUNCH",
        "KERNEL_LAUNCH",
        name.into(),
        "N/A".into(),
        format!("{{\"streamId\":{stream}}}"),
    )
}

fn oom(func: &str, size: u64, error: &str) -> Expected {
    (
        "OOM_DETAIL",
        "OOM_TRIGGER",
        String::new(),
        "N/A".into(),
        format!("{{\"func\":\"{func}\",\"req_size\":{size},\"error\":\"{error}\"}}"),
    )
}

fn owned(expected: Vec<Expected>) -> Vec<(String, String, String, String, String)> {
    expected
        .into_iter()
        .map(|(e, t, n, p, a)| (e.into(), t.into(), n, p, a))
        .collect()
}

const DEV0: u64 = 0x7000_0000_0000;
const DEV1: u64 = 0x7010_0000_0000;
const MIB: u64 = 1 << 20;

/// What cuda_driver.c's `exercise` leaves on device 0 (`kernels`: with --level=kernel).
fn driver_device0(kernels: bool) -> Vec<Expected> {
    let mut rows = vec![
        malloc(1, DEV0, MIB, MIB, "cuMemAlloc_v2"),
        // 1000 bytes wide rows padded to a 1024-byte pitch, 10 rows.
        malloc(2, DEV0 + 0x100000, 10240, MIB + 10240, "cuMemAllocPitch_v2"),
        malloc(3, DEV0 + 0x102800, 4096, MIB + 14336, "cuMemAllocAsync"),
        free(1, DEV0, MIB, 14336),
        free(3, DEV0 + 0x102800, 4096, 10240),
    ];
    if kernels {
        rows.push(kernel("matmul(float*, float*, float*, int)", 0x51));
        rows.push(kernel("softmax_kernel", 0x52));
    }
    rows.extend([
        malloc(6, DEV0 + 0x103800, 8192, 18432, "cuMemAlloc_v2"),
        free(6, DEV0 + 0x103800, 8192, 10240),
        malloc(7, DEV0 + 0x105800, 16384, 26624, "cuMemAllocManaged"),
        free(7, DEV0 + 0x105800, 16384, 10240),
        oom("cuMemAlloc_v2", 64 << 30, "CUDA_ERROR_OUT_OF_MEMORY"),
    ]);
    rows
}

/// Device 1: a plain block freed while device 0 was current, and a physical allocation of the
/// virtual memory API that goes only once released *and* unmapped.
fn driver_device1() -> Vec<Expected> {
    vec![
        malloc(4, DEV1, 2 * MIB, 2 * MIB, "cuMemAlloc_v2"),
        free(4, DEV1, 2 * MIB, 0),
        malloc(5, 0x5000, 2 * MIB, 2 * MIB, "cuMemCreate"),
        free(5, 0x5000, 2 * MIB, 0),
    ]
}

fn check_driver_run(mode: &str) {
    let b = built();
    let program = if mode == "direct" {
        &b.driver_direct
    } else {
        &b.driver_dynamic
    };
    let scratch = Scratch::new(&format!("cuda-{mode}"));
    let run = traced(&scratch, &["--level=kernel"], program, mode);
    let mut device0 = driver_device0(true);
    if mode == "procaddr" {
        // The per-thread default stream variant has a wrapper of its own; the 32-bit ABI of
        // cuMemAlloc (CUDA < 3.2) is handed out unwrapped and leaves no row.
        device0.push(kernel("ptsz_kernel", 0));
    }
    assert_eq!(summary(&run, "0"), owned(device0), "{mode}");
    assert_eq!(summary(&run, "1"), owned(driver_device1()), "{mode}");
    assert_eq!(
        run.stdout,
        plain(program, mode),
        "{mode}: the program's output changed"
    );
    // The block never freed is the HAL leak of the run.
    assert!(
        run.report
            .contains("Direct HAL leak of 0.010 Mb(s) at 0x0000700000100000"),
        "{}",
        run.report
    );
}

#[test]
fn direct_linking() {
    check_driver_run("direct");
}

#[test]
fn dlopen_and_dlsym() {
    check_driver_run("dlsym");
}

#[test]
fn cu_get_proc_address() {
    check_driver_run("procaddr");
}

#[test]
fn runtime_api_records_each_call_once() {
    let b = built();
    let scratch = Scratch::new("cuda-runtime");
    let run = traced(&scratch, &["--level=kernel"], &b.runtime, "run");
    // cudart's own driver calls (through the wrapped cuGetProcAddress) are the same events:
    // one row per runtime call, named after it.
    assert_eq!(
        summary(&run, "0"),
        owned(vec![
            malloc(1, DEV0, 3 * MIB, 3 * MIB, "cudaMalloc"),
            malloc(2, DEV0 + 0x300000, 8192, 3 * MIB + 8192, "cudaMallocAsync"),
            free(2, DEV0 + 0x300000, 8192, 3 * MIB),
            // Named by cudaFuncGetName, and by the host stub's symbol when cudart has no name.
            kernel("vector_add(float*, float*, int)", 0x61),
            kernel("relu_forward(float*)", 0),
            malloc(
                4,
                DEV0 + 0x302000,
                65536,
                3 * MIB + 65536,
                "cudaMallocManaged"
            ),
            // 1000-byte rows padded to a 1024-byte pitch, 4 rows.
            malloc(5, DEV0 + 0x312000, 4096, 3 * MIB + 69632, "cudaMallocPitch"),
            free(4, DEV0 + 0x302000, 65536, 3 * MIB + 4096),
            free(5, DEV0 + 0x312000, 4096, 3 * MIB),
            oom("cudaMalloc", 64 << 30, "cudaErrorMemoryAllocation"),
        ])
    );
    assert_eq!(
        summary(&run, "1"),
        owned(vec![
            malloc(3, DEV1, 1024, 1024, "cudaMalloc"),
            free(3, DEV1, 1024, 0),
        ])
    );
    assert_eq!(run.stdout, plain(&b.runtime, "run"));
    assert!(
        run.report
            .contains("Direct HAL leak of 3.000 Mb(s) at 0x0000700000000000"),
        "{}",
        run.report
    );
}

#[test]
fn kernel_rows_only_at_kernel_level() {
    let b = built();
    let scratch = Scratch::new("cuda-op-level");
    let run = traced(&scratch, &[], &b.driver_direct, "direct");
    assert_eq!(summary(&run, "0"), owned(driver_device0(false)));
    let run = traced(
        &scratch,
        &["--level=kernel", "--events=launch", "--analysis=none"],
        &b.driver_direct,
        "direct",
    );
    assert_eq!(
        summary(&run, "0"),
        owned(vec![
            kernel("matmul(float*, float*, float*, int)", 0x51),
            kernel("softmax_kernel", 0x52),
            oom("cuMemAlloc_v2", 64 << 30, "CUDA_ERROR_OUT_OF_MEMORY"),
        ])
    );
}

#[test]
fn out_of_memory_triggers_the_oom_analysis() {
    let b = built();
    let scratch = Scratch::new("cuda-oom");
    let run = traced(
        &scratch,
        &["--analysis=oom:2", "--call-stack=c:4"],
        &b.driver_dynamic,
        "dlsym",
    );
    let rows = &run.rows["0"];
    let at = rows
        .iter()
        .position(|r| r.event_type.as_str() == "OOM_TRIGGER")
        .expect("an OOM trigger");
    let after: Vec<(&str, Option<u64>)> = rows[at..]
        .iter()
        .map(|r| (r.event_type.as_str(), r.ptr))
        .collect();
    // Live on device 0 at the failure: only the pitched block.
    assert_eq!(
        after,
        vec![
            ("OOM_TRIGGER", None),
            ("OOM_RECENT_ALLOC", Some(DEV0 + 0x100000)),
            ("OOM_TOP_ALLOC", Some(DEV0 + 0x100000)),
            ("SNAPSHOT", None),
        ]
    );
    let mut snapshot = rows[at + 3].clone();
    snapshot.parse_attrs();
    assert_eq!(snapshot.attr_u64("allocated"), Some(10240));
    // The trigger and the allocations carry the program's stack.
    assert!(
        rows[at].c_stack.starts_with("exercise "),
        "{}",
        rows[at].c_stack
    );
    assert!(
        rows[0].c_stack.starts_with("exercise "),
        "{}",
        rows[0].c_stack
    );
}

#[test]
fn a_program_without_cuda_sees_no_difference() {
    let b = built();
    let scratch = Scratch::new("cuda-none");
    let run = traced(&scratch, &[], &b.driver_dynamic, "nocuda");
    let expected = "cudaMalloc absent error set\n\
                    cuMemAlloc_v2 absent cuInit absent\n\
                    malloc found cos found libcuda not loaded\n";
    assert_eq!(plain(&b.driver_dynamic, "nocuda"), expected);
    assert_eq!(run.stdout, expected);
    assert!(run.rows.values().all(|rows| rows.is_empty()));
}

#[test]
fn synchronization_reaches_the_race_checker() {
    let b = built();
    let scratch = Scratch::new("cuda-race");
    let unordered = traced(&scratch, &[], &b.driver_direct, "race-nosync");
    assert!(
        unordered
            .report
            .contains("====== msmemscope sanitizer: 1 possible data race between streams"),
        "{}",
        unordered.report
    );
    // cuEventRecord on the writer's stream and cuStreamWaitEvent on the reader's order them.
    let ordered = traced(&scratch, &[], &b.driver_direct, "race-sync");
    assert!(
        ordered.report.contains(
            "====== msmemscope sanitizer: no data race between streams in 2 sanitizer-op marks"
        ),
        "{}",
        ordered.report
    );
}

#[test]
fn compare_at_kernel_level() {
    let b = built();
    let base_scratch = Scratch::new("cuda-compare-base");
    let base = traced(
        &base_scratch,
        &["--level=kernel"],
        &b.driver_direct,
        "direct",
    );
    let other_scratch = Scratch::new("cuda-compare-other");
    let other = traced(
        &other_scratch,
        &["--level=kernel"],
        &b.driver_dynamic,
        "procaddr",
    );
    let out_dir = base_scratch.path().join("compare-out");
    let out = Command::new(BIN)
        .arg("--compare")
        .arg(format!(
            "--input-path={},{}",
            base.dumps["0"].display(),
            other.dumps["0"].display()
        ))
        .arg("--level=kernel")
        .arg(format!("--output-path={}", out_dir.display()))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).unwrap();
    let text = std::fs::read_to_string(path.trim_end()).unwrap();
    // softmax_kernel is the latest kernel when the 8 KiB and 16 KiB blocks are allocated; the compare run
    // launches one more kernel through the per-thread-stream variant.
    assert_eq!(
        text,
        ",,,Base,Compare\n\
         Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)\n\
         KERNEL_LAUNCH,\"matmul(float*, float*, float*, int)\",0,0,0,0\n\
         KERNEL_LAUNCH,softmax_kernel,0,24576,24576,0\n\
         KERNEL_LAUNCH,ptsz_kernel,0,N/A,0,0\n"
    );
}

#[test]
fn caching_allocator_oom_observer_and_nvml() {
    // PyTorch (a CUDA build, on a machine without a GPU) under the launcher: the observer is
    // queued for CUDA's initialization, which never comes; called as PyTorch calls it, it
    // writes the trigger and the allocator's snapshot. NVML is a stand-in built here.
    let python = venv_python();
    let fixtures = repo().join("tests/fixtures");
    let scratch = Scratch::new("cuda-observer");
    let nvml_dir = scratch.path().join("nvml");
    std::fs::create_dir_all(&nvml_dir).unwrap();
    gcc(&[
        "-shared",
        "-fPIC",
        "-O2",
        "-o",
        nvml_dir.join("libnvidia-ml.so.1").to_str().unwrap(),
        fixtures.join("fake_cuda/libnvidia-ml.c").to_str().unwrap(),
    ]);
    let script = "\
import torch
from msmemscope.capture import cuda_allocator as ca
print(ca.attach_oom_observer(), ca.attach_oom_observer())
print(ca.device_memory(0), ca.device_memory(1))
ca._on_oom(0, 1 << 30, 80 << 30, 1 << 20)
print(torch.cuda.is_initialized())
";
    let out_dir = scratch.path().join("out");
    let out = Command::new(BIN)
        .arg("-o")
        .arg(&out_dir)
        .arg(&python)
        .arg("-c")
        .arg(script)
        .env_remove("LD_PRELOAD")
        .env("LD_LIBRARY_PATH", &nvml_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "True True\n(85899345920, 84825604096) None\nFalse\n"
    );
    let dump = std::fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|run| run.path().join("device_0/dump"))
        .find(|d| d.is_dir())
        .expect("a device 0 dump");
    let file = std::fs::read_dir(dump)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let rows: Vec<(String, String, String)> = reader::open(&file)
        .unwrap()
        .map(|r| r.unwrap())
        .filter(|r| r.event.as_str() != "SYSTEM")
        .map(|r| {
            (
                r.event_type.as_str().to_string(),
                r.name.clone(),
                r.attrs_text(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "OOM_TRIGGER".to_string(),
                String::new(),
                "{\"func\":\"CUDACachingAllocator\",\"req_size\":1073741824,\"error\":\"CUDA out \
                 of memory: tried to allocate 1073741824 bytes; device total 85899345920, free \
                 1048576\"}"
                    .to_string()
            ),
            (
                "SNAPSHOT".to_string(),
                "oom".to_string(),
                "{\"reserved\":0,\"max_reserved\":0,\"allocated\":0,\"max_allocated\":0,\
                 \"total\":85899345920,\"free\":1048576}"
                    .to_string()
            ),
        ]
    );
}
