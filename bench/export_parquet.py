#!/usr/bin/env python3
"""`msmemscope export --format parquet` throughput: rows per second from a CSV dump to Parquet.

For each size (default 5,000,000 and 10,000,000 rows) bench/gen_dump.c writes a synthetic CPU
training dump (ops, MALLOC/FREE with allocation_id/addr/size/used/owner, ACCESS rows, steps and
marks) into a run directory's layout, and the export runs on it (fresh output each round).
Prints per round and as medians: wall time, CPU time (user+sys of the export process), rows/s
of wall time, peak RSS, and the CSV and Parquet sizes; with pyarrow installed, the Parquet row
count is checked against the CSV's.

    python3 bench/export_parquet.py [--rows 5000000,10000000] [--rounds 3] [--keep DIR]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "target", "release", "msmemscope-cli")


def build(tmp):
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "msmemscope-cli"], cwd=ROOT, check=True
    )
    gen = os.path.join(tmp, "gen_dump")
    subprocess.run(["gcc", "-O2", os.path.join(ROOT, "bench", "gen_dump.c"), "-o", gen], check=True)
    # A copy: a concurrent cargo build cannot change the binary mid-run.
    cli = os.path.join(tmp, "msmemscope-cli")
    shutil.copy2(CLI, cli)
    return gen, cli


def make_run(gen, tmp, rows):
    run = os.path.join(tmp, f"msmemscope_1_{rows}", "device_cpu", "dump")
    os.makedirs(run, exist_ok=True)
    csv = os.path.join(run, "memscope_dump_20260101000000.csv")
    subprocess.run([gen, str(rows), "0", csv], check=True, stdout=subprocess.DEVNULL)
    with open(csv, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    return os.path.dirname(os.path.dirname(run)), csv, lines - 1


def one_round(cli, run, csv):
    parquet = csv[: -len(".csv")] + ".parquet"
    if os.path.exists(parquet):
        os.remove(parquet)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(
            [cli, "export", "--format", "parquet", run], stdout=out, stderr=err
        )
        # The export's own CPU time and peak RSS (not those of earlier children such as cargo).
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        printed, said = out.read(), err.read()
    if child.returncode != 0 or printed.strip() != parquet:
        sys.exit(f"export failed ({child.returncode}): {printed}{said}")
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss, os.path.getsize(parquet), parquet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="5000000,10000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", help="make the dumps here (and keep them) instead of a temp dir")
    args = ap.parse_args()
    sizes = [int(n) for n in args.rows.split(",")]
    tmp = args.keep or tempfile.mkdtemp(prefix="msmemscope-export-bench-")
    try:
        gen, cli = build(tmp)
        print(f"machine: nproc={os.cpu_count()}; load average {os.getloadavg()[0]:.2f}")
        for rows in sizes:
            run, csv, lines = make_run(gen, tmp, rows)
            results = []
            for r in range(args.rounds):
                wall, cpu, rss, size, parquet = one_round(cli, run, csv)
                results.append((wall, cpu))
                print(
                    f"{lines:,} rows, round {r + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                    f"{lines / wall:,.0f} rows/s; peak RSS {rss / 1024:.0f} MiB; "
                    f"CSV {os.path.getsize(csv) / 2**20:.0f} MiB -> Parquet {size / 2**20:.0f} MiB"
                )
            try:
                import pyarrow.parquet as pq

                counted = pq.ParquetFile(parquet).metadata.num_rows
                assert counted == lines, (counted, lines)
            except ImportError:
                pass
            wall = statistics.median(x[0] for x in results)
            cpu = statistics.median(x[1] for x in results)
            print(
                f"{lines:,} rows: median {wall:.2f} s wall ({lines / wall:,.0f} rows/s), "
                f"{cpu:.2f} s CPU ({lines / cpu:,.0f} rows per CPU second)"
            )
            print(f"command: {CLI} export --format parquet {run}")
            if not args.keep:
                shutil.rmtree(run)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
