#!/usr/bin/env python3
"""Event writer throughput: how many dump rows per second the writer thread produces.

A C producer (tests/fixtures/emit_events.c, mode `burst`) emits N MALLOC rows through the
runtime's C ABI as fast as it can, under `msmemscope-cli --analysis=none`. The runtime logs,
when its writer stops, how many rows it wrote and how much CPU time the writer thread used
(CLOCK_THREAD_CPUTIME_ID: its share of the work, off the application thread). Prints, per
round and as medians: rows/s of writer CPU (target >= 1,000,000) and the same as ns/row of
one core, the producer's emit cost per row, and the wall time from launch to a complete dump.

With `--format parquet` the run is launched with `--format=parquet`: the writer thread encodes
the rows into Parquet segments itself (the rows/s above are its), and the wall time runs to
the complete Parquet files. A build from before that (a `--baseline`) wrote a CSV journal that
the launcher converted once the program had ended; its log says how long that took
(`converted ... rows in S s`), printed as the conversion's rows/s, and its wall time includes it.

With `--workload torch` the rows are a real training run's instead: the 12-layer transformer LM
of `long_run.py` trains `--steps` steps under the CLI with its default options (the analyses on,
the dump budget), and the writer's CPU per row is read from the same log line. Those rows carry
the block attributes, op names and steps a user's dump holds, which the burst's do not.

With `--baseline DIR` (a directory holding another build's `msmemscope-cli` and
`libmsmemscope_runtime.so`, e.g. an older commit's `target/release`) every round also runs that
build, right after this one, and the medians of both and their ratio are printed: only figures
measured side by side compare on a shared machine.

    python3 bench/writer_throughput.py [--rows 1000000] [--rounds 5] [--format csv|parquet]
                                       [--workload burst|torch] [--steps 100]
                                       [--baseline DIR]
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


def build(tmp, release, name):
    """The producer, linked to the runtime library in `release` (whose CLI preloads that same
    file: a producer linked to another copy would load two runtimes)."""
    prog = os.path.join(tmp, name)
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-I",
            os.path.join(ROOT, "crates/runtime/include"),
            os.path.join(ROOT, "tests/fixtures/emit_events.c"),
            "-o",
            prog,
            f"-L{release}",
            "-lmsmemscope_runtime",
            f"-Wl,-rpath,{release}",
        ],
        check=True,
    )
    return prog


def logs(out, name):
    return "".join(
        open(p).read() for p in glob.glob(os.path.join(out, "*", "msmemscope_logs", name))
    )


def writer_figures(out):
    """Rows written and seconds of writer CPU, from the runtime's log line at the writer's end,
    summed over every process of the run (a child interpreter may write none)."""
    found = re.findall(
        r"writer: (\d+) rows written in ([0-9.]+) s of writer CPU", logs(out, "runtime_*.log")
    )
    return sum(int(n) for n, _ in found), sum(float(s) for _, s in found)


def parquet_rows(out, written):
    """Rows in the run's Parquet files (its head and later segments), read with pyarrow where
    it is installed; else the writer's own count."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return written
    files = glob.glob(
        os.path.join(out, "*", "device_cpu", "dump", "**", "*.parquet"), recursive=True
    )
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def one_round(cli, prog, rows, out, fmt):
    start = time.perf_counter()
    done = subprocess.run(
        [cli, "--analysis=none", f"--format={fmt}", "-o", out, prog, "burst", str(rows)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    emitted = float(re.search(r"emitted \d+ in ([0-9.]+) s", done.stdout).group(1))
    written, cpu = writer_figures(out)
    convert = None
    if fmt == "parquet":
        assert glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.parquet"))
        assert not glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.csv"))
        m = re.search(r"to Parquet: (\d+) rows in ([0-9.]+) s", logs(out, "launcher.log"))
        if m:
            lines, seconds = int(m.group(1)), float(m.group(2))
            convert = lines / seconds
        else:
            lines = parquet_rows(out, written)
    else:
        dump = glob.glob(os.path.join(out, "*", "device_cpu", "dump", "*.csv"))[0]
        with open(dump) as f:
            lines = sum(1 for _ in f) - 1
    assert lines == written == rows + 2, (lines, written, rows)
    return written / cpu, emitted / rows * 1e9, wall, convert


def torch_round(release, worker, steps, out, fmt):
    """A real training run under one build: the writer's rows/s of its CPU and the wall time."""
    # A baseline build outside the source tree finds the Python package by this variable.
    env = dict(
        os.environ,
        MSMEMSCOPE_RUNTIME_LIB=os.path.join(release, "libmsmemscope_runtime.so"),
        MSMEMSCOPE_PYTHON_DIR=os.path.join(ROOT, "python"),
    )
    cli = os.path.join(release, "msmemscope-cli")
    python = os.path.join(ROOT, ".venv", "bin", "python")
    start = time.perf_counter()
    cmd = [cli, f"--format={fmt}", "-o", out, python, worker, str(steps), str(steps)]
    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    wall = time.perf_counter() - start
    written, cpu = writer_figures(out)
    if not written or not cpu:
        sys.exit(f"{cli}: no rows written (logs in {out})")
    return written / cpu, written, wall


def torch_main(args, builds):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from long_run import WORKER

    results = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory() as tmp:
        worker = os.path.join(tmp, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        for r in range(args.rounds):
            for name, release in builds:
                out = os.path.join(tmp, f"out{r}_{name[0]}")
                rate, written, wall = torch_round(release, worker, args.steps, out, args.format)
                results[name].append((rate, written, wall))
                print(
                    f"round {r + 1}, {name}: writer {1e9 / rate:.0f} ns/row of its CPU over "
                    f"{written:,} rows; launch to exit {wall:.1f} s",
                    flush=True,
                )
    print(
        f"machine: nproc={os.cpu_count()}; workload: long_run.py's 12-layer LM, "
        f"{args.steps} steps, default options, --format={args.format}"
    )
    for name, release in builds:
        rows = results[name]
        rate = statistics.median(x[0] for x in rows)
        print(
            f"{name} ({release}): median writer {1e9 / rate:.0f} ns/row of one core, "
            f"median launch to exit {statistics.median(x[2] for x in rows):.1f} s"
        )
    if args.baseline:
        this = statistics.median(x[0] for x in results["this build"])
        base = statistics.median(x[0] for x in results["baseline"])
        print(f"writer CPU per row, this build / baseline: {base / this:.2f}x")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv")
    ap.add_argument("--workload", choices=("burst", "torch"), default="burst")
    ap.add_argument("--steps", type=int, default=100, help="training steps (--workload torch)")
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="another build's directory (msmemscope-cli and libmsmemscope_runtime.so), run "
        "in every round after this one",
    )
    args = ap.parse_args()
    builds = [("this build", RELEASE)]
    if args.baseline:
        base = os.path.abspath(args.baseline)
        for part in ("msmemscope-cli", "libmsmemscope_runtime.so"):
            if not os.path.isfile(os.path.join(base, part)):
                ap.error(f"--baseline {base}: no {part} there")
        builds.append(("baseline", base))
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    if args.workload == "torch":
        return torch_main(args, builds)
    results = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory() as tmp:
        progs = {
            name: build(tmp, release, f"emit_events_{i}")
            for i, (name, release) in enumerate(builds)
        }
        for r in range(args.rounds):
            for name, release in builds:
                out = os.path.join(tmp, f"out{r}_{len(results[name])}_{name[0]}")
                cli = os.path.join(release, "msmemscope-cli")
                rate, emit_ns, wall, convert = one_round(
                    cli, progs[name], args.rows, out, args.format
                )
                results[name].append((rate, emit_ns, wall, convert))
                extra = "" if convert is None else f"; conversion to Parquet {convert:,.0f} rows/s"
                print(
                    f"round {r + 1}, {name}: writer {rate:,.0f} rows/s of its CPU "
                    f"({1e9 / rate:.0f} ns/row); "
                    f"emit {emit_ns:.0f} ns/row; launch to complete dump {wall:.2f} s{extra}"
                )
    print(f"machine: nproc={os.cpu_count()}; rows per round: {args.rows:,}")
    options = f"--analysis=none --format={args.format}"
    for name, release in builds:
        rows = results[name]
        rate = statistics.median(x[0] for x in rows)
        print(
            f"{name}: {os.path.join(release, 'msmemscope-cli')} {options} "
            f"-o OUT emit_events burst {args.rows}"
        )
        if args.format == "parquet":
            converted = [x[3] for x in rows if x[3] is not None]
            if converted:
                print(
                    "  median conversion of the journal to Parquet (in the launcher, after the "
                    f"program): {statistics.median(converted):,.0f} rows/s"
                )
        print(f"  median launch to complete dump: {statistics.median(x[2] for x in rows):.2f} s")
        print(
            f"  median writer throughput: {rate:,.0f} rows/s = {1e9 / rate:.0f} ns/row of one "
            "core (target 1,000,000 rows/s): "
            f"{'PASS' if rate >= 1_000_000 else 'BELOW TARGET'}"
        )
        print(
            "  median emit cost on the application thread: "
            f"{statistics.median(x[1] for x in rows):.0f} ns/row"
        )
    if args.baseline:
        ratio = statistics.median(x[0] for x in results["this build"]) / statistics.median(
            x[0] for x in results["baseline"]
        )
        print(f"writer throughput, this build / baseline: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
