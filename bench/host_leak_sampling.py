#!/usr/bin/env python3
"""Host leaks sampled by bytes (``--sample-bytes``) against plain, exact host leaks and memray.

Two measurements, each in interleaved rounds (the order rotates each round), medians reported:

1. Jobs, side by side in one table: ``import torch`` and a 200-step CPU training loop
   (bench/workloads/train_200_steps.py), each run

     * plain:            python JOB
     * exact:            msmemscope-cli --analysis=host-leaks -q -o DIR python JOB
     * sampled:          the same with --sample-bytes=524288 (--interval)
     * memray --native:  memray run --native -q -o FILE JOB

   Ratio = mode / plain. The verdict line says whether the sampled mode stays within 1.3x plain.

2. The hooks alone, per allocation: bench/workloads/alloc_loop.c does N malloc(64)/free pairs
   from one stack (compiled here with gcc -O2), timed with N = --pairs and N = 0 (the fixed
   start and exit cost) under plain, exact and sampled. Reported: added ns per pair over plain,
   with the fixed cost removed: for the sampled mode this is the countdown's subtract and branch
   on the allocation and the filter's one load on the free.

What it needs it installs itself: memray (``pip install memray==1.20.0`` into the benchmarked
interpreter's environment when ``import memray`` fails; --no-memray skips it). torch must be
importable by --python (scripts/setup.sh puts it in .venv). Results: bench/out/
host_leak_sampling_STAMP.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
MEMRAY_VERSION = "1.20.0"
JOBS = {
    "import torch": ["-c", "import torch"],
    "train 200 steps": [str(BENCH_DIR / "workloads" / "train_200_steps.py")],
}
LIMIT = 1.3


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--interval", type=int, default=524288, help="--sample-bytes (default 512 KiB)")
    p.add_argument("--pairs", type=int, default=20_000_000, help="malloc/free pairs (default 20M)")
    p.add_argument("--python", type=Path, default=REPO / ".venv" / "bin" / "python")
    p.add_argument("--cli", type=Path, default=REPO / "target" / "release" / "msmemscope-cli")
    p.add_argument("--no-memray", action="store_true", help="leave memray out")
    p.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out")
    a = p.parse_args()
    if a.rounds < 1 or a.pairs < 1 or a.interval < 1:
        p.error("rounds, pairs and interval must be >= 1")
    return a


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSMEMSCOPE_")}
    env.pop("LD_PRELOAD", None)
    return env


def memray_command(python: Path) -> list[str] | None:
    """`python -m memray`, installed into `python`'s environment first when missing."""
    probe = [str(python), "-c", "import memray"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        print(f"installing memray=={MEMRAY_VERSION} for {python}", file=sys.stderr)
        pip = [str(python), "-m", "pip", "install", "-q", f"memray=={MEMRAY_VERSION}"]
        if subprocess.run(pip).returncode != 0:
            return None
    return [str(python), "-m", "memray"]


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall


def rounds(cases: list[tuple[str, list[str]]], n: int, tmp: Path) -> dict[str, float]:
    """Medians of `n` interleaved rounds after one warm-up round; `{DIR}` in a command is a
    fresh output directory, removed after the run."""
    runs: dict[str, list[float]] = {name: [] for name, _ in cases}
    env = clean_env()
    for r in range(n + 1):
        k = r % len(cases)
        for name, cmd in cases[k:] + cases[:k]:
            out = tmp / "out"
            wall = timed([c.replace("{DIR}", str(out)) for c in cmd], tmp, env)
            if out.is_dir():
                shutil.rmtree(out, ignore_errors=True)
            else:
                out.unlink(missing_ok=True)
            if r > 0:
                runs[name].append(wall)
        print(f"round {r}/{n} done", file=sys.stderr, flush=True)
    return {name: statistics.median(v) for name, v in runs.items()}


def git_head() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True)
    return proc.stdout.decode().strip() or "unknown"


def main() -> int:
    a = parse_args()
    cli = str(a.cli.resolve())
    if not Path(cli).is_file():
        sys.exit(f"{cli} is missing: build with `cargo build --release` first")
    memray = None if a.no_memray else memray_command(a.python)
    tool = [cli, "--analysis=host-leaks", "-q", "-o", "{DIR}"]
    modes = {
        "plain": [],
        "exact": tool,
        "sampled": [*tool[:2], f"--sample-bytes={a.interval}", *tool[2:]],
    }
    if memray:
        modes["memray --native"] = [*memray, "run", "--native", "-q", "-o", "{DIR}"]
    with tempfile.TemporaryDirectory(prefix="msmemscope-sampling-") as t:
        tmp = Path(t)
        job_cases = []
        for job, args in JOBS.items():
            for mode, prefix in modes.items():
                body = [str(a.python), *args] if not mode.startswith("memray") else args
                job_cases.append((f"{mode}|{job}", [*prefix, *body]))
        jobs = rounds(job_cases, a.rounds, tmp)

        loop = tmp / "alloc_loop"
        gcc = ["gcc", "-O2", str(BENCH_DIR / "workloads" / "alloc_loop.c"), "-o", str(loop)]
        subprocess.run(gcc, check=True)
        hook_cases = []
        for mode in ("plain", "exact", "sampled"):
            for n in (a.pairs, 0):
                hook_cases.append((f"{mode}|{n}", [*modes[mode], str(loop), str(n)]))
        hooks = rounds(hook_cases, a.rounds, tmp)

    def marginal(mode: str) -> float:
        return hooks[f"{mode}|{a.pairs}"] - hooks[f"{mode}|0"]

    ns = {m: (marginal(m) - marginal("plain")) / a.pairs * 1e9 for m in ("exact", "sampled")}
    names = list(modes)
    table = ["| job | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    worst = 0.0
    for job in JOBS:
        plain = jobs[f"plain|{job}"]
        cells = []
        for m in names:
            wall = jobs[f"{m}|{job}"]
            cells.append(f"{wall:.2f} s" + ("" if m == "plain" else f" ({wall / plain:.2f}x)"))
        worst = max(worst, jobs[f"sampled|{job}"] / plain)
        table.append(f"| {job} | " + " | ".join(cells) + " |")
    header = [
        f"machine: nproc={os.cpu_count()}, {platform.system()} {platform.release()}",
        f"python: {a.python}; msmemscope: {cli} (git {git_head()})",
        f"sampled = --sample-bytes={a.interval}; rounds={a.rounds} interleaved, medians",
    ]
    hook_lines = [
        (
            f"hooks alone, per malloc(64)/free pair over plain ({a.pairs} pairs, fixed cost"
            f" removed): exact {ns['exact']:.1f} ns, sampled {ns['sampled']:.1f} ns"
        ),
        f"plain loop: {marginal('plain') / a.pairs * 1e9:.1f} ns per pair",
    ]
    verdict = (
        f"sampled within {LIMIT}x plain on every job: "
        f"{'YES' if worst <= LIMIT else 'NO'} (worst {worst:.2f}x)"
    )
    text = "\n".join([*header, "", *table, "", *hook_lines, verdict])
    print(text)
    stamp = _dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out = a.out_dir / f"host_leak_sampling_{stamp}.json"
    doc = {"header": header, "jobs": jobs, "hooks": hooks, "ns_per_pair": ns, "worst": worst}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"# host_leak_sampling {stamp}\n\n{text}\n")
    print(f"results saved to {out} and {out.with_suffix('.md').name}")
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
