"""Stream-race sanitizer: checker throughput and the cost of a sanitizer-op mark.

1. Checker throughput: one random program (launches of 1-3 tensors on 4 streams, event
   records/waits and synchronizations, as tests/python/test_sanitizer_differential.py makes
   them) fed to ``torch.cuda._sanitizer.EventHandler`` and to ``_native.RaceChecker`` (message
   parsing included). Median launches per second of interleaved rounds.
2. Per-mark cost in a process with the runtime library: ``msmemscope.mstx.mark`` with a plain
   message and with a sanitizer-op message (parse, C stack, checker, report bookkeeping). The
   difference is what the sanitizer adds to a mark.

Usage: ``.venv/bin/python bench/sanitizer_checker.py [--rounds 5] [--steps 20000]``
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"

STREAMS = [0, 1, 2, 3]
EVENTS = [100, 101, 102]
POINTERS = [0x10000 + i * 0x1000 for i in range(6)]


def program(seed: int, steps: int) -> list[tuple]:
    rng = random.Random(seed)
    ops: list[tuple] = []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.6:
            chosen = rng.sample(POINTERS, rng.randint(1, 3))
            writes = [p for p in chosen if rng.random() < 0.5]
            reads = [p for p in chosen if p not in writes or rng.random() < 0.3]
            ops.append(("launch", rng.choice(STREAMS), reads, writes))
        elif roll < 0.75:
            ops.append(("record", rng.choice(EVENTS), rng.choice(STREAMS)))
        elif roll < 0.9:
            ops.append(("wait", rng.choice(STREAMS), rng.choice(EVENTS)))
        else:
            ops.append(("device",))
    return ops


def run_csan(ops: list[tuple]) -> tuple[float, int]:
    from torch.cuda import _sanitizer as csan

    h = csan.EventHandler()
    races = 0
    t = time.perf_counter()
    for op in ops:
        if op[0] == "launch":
            _, stream, reads, writes = op
            rw = set(writes)
            ro = set(reads) - rw
            aliases = {p: ["a"] for p in ro | rw}
            races += len(h._handle_kernel_launch(stream, ro, rw, set(), "op", aliases))
        elif op[0] == "record":
            h._handle_event_record(op[1], op[2])
        elif op[0] == "wait":
            h._handle_event_wait(op[2], op[1])
        else:
            h._handle_device_synchronization()
    return time.perf_counter() - t, races


def run_ours(ops: list[tuple]) -> tuple[float, int]:
    from msmemscope import _native

    c = _native.RaceChecker()
    messages = []
    for op in ops:
        if op[0] == "launch":
            _, _stream, reads, writes = op
            r = ",".join(f"r{i}:{p}:256" for i, p in enumerate(reads))
            w = ",".join(f"w{i}:{p}:256" for i, p in enumerate(writes))
            messages.append(f"sanitizer-op: name=op;read={r};write={w}")
    races = 0
    it = iter(messages)
    t = time.perf_counter()
    for op in ops:
        if op[0] == "launch":
            races += len(c.launch(op[1], next(it)))
        elif op[0] == "record":
            c.event_record(op[1], op[2])
        elif op[0] == "wait":
            c.stream_wait_event(op[1], op[2])
        else:
            c.device_synchronize()
    return time.perf_counter() - t, races


MARK_COST = """
import time, msmemscope
from msmemscope import mstx
n = {n}
plain = "epoch step 12 begins here"
san = "sanitizer-op: name=ext.op;read=a:0x10000:4096,b:0x20000:4096;write=c:0x30000:4096"
out = {{}}
for label, msg in (("plain", plain), ("sanitizer", san)) * 2:
    t = time.perf_counter()
    for i in range(n):
        mstx.mark(msg, 1 + (i & 1))
    out[label] = (time.perf_counter() - t) / n * 1e6
print(out["plain"], out["sanitizer"])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--marks", type=int, default=50000)
    args = ap.parse_args()

    ops = program(1, args.steps)
    launches = sum(1 for op in ops if op[0] == "launch")
    csan_t, ours_t = [], []
    for _ in range(args.rounds):
        t, r_csan = run_csan(ops)
        csan_t.append(t)
        t, r_ours = run_ours(ops)
        ours_t.append(t)
    assert r_csan == r_ours, (r_csan, r_ours)
    c, o = statistics.median(csan_t), statistics.median(ours_t)
    print(f"program: {args.steps} steps, {launches} launches, {r_ours} races (both agree)")
    print(f"CSAN EventHandler : {launches / c:10.0f} launches/s")
    print(f"native RaceChecker: {launches / o:10.0f} launches/s  ({c / o:.1f}x)")

    plain, san = [], []
    scratch = tempfile.mkdtemp(prefix="sanitizer_bench_")
    for _ in range(args.rounds):
        # In a scratch directory: the report lands in ./memscopeDumpResults at exit.
        proc = subprocess.run(
            [str(PYTHON), "-c", textwrap.dedent(MARK_COST.format(n=args.marks))],
            capture_output=True,
            text=True,
            check=True,
            cwd=scratch,
            env={
                "PATH": "/usr/bin:/bin",
                "MSMEMSCOPE_NO_CONTROL": "1",
                "PYTHONPATH": str(REPO / "python"),
            },
        )
        a, b = (float(x) for x in proc.stdout.split())
        plain.append(a)
        san.append(b)
    shutil.rmtree(scratch, ignore_errors=True)
    p, s = statistics.median(plain), statistics.median(san)
    print(f"mstx.mark, plain message    : {p:6.2f} us/mark")
    print(f"mstx.mark, sanitizer-op mark: {s:6.2f} us/mark (+{s - p:.2f} us)")


if __name__ == "__main__":
    sys.exit(main())
