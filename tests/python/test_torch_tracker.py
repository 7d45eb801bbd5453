"""The PyTorch tracker (python/msmemscope/capture/torch_tracker.py) end to end: real torch on
CPU, programs run under the CLI as subprocesses, assertions on the dump they leave."""

from __future__ import annotations

import collections
import csv
import importlib.util
import itertools
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import NEEDS_CLI_AND_TORCH, REPO, clean_env, ok, run_python, run_under_cli

CLI = REPO / "target" / "release" / "msmemscope-cli"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = SCRIPTS / "train_loop.py"

pytestmark = NEEDS_CLI_AND_TORCH


class Run:
    """One program run under the CLI: its stdout and its dump rows."""

    def __init__(self, proc: subprocess.CompletedProcess[str], out: Path):
        self.proc = proc
        self.stdout = proc.stdout
        self.out = out

    def dump_files(self, ext: str) -> list[Path]:
        return sorted(self.out.glob(f"msmemscope_*/device_cpu/dump/memscope_dump_*.{ext}"))

    def rows(self) -> list[dict[str, str]]:
        files = self.dump_files("csv")
        assert len(files) == 1, f"expected one CSV dump, got {files}\n{self.proc.stderr}"
        with files[0].open(newline="") as f:
            return list(csv.DictReader(f))

    def known(self) -> dict[str, tuple[int, int]]:
        """`KNOWN label ptr nbytes` lines the script printed."""
        found = {}
        for line in self.stdout.splitlines():
            if line.startswith("KNOWN "):
                _, label, ptr, nbytes = line.split()
                found[label] = (int(ptr), int(nbytes))
        return found


def run_cli(tmp: Path, *options: str, script: Path = TRAIN, args: tuple[str, ...] = ()) -> Run:
    return Run(*run_under_cli(tmp, *options, script=script, args=args))


def attrs(row: dict[str, str]) -> dict:
    return json.loads(row["Attr"]) if row["Attr"] else {}


def of(rows, event: str, event_type: str | None = None) -> list[dict[str, str]]:
    return [
        r
        for r in rows
        if r["Event"] == event and (event_type is None or r["Event Type"] == event_type)
    ]


def check_blocks(rows: list[dict[str, str]]) -> dict[int, dict]:
    """Every FREE matches one earlier MALLOC (same Ptr, allocation_id, size, device), no block
    is freed twice, and each row's `used` is the running sum of live PTA bytes on its device.
    Returns the MALLOC attrs by allocation_id."""
    live: dict[int, dict] = {}
    mallocs: dict[int, dict] = {}
    used: collections.Counter[str] = collections.Counter()
    for r in rows:
        if r["Event Type"] != "PTA" or r["Event"] not in ("MALLOC", "FREE"):
            continue
        a = attrs(r)
        aid, dev = a["allocation_id"], r["Device Id"]
        assert r["Ptr"] == a["addr"] and int(a["addr"], 16) > 0, r
        if r["Event"] == "MALLOC":
            assert aid not in mallocs, f"allocation_id {aid} reused: {r}"
            assert a["size"] > 0 and a["owner"] == "PTA", r
            mallocs[aid] = live[aid] = {**a, "device": dev}
            used[dev] += a["size"]
        else:
            assert aid in live, f"FREE without a live MALLOC: {r}"
            m = live.pop(aid)
            assert (a["addr"], a["size"], dev) == (m["addr"], m["size"], m["device"]), r
            used[dev] -= a["size"]
        assert a["used"] == used[dev], f"used {a['used']} != running sum {used[dev]}: {r}"
    return mallocs


def aten_names(rows, event_type: str = "ATEN_START") -> collections.Counter[str]:
    return collections.Counter(r["Name"] for r in of(rows, "OP_LAUNCH", event_type))


# --- the unedited training loop --------------------------------------------------------------


def test_unedited_training_loop(tmp_path: Path) -> None:
    run = run_cli(tmp_path, "--analysis=none", args=("--threads",))
    rows = run.rows()
    mallocs = check_blocks(rows)
    assert len(of(rows, "FREE")) > 10

    # Known tensors: a MALLOC at the storage's address with its exact nbytes.
    by_ptr = collections.defaultdict(set)
    for m in mallocs.values():
        by_ptr[int(m["addr"], 16)].add(m["size"])
    known = run.known()
    assert known["empty1000_step1"][1] == 4000 and known["zeros37_step1"][1] == 74
    assert known["weight0"][1] == 64 * 32 * 4
    for label, (ptr, nbytes) in known.items():
        assert nbytes in by_ptr[ptr], f"{label}: no MALLOC of {nbytes} bytes at {ptr:#x}"
    sizes = collections.Counter(m["size"] for m in mallocs.values())
    assert sizes[4000] >= 3 and sizes[74] >= 3

    # The ops that ran, forward and backward (autograd runs CPU backward on this thread), and
    # Adam's in-place updates; every START has its END.
    starts, ends = aten_names(rows), aten_names(rows, "ATEN_END")
    assert starts == ends
    for name in (
        "aten::addmm.default",
        "aten::mm.default",
        "aten::relu.default",
        "aten::mse_loss.default",
        "aten::mse_loss_backward.default",
        "aten::threshold_backward.default",
        "aten::empty.memory_format",
        "aten::zeros.default",
        "aten::addcdiv_.default",
    ):
        assert starts[name] >= 3, (name, starts)
    assert all(n.count("::") == 1 and "." in n for n in starts), starts
    launch = of(rows, "OP_LAUNCH")
    assert all(r["Device Id"] == "N/A" and r["Ptr"] == "N/A" for r in launch)
    # START/END nest per thread.
    depth: collections.Counter[str] = collections.Counter()
    for r in launch:
        depth[r["Thread Id"]] += 1 if r["Event Type"] == "ATEN_START" else -1
        assert depth[r["Thread Id"]] >= 0
    # A thread started after install is tracked too.
    ptr, nbytes = known["thread_ones300"]
    [row] = [r for r in of(rows, "MALLOC") if int(r["Ptr"], 16) == ptr and attrs(r)["size"] == 2400]
    main_tid = rows[1]["Thread Id"]
    assert row["Thread Id"] != main_tid
    assert of(rows, "SYSTEM", "START_TRACE") and not of(rows, "ACCESS")
    # Rows are in time order.
    stamps = [int(r["Timestamp(ns)"]) for r in rows]
    assert stamps == sorted(stamps)


def test_step_rows_bracket_the_steps(tmp_path: Path) -> None:
    rows = run_cli(tmp_path, "--analysis=none", args=("--step-api",)).rows()
    check_blocks(rows)
    steps = [i for i, r in enumerate(rows) if r["Event"] == "SYSTEM" and r["Event Type"] == "STEP"]
    assert [rows[i]["Name"] for i in steps] == ["1", "2", "3"]
    bounds = [0, *steps]
    for lo, hi in itertools.pairwise(bounds):
        names = {r["Name"] for r in rows[lo:hi] if r["Event"] == "OP_LAUNCH"}
        # Each step: forward, backward, optimizer.
        assert {"aten::addmm.default", "aten::mm.default", "aten::addcdiv_.default"} <= names
        sizes = [attrs(r)["size"] for r in rows[lo:hi] if r["Event"] == "MALLOC"]
        assert 4000 in sizes and 74 in sizes


def test_access_events(tmp_path: Path) -> None:
    rows = run_cli(tmp_path, "--analysis=none", "--events=alloc,free,launch,access").rows()
    check_blocks(rows)
    acc = of(rows, "ACCESS")
    assert {r["Event Type"] for r in acc} == {"READ", "WRITE"}
    for r in acc:
        a = attrs(r)
        assert list(a) == ["dtype", "shape"] and r["Device Id"] == "cpu", r
        assert isinstance(a["shape"], list) and all(isinstance(n, int) for n in a["shape"])
    seen = collections.defaultdict(set)
    for r in acc:
        a = attrs(r)
        seen[r["Name"], r["Event Type"]].add((a["dtype"], tuple(a["shape"])))
    # addmm(bias, input, weight.t()) of the first layer: reads, and writes a fresh [16, 64].
    assert ("float32", (64,)) in seen["aten::addmm.default", "READ"]
    assert ("float32", (16, 32)) in seen["aten::addmm.default", "READ"]
    assert ("float32", (16, 64)) in seen["aten::addmm.default", "WRITE"]
    # In-place ops write their self argument; float16 zeros are written at creation.
    assert ("float32", (64, 32)) in seen["aten::addcdiv_.default", "WRITE"]
    assert ("float16", (37,)) in seen["aten::zeros.default", "WRITE"]
    # View ops neither allocate nor write.
    assert not seen["aten::t.default", "WRITE"]
    # Each ACCESS of a tracked block points at a MALLOC'd address.
    malloc_ptrs = {r["Ptr"] for r in of(rows, "MALLOC")}
    writes = of(rows, "ACCESS", "WRITE")
    assert sum(r["Ptr"] in malloc_ptrs for r in writes) > len(writes) // 2


def test_events_alloc_only(tmp_path: Path) -> None:
    rows = run_cli(tmp_path, "--analysis=none", "--events=alloc").rows()
    assert len(of(rows, "MALLOC")) > 10
    assert not of(rows, "FREE") and not of(rows, "OP_LAUNCH") and not of(rows, "ACCESS")


def test_deferred_collection_starts_at_start(tmp_path: Path) -> None:
    run = run_cli(
        tmp_path, "--analysis=none", "--collect-mode=deferred", args=("--deferred", "--step-api")
    )
    rows = run.rows()
    check_blocks(rows)  # storages made before start() get no FREE either
    first = rows[0]
    assert (first["Event"], first["Event Type"]) == ("SYSTEM", "START_TRACE"), first
    sizes = collections.Counter(attrs(r)["size"] for r in of(rows, "MALLOC"))
    assert sizes[4000] == 2 and sizes[74] == 2  # steps 2 and 3 only
    # The model's weights predate start(): untracked (the weight lives all along, so no other
    # block can have its address).
    weight_ptr = f"0x{run.known()['weight0'][0]:016x}"
    assert not [r for r in rows if r["Ptr"] == weight_ptr and r["Event"] != "ACCESS"]
    assert [r["Name"] for r in of(rows, "SYSTEM", "STEP")] == ["2", "3"]


def test_db_holds_the_rows_of_the_csv(tmp_path: Path) -> None:
    def summary(records) -> collections.Counter:
        return collections.Counter(
            (r["Event"], r["Event Type"], r["Name"], json.loads(r["Attr"] or "{}").get("size"))
            for r in records
        )

    csv_rows = run_cli(tmp_path / "csv", "--analysis=none", args=("--step-api",)).rows()
    db_run = run_cli(tmp_path / "db", "--analysis=none", "--format=db", args=("--step-api",))
    assert not db_run.dump_files("csv")
    [db] = db_run.dump_files("db")
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    db_rows = [dict(r) for r in con.execute("SELECT * FROM memscope_dump ORDER BY ID")]
    con.close()
    assert list(db_rows[0]) == list(csv_rows[0])
    check_blocks([{k: str(v) for k, v in r.items()} for r in db_rows])
    assert summary(db_rows) == summary(csv_rows)


def test_python_call_stacks(tmp_path: Path) -> None:
    rows = run_cli(tmp_path, "--analysis=none", "--call-stack=python:4").rows()
    mallocs = of(rows, "MALLOC")
    assert mallocs and all(r["Call Stack(Python)"] for r in mallocs)
    torch_dir = os.path.dirname(importlib.util.find_spec("torch").origin)
    for r in mallocs:
        lines = r["Call Stack(Python)"].split("\n")
        assert 1 <= len(lines) <= 4
        # Innermost first; no torch or msmemscope frame at the top.
        assert not lines[0].startswith(torch_dir) and "msmemscope" not in lines[0], lines
        assert all(line.count("(") >= 1 and "): " in line for line in lines), lines
    # The 4000-byte scratch tensor is made at module level of the script.
    scratch = [r for r in mallocs if attrs(r)["size"] == 4000]
    assert all(r["Call Stack(Python)"].split("\n")[0].startswith(f"{TRAIN}(") for r in scratch), (
        scratch[0]["Call Stack(Python)"]
    )
    # Without --call-stack there are none.
    assert not any(r["Call Stack(Python)"] for r in of(rows, "OP_LAUNCH"))


def test_storage_edge_cases(tmp_path: Path) -> None:
    run = run_cli(tmp_path, "--analysis=none", script=SCRIPTS / "tracker_cases.py")
    rows = run.rows()
    mallocs = check_blocks(rows)
    known = run.known()
    sizes_at = collections.defaultdict(list)
    for m in mallocs.values():
        sizes_at[int(m["addr"], 16)].append(m["size"])
    # Views share the storage: one MALLOC; one FREE once the base and every view are gone.
    assert known["view"] == known["base"]
    base_ptr = f"0x{known['base'][0]:016x}"
    base_rows = [r for r in rows if r["Ptr"] == base_ptr and r["Event"] in ("MALLOC", "FREE")]
    assert [(r["Event"], attrs(r)["size"]) for r in base_rows][:2] == [
        ("MALLOC", 1000),
        ("FREE", 1000),
    ]
    # resize_: zero bytes get no MALLOC; growing frees the old block and allocates the new.
    assert 0 not in [m["size"] for m in mallocs.values()]
    assert sizes_at[known["grow80"][0]][:1] == [80]
    assert 4000 in sizes_at[known["grow4000"][0]]
    grow_free = [r for r in of(rows, "FREE") if r["Ptr"] == f"0x{known['grow80'][0]:016x}"]
    assert grow_free and attrs(grow_free[0])["size"] == 80
    # out= into an empty tensor: the block the op gave it.
    assert 12 in sizes_at[known["out12"][0]]
    # split: views of one 24-byte storage; cat: a new 24-byte one.
    assert 24 in sizes_at[known["split"][0]] and 24 in sizes_at[known["cat"][0]]


def test_program_without_torch_is_untouched(tmp_path: Path) -> None:
    run = run_cli(tmp_path, "--analysis=none", script=SCRIPTS / "no_torch.py")
    assert run.stdout.split() == ["False", "False", "False", "45"]
    assert not of(run.rows(), "MALLOC")


# --- in process: install() through the Python API -----------------------------------------------


def test_install_in_process_and_errors_never_reach_the_program(tmp_path: Path) -> None:
    code = f"""
    import json, sys
    import torch
    import msmemscope
    from msmemscope import _native
    from msmemscope.capture import torch_tracker

    msmemscope.config(output_path={str(tmp_path / "out")!r}, analysis="none")
    msmemscope.start()
    torch_tracker.install()
    torch_tracker.install()  # idempotent
    assert torch_tracker.installed()
    a = torch.ones(100)  # 400 bytes, tracked
    print("A", a.untyped_storage().data_ptr())

    # A failing emit: reported once on stderr, the ops still run and give their results.
    tracker = torch_tracker._tracker
    real = tracker.nat
    class Broken:
        def __getattr__(self, name):
            return getattr(real, name)
        def emit(self, *args):
            raise RuntimeError("boom")
    tracker.nat = Broken()
    b = torch.ones(3) + torch.ones(3)
    c = (b * 2).sum().item()
    tracker.nat = real
    print("C", c)

    torch_tracker.uninstall()
    assert not torch_tracker.installed()
    d = torch.zeros(50)  # not tracked
    print("D", d.untyped_storage().data_ptr())
    msmemscope.stop()
    """
    # The dispatch mode's error path: its emits go through `tracker.nat`.
    env = clean_env(OMP_NUM_THREADS="1", MSMEMSCOPE_TORCH_CAPTURE="python")
    res = run_python(code, env=env, cwd=tmp_path)
    out = ok(res)
    assert "C 12.0" in out
    assert res.stderr.count("msmemscope: tracker error: RuntimeError: boom") == 1, res.stderr
    [dump] = sorted((tmp_path / "out").glob("msmemscope_*/device_cpu/dump/*.csv"))
    with dump.open(newline="") as f:
        rows = list(csv.DictReader(f))
    sizes = [attrs(r)["size"] for r in of(rows, "MALLOC")]
    assert 400 in sizes and 200 not in sizes


def test_threads_ending_as_the_interpreter_exits_do_not_abort(tmp_path: Path) -> None:
    """Dispatch-mode fallback: a thread that entered the mode and ends just before the
    interpreter finalizes. The mode used to stay on the thread's C++ mode stack, released by a
    thread-local destructor that needs the GIL: with the main thread already finalizing, the
    process aborted ("terminate called without an active exception") in about one run in five.
    """
    script = tmp_path / "threads_at_exit.py"
    script.write_text(
        "import threading, torch\n"
        "def work():\n"
        "    torch.ones(300, dtype=torch.float64).sum()\n"
        "threads = [threading.Thread(target=work) for _ in range(8)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
    )
    for attempt in range(4):
        out = tmp_path / f"out{attempt}"
        done = subprocess.run(
            [str(CLI), "--analysis=none", "-o", str(out), sys.executable, str(script)],
            env=clean_env(OMP_NUM_THREADS="1", MSMEMSCOPE_TORCH_CAPTURE="python"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (attempt, done.returncode, done.stderr)
        assert "Exception ignored" not in done.stderr, done.stderr
        with next(out.glob("*/device_cpu/dump/*.csv")).open() as f:
            rows = list(csv.DictReader(f))
        # Each thread's tensor: 2400 bytes.
        assert sum(1 for r in rows if r["Event"] == "MALLOC" and '"size":2400' in r["Attr"]) == 8
