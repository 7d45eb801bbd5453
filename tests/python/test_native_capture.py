"""The native PyTorch capture (python/msmemscope/capture/native/): real models and real
programs on CPU, checked against independent counts — an LD_PRELOAD counter of c10's
allocations, torch.profiler, Dynamo's own graph counter."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from conftest import CLI, NEEDS_CLI_AND_TORCH, REPO, clean_env, ok

SCRIPTS = Path(__file__).resolve().parent / "scripts"
COUNTER_SOURCE = Path(__file__).resolve().parent / "native" / "memalign_counter.c"

pytestmark = NEEDS_CLI_AND_TORCH


def native_env(**extra: str) -> dict[str, str]:
    return clean_env(OMP_NUM_THREADS="1", MSMEMSCOPE_TORCH_CAPTURE="native", **extra)


def dump_rows(out: Path) -> list[dict[str, str]]:
    [dump] = sorted(out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv"))
    with dump.open(newline="") as f:
        return list(csv.DictReader(f))


def attrs(row: dict[str, str]) -> dict:
    return json.loads(row["Attr"]) if row["Attr"] else {}


def between_marks(rows, begin: str, end: str) -> list[dict[str, str]]:
    """The rows after the MSTX mark ``begin`` and before ``end``."""
    inside, found = False, []
    for r in rows:
        if r["Event"] == "MSTX":
            text = r["Name"] + r["Attr"]
            if begin in text:
                inside = True
            elif end in text:
                break
            continue
        if inside:
            found.append(r)
    return found


def run_cli(tmp: Path, script: str, *args: str, env=None, options=("--analysis=none",)):
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out"
    path = tmp / "program.py"
    path.write_text(script)
    cmd = [str(CLI), *options, "-o", str(out), sys.executable, str(path), *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=env or native_env(), cwd=tmp
    )
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "tracker error" not in proc.stderr and "unavailable" not in proc.stderr, proc.stderr
    return proc, out


def test_gpt2_step_records_every_c10_allocation_and_the_profilers_live_bytes(
    tmp_path: Path,
) -> None:
    counter = tmp_path / "memalign_counter.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(counter), str(COUNTER_SOURCE), "-ldl"],
        check=True,
    )
    script = str(SCRIPTS / "gpt2_step.py")
    out = tmp_path / "out"
    # The Python API (no preloaded runtime): the counter sees c10's posix_memalign directly.
    counted = subprocess.run(
        [sys.executable, script, "--counter", "--api", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=native_env(LD_PRELOAD=str(counter)),
        cwd=tmp_path,
    )
    stdout = ok(counted)
    [c10_allocations] = [int(ln.split()[1]) for ln in stdout.splitlines() if "COUNTED" in ln]
    step = between_marks(dump_rows(out), "step-begin", "step-end")
    mallocs = [r for r in step if r["Event"] == "MALLOC"]
    assert c10_allocations > 500  # the step really ran (539+ on torch 2.x)
    assert len(mallocs) == c10_allocations

    # Blocks born in the step and live at its end: what torch.profiler (profile_memory) reports
    # for the same step (it sees only blocks allocated while it runs, so that is the measure
    # both can give).
    born = {}
    for r in step:
        a = attrs(r)
        if r["Event"] == "MALLOC":
            born[a["allocation_id"]] = a["size"]
        elif r["Event"] == "FREE":
            born.pop(a["allocation_id"], None)
    profiled = ok(
        subprocess.run(
            [sys.executable, script, "--profiler"],
            capture_output=True,
            text=True,
            timeout=300,
            env=clean_env(OMP_NUM_THREADS="1"),
            cwd=tmp_path,
        )
    )
    [net] = [int(ln.split()[1]) for ln in profiled.splitlines() if "PROFILER_NET" in ln]
    assert net > 0
    assert sum(born.values()) == net


COMPARE = """
import torch
import msmemscope.mstx as mstx
x = torch.randn(1000)
mstx.mark("go")
y = x <= 0.5
mstx.mark("done")
"""


def temporaries(rows) -> list[tuple[list[str], int]]:
    """(ops open at the MALLOC, size) of blocks freed while those ops were still open."""
    stack: list[str] = []
    live: dict[str, tuple[list[str], int]] = {}
    found = []
    for r in between_marks(rows, "go", "done"):
        if r["Event Type"] == "ATEN_START":
            stack.append(r["Name"])
        elif r["Event Type"] == "ATEN_END":
            assert stack.pop() == r["Name"]
        elif r["Event"] == "MALLOC":
            live[r["Ptr"]] = (list(stack), attrs(r)["size"])
        elif r["Event"] == "FREE" and r["Ptr"] in live:
            opened, size = live.pop(r["Ptr"])
            if opened and stack[: len(opened)] == opened:
                found.append((opened, size))
    return found


def test_a_kernels_internal_temporary_is_inside_its_op(tmp_path: Path) -> None:
    _, out = run_cli(tmp_path / "native", COMPARE)
    # The comparison kernel wraps the Python float in a 0-dim double tensor of its own (no op of
    # the dispatcher makes it) and frees it before the op returns.
    assert (["aten::le.Scalar"], 8) in temporaries(dump_rows(out))
    # The dispatch-mode fallback sees only what ops return: no temporary at all.
    env = clean_env(OMP_NUM_THREADS="1", MSMEMSCOPE_TORCH_CAPTURE="python")
    _, fallback = run_cli(tmp_path / "python", COMPARE, env=env)
    assert temporaries(dump_rows(fallback)) == []


COMPILE = """
import torch
from torch._dynamo.utils import counters

@torch.compile
def f(x):
    return (x.sin() + x.cos()) * 2

y = f(torch.randn(4096))
print("GRAPHS", counters["stats"]["unique_graphs"])
print("OUT", y.untyped_storage().data_ptr(), y.untyped_storage().nbytes())
"""


def test_torch_compile_compiles_and_its_allocations_are_recorded(tmp_path: Path) -> None:
    proc, out = run_cli(tmp_path, COMPILE)
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if " " in ln)
    assert int(lines["GRAPHS"]) >= 1
    ptr, nbytes = map(int, lines["OUT"].split())
    assert nbytes == 4096 * 4
    mallocs = [attrs(r) for r in dump_rows(out) if r["Event"] == "MALLOC"]
    assert any(int(a["addr"], 16) == ptr and a["size"] == nbytes for a in mallocs)


EARLY_THREAD = """
import sys, threading
import torch
import msmemscope

go, done = threading.Event(), threading.Event()
seen = {}

def worker():
    go.wait()
    t = torch.ones(12345)
    seen["tid"] = threading.get_native_id()
    seen["ptr"] = t.untyped_storage().data_ptr()
    done.set()
    go.clear()

thread = threading.Thread(target=worker)
thread.start()  # before msmemscope tracks anything
msmemscope.config(output_path=sys.argv[1], analysis="none")
msmemscope.start()
go.set()
done.wait()
thread.join()
msmemscope.stop()
print("THREAD", seen["tid"], seen["ptr"])
"""


def test_a_thread_started_before_tracking_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "early.py"
    path.write_text(EARLY_THREAD)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(path), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=native_env(),
        cwd=tmp_path,
    )
    tid, ptr = map(int, ok(proc).split()[1:3])
    rows = [r for r in dump_rows(out) if r["Event"] == "MALLOC"]
    mine = [r for r in rows if int(r["Thread Id"]) == tid and attrs(r)["size"] == 12345 * 4]
    assert [int(attrs(r)["addr"], 16) for r in mine] == [ptr]


PROFILED = """
import torch
from torch.profiler import ProfilerActivity, profile
import msmemscope.mstx as mstx

before = torch.ones(1000)  # 4000 bytes, before the profiler
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    inside = torch.ones(2000)  # 8000 bytes, while it runs
    total = (inside * 3).sum()
after = torch.ones(3000)  # 12000 bytes, after it
mem = sum(e.self_cpu_memory_usage for e in prof.events())
names = {e.name for e in prof.events()}
print("PROFILER", mem, "aten::ones" in names, float(total))
"""


def test_the_users_torch_profiler_still_works(tmp_path: Path) -> None:
    proc, out = run_cli(tmp_path, PROFILED)
    # The profiler saw its allocations and its ops.
    fields = proc.stdout.split()
    assert fields[0] == "PROFILER" and int(fields[1]) >= 8000 and fields[2] == "True"
    assert float(fields[3]) == 6000.0
    rows = dump_rows(out)
    sizes = [attrs(r)["size"] for r in rows if r["Event"] == "MALLOC"]
    # Outside the session msmemscope records as usual; inside, PyTorch hands the main thread's
    # CPU blocks to our allocator wrapper still, so nothing is lost there either.
    assert 4000 in sizes and 12000 in sizes and 8000 in sizes
    ops = [r["Name"] for r in rows if r["Event Type"] == "ATEN_START"]
    assert ops.count("aten::ones.default") == 3


WHICH_CAPTURE = """
import torch
from msmemscope.capture import torch_tracker
x = torch.ones(10)
print(torch_tracker.capture())
"""


def which_capture(tmp: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Runs a program that prints the capture in use, under the CLI; asserts it succeeded."""
    path = tmp / "which.py"
    path.write_text(WHICH_CAPTURE)
    cmd = [str(CLI), "--analysis=none", "-o", str(out), sys.executable, str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    ok(proc)
    return proc


def test_a_bad_capture_value_warns_and_native_is_used(tmp_path: Path) -> None:
    env = native_env()
    env["MSMEMSCOPE_TORCH_CAPTURE"] = "fast"
    proc = which_capture(tmp_path, tmp_path / "out", env)
    assert proc.stdout == "native\n"
    warnings = [ln for ln in proc.stderr.splitlines() if "MSMEMSCOPE_TORCH_CAPTURE" in ln]
    assert warnings == [
        (
            "msmemscope: warning: MSMEMSCOPE_TORCH_CAPTURE='fast' is not one of native, python; "
            "using native"
        )
    ]


def test_without_a_compiler_the_fallback_records_and_one_line_says_why(tmp_path: Path) -> None:
    env = native_env(CXX="false", MSMEMSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    for attempt in (1, 2):
        out = tmp_path / f"out{attempt}"
        proc = which_capture(tmp_path, out, env)
        assert proc.stdout == "python\n"
        lines = [ln for ln in proc.stderr.splitlines() if "native PyTorch capture" in ln]
        # The first process tries to build (a notice, then why it failed); the second one is
        # told at once that the build failed, without compiling again.
        assert len(lines) == (2 if attempt == 1 else 1), proc.stderr
        assert lines[-1].startswith("msmemscope: warning: native PyTorch capture unavailable: ")
        assert "compiling the native capture (" in lines[-1]
        assert "/capture/native/*.cpp) failed (exit 1; full log in " in lines[-1]
        assert "using the Python dispatch mode" in lines[-1]
        sizes = [attrs(r)["size"] for r in dump_rows(out) if r["Event"] == "MALLOC"]
        assert 40 in sizes


def test_the_library_builds_into_a_fresh_cache(tmp_path: Path) -> None:
    """What a user's first run does: compile against the torch it imports, once."""
    cache = tmp_path / "cache"
    env = clean_env(MSMEMSCOPE_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-m", "msmemscope.capture.native_build"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    path = Path(ok(first).strip())
    assert path.is_file() and cache in path.parents
    assert "building the native PyTorch capture" in first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert Path(ok(again).strip()) == path and again.stderr == ""
    exported = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True)
    assert b"msmemscope_torch_install" in exported.stdout


OPS_THAT_COME_AND_GO = """
import torch

x = torch.ones(4)
for i in range(24):
    # Names of every length around the capture's word-sized checks (8, 16, 24, 32 bytes),
    # each defined in a library of its own that goes before the next is made: the next op's
    # texts may land where the last one's were.
    name = "op" + "x" * i
    overload = "o" + "v" * (i % 17)
    lib = torch.library.Library("mstest", "FRAGMENT")
    lib.define(f"{name}.{overload}(Tensor a) -> Tensor")
    lib.define(f"{name}(Tensor a) -> Tensor")
    lib.impl(f"{name}.{overload}", lambda a: a + 1, "CPU")
    lib.impl(name, lambda a: a + 2, "CPU")
    op = getattr(torch.ops.mstest, name)
    op.default(x)
    getattr(op, overload)(x)
    op.default(x)
    del op
    lib._destroy()
    del lib
"""


def test_each_op_is_named_by_its_own_texts_when_ops_come_and_go(tmp_path: Path) -> None:
    _, out = run_cli(tmp_path, OPS_THAT_COME_AND_GO)
    names = [
        r["Name"]
        for r in dump_rows(out)
        if r["Event Type"] == "ATEN_START" and r["Name"].startswith("mstest::")
    ]
    want = []
    for i in range(24):
        name = "mstest::op" + "x" * i
        want += [f"{name}.default", f"{name}.o" + "v" * (i % 17), f"{name}.default"]
    assert names == want
