#!/usr/bin/env python3
"""Event writer throughput: how many dump rows per second the writer thread produces.

A C producer (tests/fixtures/emit_events.c, mode `burst`) emits N MALLOC rows through the
runtime's C ABI as fast as it can, under `msmemscope-cli --analysis=none`. The runtime logs,
when its writer stops, how many rows it wrote and how much CPU time the writer thread used
(CLOCK_THREAD_CPUTIME_ID: its share of the work, off the application thread). Prints, per
round and as medians: rows/s of writer CPU (target >= 1,000,000), the producer's emit cost
per row, and the wall time from launch to a complete dump.

    python3 bench/writer_throughput.py [--rows 1000000] [--rounds 5]
"""

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "target", "release")
CLI = os.path.join(RELEASE, "msmemscope-cli")


def build(tmp):
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    prog = os.path.join(tmp, "emit_events")
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-I",
            os.path.join(ROOT, "crates/runtime/include"),
            os.path.join(ROOT, "tests/fixtures/emit_events.c"),
            "-o",
            prog,
            f"-L{RELEASE}",
            "-lmsmemscope_runtime",
            f"-Wl,-rpath,{RELEASE}",
        ],
        check=True,
    )
    return prog


def one_round(prog, rows, out):
    start = time.perf_counter()
    done = subprocess.run(
        [CLI, "--analysis=none", "-o", out, prog, "burst", str(rows)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    emitted = float(re.search(r"emitted \d+ in ([0-9.]+) s", done.stdout).group(1))
    log = "".join(
        open(p).read()
        for p in glob.glob(os.path.join(out, "*", "msmemscope_logs", "runtime_*.log"))
    )
    m = re.search(r"writer: (\d+) rows written in ([0-9.]+) s of writer CPU", log)
    written, cpu = int(m.group(1)), float(m.group(2))
    dump = glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.csv"))[0]
    with open(dump) as f:
        lines = sum(1 for _ in f) - 1
    assert lines == written == rows + 2, (lines, written, rows)
    return written / cpu, emitted / rows * 1e9, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prog = build(tmp)
        results = []
        for r in range(args.rounds):
            rate, emit_ns, wall = one_round(prog, args.rows, os.path.join(tmp, f"out{r}"))
            results.append((rate, emit_ns, wall))
            print(
                f"round {r + 1}: writer {rate:,.0f} rows/s of its CPU; emit {emit_ns:.0f} ns/row; "
                f"launch to complete dump {wall:.2f} s"
            )
    rate = statistics.median(x[0] for x in results)
    print(f"machine: nproc={os.cpu_count()}; rows per round: {args.rows:,}")
    print(f"command: {CLI} --analysis=none -o OUT emit_events burst {args.rows}")
    print(
        f"median writer throughput: {rate:,.0f} rows/s (target 1,000,000): "
        f"{'PASS' if rate >= 1_000_000 else 'BELOW TARGET'}"
    )
    print(
        f"median emit cost on the application thread: {statistics.median(x[1] for x in results):.0f} ns/row"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
