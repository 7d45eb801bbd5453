"""The CUDA backend's checks on a real GPU (run by bench/gpu_check.sh, which builds first).

Each check runs real programs under ``target/release/msmemscope-cli``, reads the dumps it
leaves, and prints one ``PASS``/``FAIL`` line with its figures; a summary ends the output and the
exit status is the number of failures. The same file holds the workloads (``python3
bench/gpu_check.py train ...``), so the checks and what they run stay together.

Checks (each bounded by a timeout; the whole run stays under 8 minutes on one H200):
- train_leak: a PyTorch MLP training loop on cuda:0 that keeps one output per step from step 2
  on. The leaks analysis must name PTA leaks on device 0; the dump must hold HAL rows of the
  caching allocator's cudaMalloc and PTA rows whose ``total`` is the pool's reserved bytes.
- overhead: steps/s of the same loop with no tool, under msmemscope (default: op level) and at
  --level=kernel. Reported, not judged (PASS when all three ran).
- kernel_names: the kernel-level run's KERNEL_LAUNCH rows (cudaLaunchKernel from PyTorch,
  cuLaunchKernel(Ex) from cuBLAS' own runtime through cuGetProcAddress): most must be named.
- ctypes_cudamalloc_leak: libcudart through ctypes (dlopen + dlsym): 3 x 16 MiB cudaMalloc,
  one cudaFree. Exact HAL rows and two HAL leaks; the program prints the same as without tool.
- driver_api: bench/gpu_cuda_driver.c (dlsym and cuGetProcAddress_v2 paths, cuMemCreate/Map/
  Unmap/Release, a 4 TiB request, a PTX kernel): exact HAL rows, the OOM trigger with its live
  blocks, the kernel by name.
- torch_oom: a 1 TiB tensor under --analysis=oom: the driver-level trigger (cudaMalloc), the
  caching allocator's observer trigger and snapshot, and the 256 MiB live block among the
  largest.
- compare_kernel: two kernel-level runs with different batch sizes, compared with
  ``--compare --level=kernel``.
- sanitizer_race: two streams touching one tensor, reported through sanitizer-op marks; the
  native checker must see a race without the event and none with cudaEventRecord +
  cudaStreamWaitEvent between them (tolerant: SKIP when this build has no sanitizer).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "target", "release", "msmemscope-cli")
OUT = (
    os.environ.get("GPU_CHECK_OUT")
    or os.environ.get("OUT")
    or os.path.join(ROOT, "bench", "out", "gpu_check")
)
WORK = os.path.join("/tmp", f"msmemscope_gpu_check_{os.getpid()}")
PY = sys.executable
MIB = 1 << 20

HOOKED_ALLOCATIONS = {
    "cudaMalloc",
    "cudaMallocAsync",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocAsync",
    "cuMemCreate",
}

results: list[tuple[str, str, str]] = []


# --- workloads (run as subprocesses) ------------------------------------------------------------


def workload_train(batch: int, steps: int, warmup: int, leak: bool) -> None:
    import torch

    try:
        import msmemscope

        step = msmemscope.step
    except ImportError:  # no tool: nothing marks steps
        step = None
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 1024, device=dev)
    y = torch.randn(batch, 1024, device=dev)
    kept = []
    t0 = time.perf_counter()
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        if step is not None:
            step()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if leak and i >= 2:
            kept.append(out.detach().clone())  # the leak: one batch of outputs per step
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"steps_per_s {steps / elapsed:.2f}")
    print(f"kept {len(kept)}")


def find_cudart() -> str | None:
    import ctypes.util

    candidates = []
    for base in sys.path:
        candidates += glob.glob(os.path.join(base, "nvidia", "**", "libcudart.so*"), recursive=True)
    candidates += glob.glob("/usr/local/cuda*/lib64/libcudart.so*")
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    return sorted(candidates)[-1] if candidates else None


def workload_ctypes() -> None:
    import ctypes

    path = find_cudart()
    if path is None:
        print("no libcudart")
        sys.exit(3)
    lib = ctypes.CDLL(path)
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    ptrs = []
    for _ in range(3):
        p = ctypes.c_void_p()
        print("malloc", lib.cudaMalloc(ctypes.byref(p), 16 * MIB))
        ptrs.append(p.value)
    print("free", lib.cudaFree(ctypes.c_void_p(ptrs[0])))
    print("device_sync", lib.cudaDeviceSynchronize())
    with open(os.environ["GPU_CHECK_PTRS"], "w") as f:
        json.dump(ptrs, f)


def workload_oom() -> None:
    import torch

    keep = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda:0")
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda:0")
        print("no oom")
    except torch.OutOfMemoryError:
        print("oom caught")
    print("kept", keep.numel())


def workload_race(sync: bool) -> None:
    import torch

    import msmemscope

    s1 = torch.cuda.Stream()
    s2 = torch.cuda.Stream()
    x = torch.empty(1 << 20, device="cuda:0")
    torch.cuda.synchronize()
    span = f"x:{x.data_ptr()}:{x.numel() * x.element_size()}"
    with torch.cuda.stream(s1):
        x.fill_(1.0)
        msmemscope.mstx.mark(f"sanitizer-op: name=producer;write={span}", s1)
    if sync:
        event = torch.cuda.Event()
        event.record(s1)  # cudaEventRecord
        s2.wait_event(event)  # cudaStreamWaitEvent
    with torch.cuda.stream(s2):
        y = x * 2
        msmemscope.mstx.mark(f"sanitizer-op: name=consumer;read={span}", s2)
    torch.cuda.synchronize()
    print("sum", float(y.sum()))


# --- running and reading ------------------------------------------------------------------------


def run(cmd: list[str], timeout: int = 150, env: dict | None = None):
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired as e:
        proc = subprocess.CompletedProcess(cmd, 124, e.stdout or "", e.stderr or "")
        if isinstance(proc.stdout, bytes):
            proc.stdout = proc.stdout.decode(errors="replace")
        if isinstance(proc.stderr, bytes):
            proc.stderr = proc.stderr.decode(errors="replace")
    proc.seconds = time.perf_counter() - started
    return proc


def traced(tag: str, options: list[str], cmd: list[str], timeout: int = 150, env=None):
    """Runs ``cmd`` under the CLI; returns (process, the run directory or None)."""
    out_dir = os.path.join(OUT, tag)
    shutil.rmtree(out_dir, ignore_errors=True)
    proc = run([CLI, *options, "-o", out_dir, *cmd], timeout, env)
    runs = sorted(glob.glob(os.path.join(out_dir, "msmemscope_*")))
    return proc, (runs[-1] if runs else None)


def rows(run_dir: str | None, device: str = "0") -> list[dict]:
    if run_dir is None:
        return []
    found = []
    for path in sorted(glob.glob(os.path.join(run_dir, f"device_{device}", "dump", "*.csv"))):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    row["attrs"] = json.loads(row["Attr"] or "{}")
                except ValueError:
                    row["attrs"] = {}
                found.append(row)
    return found


def of(rows_: list[dict], event: str, event_type: str | None = None) -> list[dict]:
    return [
        r
        for r in rows_
        if r["Event"] == event and (event_type is None or r["Event Type"] == event_type)
    ]


def record(name: str, ok: bool | None, figures: str) -> None:
    verdict = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    results.append((name, verdict, figures))
    print(f"{verdict} {name}: {figures}", flush=True)


def failed_run(name: str, proc) -> bool:
    if proc.returncode != 0:
        tail = (proc.stderr or "")[-1500:]
        record(name, False, f"exit status {proc.returncode} after {proc.seconds:.0f} s\n{tail}")
        return True
    return False


def steps_per_s(proc) -> float | None:
    for line in (proc.stdout or "").splitlines():
        if line.startswith("steps_per_s "):
            return float(line.split()[1])
    return None


# --- checks -------------------------------------------------------------------------------------


def check_train_and_overhead() -> tuple[str | None, str | None]:
    train = [PY, __file__, "train", "--batch", "256", "--steps", "60", "--warmup", "10", "--leak"]
    plain = run(train)
    if failed_run("overhead (no tool)", plain):
        return None, None
    op_proc, op_dir = traced("train_op", [], train)
    if failed_run("train_leak", op_proc):
        return None, None
    k_proc, k_dir = traced("train_kernel", ["--level=kernel"], train)
    if failed_run("overhead (--level=kernel)", k_proc):
        k_dir = None

    # The leak.
    report = op_proc.stderr
    device0 = rows(op_dir)
    hal = of(device0, "MALLOC", "HAL")
    pta = of(device0, "MALLOC", "PTA")
    pta_total = [r for r in pta if int(r["attrs"].get("total", 0)) > 0]
    leaks = report.count("Direct PTA leak")
    hal_bytes = sum(int(r["attrs"].get("size", 0)) for r in hal)
    ok = (
        "Detected memory leaks on device 0" in report
        and leaks > 0
        and hal
        and all(r["attrs"].get("api") in HOOKED_ALLOCATIONS for r in hal)
        and len(pta_total) == len(pta) > 0
    )
    record(
        "train_leak",
        bool(ok),
        f"{leaks} PTA leak lines; {len(hal)} HAL MALLOC rows ({hal_bytes // MIB} MiB, "
        f"apis {sorted({r['attrs'].get('api') for r in hal})}); {len(pta)} PTA MALLOC rows, "
        f"{len(pta_total)} with the pool's reserved bytes as total",
    )

    # Overhead.
    base, op, kernel = steps_per_s(plain), steps_per_s(op_proc), steps_per_s(k_proc)
    if base and op and kernel:
        record(
            "overhead",
            True,
            f"steps/s no tool {base:.1f}, msmemscope {op:.1f} ({base / op:.2f}x slower), "
            f"--level=kernel {kernel:.1f} ({base / kernel:.2f}x slower); wall: no tool "
            f"{plain.seconds:.1f} s, msmemscope {op_proc.seconds:.1f} s, kernel "
            f"{k_proc.seconds:.1f} s",
        )
    else:
        record("overhead", False, f"steps/s missing: {base}, {op}, {kernel}")

    # Kernel names.
    launches = of(rows(k_dir), "KERNEL_LAUNCH") if k_dir else []
    named = [r for r in launches if r["Name"] and not r["Name"].startswith("0x")]
    names = sorted({r["Name"] for r in named}, key=len)[:4]
    streams = sorted({r["attrs"].get("streamId") for r in launches}, key=str)[:4]
    record(
        "kernel_names",
        bool(launches) and len(named) >= 0.9 * len(launches),
        f"{len(launches)} KERNEL_LAUNCH rows, {len(named)} named; e.g. {names}; streams {streams}",
    )
    return op_dir, k_dir


def check_ctypes() -> None:
    ptr_file = os.path.join(WORK, "ptrs.json")
    env = dict(os.environ, GPU_CHECK_PTRS=ptr_file)
    cmd = [PY, __file__, "ctypes"]
    plain = run(cmd, env=env)
    if plain.returncode == 3:
        record("ctypes_cudamalloc_leak", None, "no libcudart found")
        return
    if failed_run("ctypes_cudamalloc_leak", plain):
        return
    proc, run_dir = traced("ctypes", [], cmd, env=env)
    if failed_run("ctypes_cudamalloc_leak", proc):
        return
    ptrs = json.load(open(ptr_file))
    device0 = rows(run_dir)
    got = [
        (r["Event"], int(r["Ptr"], 16), int(r["attrs"]["size"]), r["attrs"].get("api"))
        for r in device0
        if r["Event Type"] == "HAL" and r["Ptr"] != "N/A" and int(r["Ptr"], 16) in ptrs
    ]
    want = [("MALLOC", p, 16 * MIB, "cudaMalloc") for p in ptrs] + [
        ("FREE", ptrs[0], 16 * MIB, None)
    ]
    leaks = proc.stderr.count("Direct HAL leak of 16.000 Mb(s)")
    record(
        "ctypes_cudamalloc_leak",
        got == want and leaks == 2 and proc.stdout == plain.stdout,
        f"HAL rows {'as expected' if got == want else got}; {leaks} HAL leaks of 16 MiB; "
        f"output {'unchanged' if proc.stdout == plain.stdout else 'CHANGED'}",
    )


def check_driver() -> None:
    binary = os.path.join(WORK, "gpu_cuda_driver")
    build = run(
        ["gcc", "-O1", "-g", "-o", binary, os.path.join(ROOT, "bench", "gpu_cuda_driver.c"), "-ldl"]
    )
    if failed_run("driver_api (gcc)", build):
        return
    plain = run([binary])
    if failed_run("driver_api (no tool)", plain):
        return
    proc, run_dir = traced("driver", ["--level=kernel", "--analysis=leaks,oom:3"], [binary])
    if failed_run("driver_api", proc):
        return
    device0 = rows(run_dir)
    hal = [
        (r["Event"], int(r["attrs"]["size"]), r["attrs"].get("api"))
        for r in device0
        if r["Event Type"] == "HAL"
    ]
    vmm_size = next(
        (int(line.split()[-1]) for line in plain.stdout.splitlines() if line.startswith("create")),
        0,
    )
    want = [
        ("MALLOC", 32 * MIB, "cuMemAlloc_v2"),
        ("MALLOC", 8 * MIB, "cuMemAlloc_v2"),
        ("FREE", 8 * MIB, None),
        ("MALLOC", vmm_size, "cuMemCreate"),
        ("FREE", vmm_size, None),
    ]
    triggers = of(device0, "OOM_DETAIL", "OOM_TRIGGER")
    top = of(device0, "OOM_DETAIL", "OOM_TOP_ALLOC")
    kernels = [r["Name"] for r in of(device0, "KERNEL_LAUNCH")]
    ok = (
        hal == want
        and len(triggers) == 1
        and int(triggers[0]["attrs"].get("req_size", 0)) == 1 << 42
        and any(int(r["attrs"].get("size", 0)) == 32 * MIB for r in top)
        and kernels == ["noop_kernel"]
        and "Direct HAL leak of 32.000 Mb(s)" in proc.stderr
        and proc.stdout == plain.stdout
    )
    record(
        "driver_api",
        ok,
        f"HAL rows {'as expected' if hal == want else hal}; {len(triggers)} OOM trigger(s), "
        f"{len(top)} top blocks; kernels {kernels}; output "
        f"{'unchanged' if proc.stdout == plain.stdout else 'CHANGED'}",
    )


def check_oom() -> None:
    proc, run_dir = traced("oom", ["--analysis=oom:5"], [PY, __file__, "oom"])
    if failed_run("torch_oom", proc):
        return
    device0 = rows(run_dir)
    triggers = of(device0, "OOM_DETAIL", "OOM_TRIGGER")
    funcs = [r["attrs"].get("func") for r in triggers]
    top = of(device0, "OOM_DETAIL", "OOM_TOP_ALLOC")
    # The allocator observer's snapshot (the runtime's own OOM snapshot has no max_reserved).
    snapshots = [
        r for r in of(device0, "SNAPSHOT") if r["Name"] == "oom" and "max_reserved" in r["attrs"]
    ]
    big = [r for r in top if int(r["attrs"].get("size", 0)) >= 256 * MIB]
    ok = (
        "oom caught" in proc.stdout
        and "cudaMalloc" in funcs
        and "CUDACachingAllocator" in funcs
        and big
        and snapshots
        and int(snapshots[-1]["attrs"].get("total", 0)) > 0
    )
    record(
        "torch_oom",
        bool(ok),
        f"triggers {funcs}; {len(top)} top blocks, {len(big)} of 256 MiB or more; "
        f"{len(snapshots)} allocator snapshot(s)"
        + (
            f", device total {int(snapshots[-1]['attrs'].get('total', 0)) // MIB} MiB"
            if snapshots
            else ""
        ),
    )


def check_compare(base_dir: str | None) -> None:
    if base_dir is None:
        record("compare_kernel", False, "no kernel-level base run")
        return
    other_proc, other_dir = traced(
        "train_kernel_b512",
        ["--level=kernel"],
        [PY, __file__, "train", "--batch", "512", "--steps", "60", "--warmup", "10", "--leak"],
    )
    if failed_run("compare_kernel", other_proc):
        return
    base = glob.glob(os.path.join(base_dir, "device_0", "dump", "*.csv"))
    other = glob.glob(os.path.join(other_dir, "device_0", "dump", "*.csv"))
    out_dir = os.path.join(OUT, "compare")
    proc = run(
        [
            CLI,
            "--compare",
            f"--input-path={base[0]},{other[0]}",
            "--level=kernel",
            f"--output-path={out_dir}",
        ]
    )
    if failed_run("compare_kernel", proc):
        return
    with open(proc.stdout.strip(), newline="") as f:
        lines = list(csv.reader(f))
    body = lines[2:]
    kernels = [r for r in body if r[0] == "KERNEL_LAUNCH"]
    changed = [r for r in kernels if r[5] not in ("0", "N/A")]
    ok = (
        lines[:2]
        == [
            ["", "", "", "Base", "Compare"],
            [
                "Event",
                "Name",
                "Device Id",
                "Allocated Memory(byte)",
                "Allocated Memory(byte)",
                "Diff Memory(byte)",
            ],
        ]
        and len(kernels) > 10
        and changed
    )
    record(
        "compare_kernel",
        bool(ok),
        f"{len(kernels)} kernels aligned, {len(changed)} with a memory difference; e.g. "
        f"{changed[:2]}",
    )


def check_race() -> None:
    verdicts = {}
    for mode in ("nosync", "sync"):
        proc, _ = traced(f"race_{mode}", [], [PY, __file__, "race", mode])
        if failed_run(f"sanitizer_race ({mode})", proc):
            return
        text = proc.stdout + proc.stderr
        if "msmemscope sanitizer:" not in text:
            record("sanitizer_race", None, "this build writes no sanitizer report")
            return
        verdicts[mode] = (
            "race" if "possible data race" in text else "none" if "no data race" in text else "?"
        )
    record(
        "sanitizer_race",
        verdicts == {"nosync": "race", "sync": "none"},
        f"without the event: {verdicts['nosync']}; with cudaEventRecord + cudaStreamWaitEvent: "
        f"{verdicts['sync']}",
    )


def guarded(name: str, check):
    """Runs one check; an exception of the checking code itself is that check's FAIL."""
    try:
        return check()
    except Exception as exc:  # reported; the other checks still run
        record(name, False, f"the check itself failed: {type(exc).__name__}: {exc}")
        return None


def main() -> int:
    started = time.perf_counter()
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    info = run([PY, "-c", "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"])
    print(f"== torch/GPU: {info.stdout.strip() or info.stderr.strip()[-300:]}", flush=True)
    kernel_dir = guarded("train_leak", lambda: check_train_and_overhead()[1])
    guarded("ctypes_cudamalloc_leak", check_ctypes)
    guarded("driver_api", check_driver)
    guarded("torch_oom", check_oom)
    guarded("compare_kernel", lambda: check_compare(kernel_dir))
    guarded("sanitizer_race", check_race)
    failures = sum(1 for _, v, _ in results if v == "FAIL")
    print(
        f"== {len(results)} checks: {failures} FAIL, "
        f"{sum(1 for _, v, _ in results if v == 'SKIP')} SKIP, "
        f"{time.perf_counter() - started:.0f} s"
    )
    for name, verdict, _ in results:
        print(f"   {verdict:4} {name}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_check.txt"), "w") as f:
            for name, verdict, figures in results:
                f.write(f"{verdict} {name}: {figures}\n")
    shutil.rmtree(WORK, ignore_errors=True)
    return failures


def workload_main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="a workload of bench/gpu_check.py")
    sub = parser.add_subparsers(dest="kind", required=True)
    train = sub.add_parser("train")
    train.add_argument("--batch", type=int, default=256)
    train.add_argument("--steps", type=int, default=60)
    train.add_argument("--warmup", type=int, default=10)
    train.add_argument("--leak", action="store_true")
    sub.add_parser("ctypes")
    sub.add_parser("oom")
    race = sub.add_parser("race")
    race.add_argument("mode", choices=["sync", "nosync"])
    args = parser.parse_args(argv)
    if args.kind == "train":
        workload_train(args.batch, args.steps, args.warmup, args.leak)
    elif args.kind == "ctypes":
        workload_ctypes()
    elif args.kind == "oom":
        workload_oom()
    else:
        workload_race(args.mode == "sync")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        workload_main(sys.argv[1:])
    else:
        sys.exit(main())
