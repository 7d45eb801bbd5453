#!/usr/bin/env python3
"""Event writer throughput: how many dump rows per second the writer thread produces.

A C producer (tests/fixtures/emit_events.c, mode `burst`) emits N MALLOC rows through the
runtime's C ABI as fast as it can, under `msmemscope-cli --analysis=none`. The runtime logs,
when its writer stops, how many rows it wrote and how much CPU time the writer thread used
(CLOCK_THREAD_CPUTIME_ID: its share of the work, off the application thread). Prints, per
round and as medians: rows/s of writer CPU (target >= 1,000,000), the producer's emit cost
per row, and the wall time from launch to a complete dump.

With `--format parquet` the run is launched with `--format=parquet`: the writer thread writes
the same CSV journal (the rows/s above are its), and the launcher turns it into
`memscope_dump_{ts}.parquet` once the program has ended; its log says how long that took
(`converted ... rows in S s`), printed here as the conversion's rows/s, and the wall time then
runs to the complete Parquet file.

    python3 bench/writer_throughput.py [--rows 1000000] [--rounds 5] [--format csv|parquet]
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


def logs(out, name):
    return "".join(
        open(p).read() for p in glob.glob(os.path.join(out, "*", "msmemscope_logs", name))
    )


def one_round(prog, rows, out, fmt):
    start = time.perf_counter()
    done = subprocess.run(
        [CLI, "--analysis=none", f"--format={fmt}", "-o", out, prog, "burst", str(rows)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    emitted = float(re.search(r"emitted \d+ in ([0-9.]+) s", done.stdout).group(1))
    m = re.search(
        r"writer: (\d+) rows written in ([0-9.]+) s of writer CPU", logs(out, "runtime_*.log")
    )
    written, cpu = int(m.group(1)), float(m.group(2))
    convert = None
    if fmt == "parquet":
        m = re.search(r"to Parquet: (\d+) rows in ([0-9.]+) s", logs(out, "launcher.log"))
        lines, seconds = int(m.group(1)), float(m.group(2))
        assert glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.parquet"))
        assert not glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.csv"))
        convert = lines / seconds
    else:
        dump = glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.csv"))[0]
        with open(dump) as f:
            lines = sum(1 for _ in f) - 1
    assert lines == written == rows + 2, (lines, written, rows)
    return written / cpu, emitted / rows * 1e9, wall, convert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prog = build(tmp)
        results = []
        for r in range(args.rounds):
            out = os.path.join(tmp, f"out{r}")
            rate, emit_ns, wall, convert = one_round(prog, args.rows, out, args.format)
            results.append((rate, emit_ns, wall, convert))
            extra = "" if convert is None else f"; conversion to Parquet {convert:,.0f} rows/s"
            print(
                f"round {r + 1}: writer {rate:,.0f} rows/s of its CPU; emit {emit_ns:.0f} ns/row; "
                f"launch to complete dump {wall:.2f} s{extra}"
            )
    rate = statistics.median(x[0] for x in results)
    print(f"machine: nproc={os.cpu_count()}; rows per round: {args.rows:,}")
    options = f"--analysis=none --format={args.format}"
    print(f"command: {CLI} {options} -o OUT emit_events burst {args.rows}")
    if args.format == "parquet":
        print(
            "median conversion of the journal to Parquet (in the launcher, after the program): "
            f"{statistics.median(x[3] for x in results):,.0f} rows/s; median launch to complete "
            f"Parquet file: {statistics.median(x[2] for x in results):.2f} s"
        )
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
