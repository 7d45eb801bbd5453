#!/usr/bin/env python3
"""`msmemscope ranks` on many generated rank dumps: native vs DuckDB vs Spark, in one run.

bench/gen_dump.c writes one synthetic CPU training dump per rank (ROWS rows each, default
200,000; --ranks 64), each in its own run directory `msmemscope_N_…/` with a config.json
naming its rank; one rank (the last) is the generator's "modified copy" (extra ops, doubled
allocations). The script exports the dumps to Parquet (`msmemscope export --format parquet`,
timed: the SQL engines read Parquet), then times `msmemscope ranks --output-format json` with
each engine (wall clock, each in its own process, best of --repeat), checks that the three
tables are identical, and prints rows/s. Writes bench/out/ranks_scale_<ts>.json.

    python3 bench/ranks_scale.py                        # 64 ranks x 200k rows
    python3 bench/ranks_scale.py --ranks 8 --rows 50000 --engines native,duckdb

Needs gcc, a release build (`cargo build --release`), and for the SQL engines a Python with
duckdb and pyspark (the project's .venv has them; Spark needs Java).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CLI = REPO / "target" / "release" / "msmemscope-cli"
VENV_PY = REPO / ".venv" / "bin" / "python"


def generate(tmp: Path, ranks: int, rows: int) -> tuple[Path, int]:
    gen = tmp / "gen_dump"
    subprocess.run(["gcc", "-O2", "-o", str(gen), str(BENCH / "gen_dump.c")], check=True)
    root = tmp / "job"
    total = 0
    for rank in range(ranks):
        run = root / f"msmemscope_{1000 + rank}_20261201000000"
        dump = run / "device_cpu" / "dump"
        dump.mkdir(parents=True)
        config = {"distributed": {"rank": rank, "local_rank": rank % 8, "world_size": ranks}}
        (run / "config.json").write_text(json.dumps(config))
        variant = "1" if rank == ranks - 1 else "0"
        out = subprocess.run(
            [str(gen), str(rows), variant, str(dump / "memscope_dump_20261201000000.csv")],
            check=True,
            capture_output=True,
            text=True,
        )
        total += int(out.stdout.split()[0])
    return root, total


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return elapsed, done.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--rows", type=int, default=200_000, help="rows per rank's dump")
    p.add_argument("--engines", default="native,duckdb,spark")
    p.add_argument("--repeat", type=int, default=2, help="runs per engine (best is kept)")
    p.add_argument("--python", default=str(VENV_PY), help="Python with duckdb and pyspark")
    p.add_argument("--keep", action="store_true", help="keep the generated job")
    args = p.parse_args()
    if not CLI.is_file():
        sys.exit(f"{CLI} is missing: cargo build --release first")
    env = dict(os.environ, MSMEMSCOPE_PYTHON=args.python)
    tmp = Path(tempfile.mkdtemp(prefix="ranks_scale_"))
    try:
        root, total = generate(tmp, args.ranks, args.rows)
        print(f"{args.ranks} ranks x {args.rows} rows: {total} rows in {root}")
        export_s, _ = timed([str(CLI), "export", "--format", "parquet", str(root)], env)
        print(
            f"  export --format parquet  {export_s:8.2f} s  {total / export_s / 1e6:6.2f} M rows/s"
        )
        results: dict[str, dict[str, float]] = {}
        tables = {}
        for engine in args.engines.split(","):
            best = None
            for _ in range(args.repeat):
                cmd = [str(CLI), "ranks", str(root), "--engine", engine, "--output-format", "json"]
                elapsed, out = timed(cmd, env)
                tables[engine] = json.loads(out)
                best = elapsed if best is None else min(best, elapsed)
            assert best is not None
            results[engine] = {"seconds": best, "rows_per_s": total / best}
            print(f"  ranks --engine {engine:7s} {best:8.2f} s  {total / best / 1e6:6.2f} M rows/s")
        first = next(iter(tables.values()))
        same = all(t == first for t in tables.values())
        standing = [r["rank"] for r in first["rows"] if r["stands_out"]]
        print(f"  tables identical across engines: {same}; ranks standing out: {standing}")
        out_dir = BENCH / "out"
        out_dir.mkdir(exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d_%H%M%S")
        record = {
            "ranks": args.ranks,
            "rows_per_rank": args.rows,
            "rows": total,
            "nproc": os.cpu_count(),
            "export_seconds": export_s,
            "engines": results,
            "identical": same,
        }
        path = out_dir / f"ranks_scale_{stamp}.json"
        path.write_text(json.dumps(record, indent=2))
        print(f"results saved to {path}")
        return 0 if same else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
