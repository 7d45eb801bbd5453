"""PyTorch tracking overhead on a CPU training loop (SPEC §10: lower than MemTracker).

One run measures, in interleaved rounds, the steps/s of the same CPU MLP + Adam training loop:

- ``none``: plain Python;
- ``msmemscope``: under the CLI with default options (``--events=alloc,free,launch``,
  ``--level=op``, leaks analysis), the PyTorch tracker turned on by the autostart hook;
- ``decompose``: the same under ``--analysis=decompose`` (owners on every block, module,
  gradient and optimizer hooks, the per-step owner table);
- ``memtracker``: in-process ``torch.distributed._tools.mem_tracker.MemTracker`` (a
  TorchDispatchMode with weakref storage tracking, as documented in its class docstring).

Usage: ``.venv/bin/python bench/torch_overhead.py [--rounds 3] [--steps 300] [--warmup 30]``
Each round runs each mode once as a fresh process; the table shows each mode's median steps/s
and the ratios. The exact commands are printed first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "target" / "release" / "msmemscope-cli"
PYTHON = REPO / ".venv" / "bin" / "python"


def worker(mode: str, steps: int, warmup: int) -> None:
    """The training loop; prints ``STEPS_PER_S <x>`` for the timed steps."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))

    tracker = None

    def one_step() -> None:
        if tracker is not None:
            # MemTracker refuses a second forward of a module without this.
            tracker.reset_mod_stats()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    if mode == "memtracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(model, opt, x, y)
        ctx = tracker
    else:
        import contextlib

        ctx = contextlib.nullcontext()
    with ctx:
        for _ in range(warmup):
            one_step()
        t0 = time.perf_counter()
        for _ in range(steps):
            one_step()
        dt = time.perf_counter() - t0
    print(f"STEPS_PER_S {steps / dt:.2f}", flush=True)


def command(mode: str, steps: int, warmup: int, out_dir: str) -> list[str]:
    me = [str(PYTHON), str(Path(__file__).resolve()), "--worker", mode]
    me += ["--steps", str(steps), "--warmup", str(warmup)]
    if mode == "msmemscope":
        return [str(CLI), "-o", out_dir, *me]
    if mode == "decompose":
        return [str(CLI), "--analysis=decompose", "-o", out_dir, *me]
    return me


def run(cmd: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.setdefault("OMP_NUM_THREADS", "1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    for line in res.stdout.splitlines():
        if line.startswith("STEPS_PER_S "):
            return float(line.split()[1])
    raise SystemExit(f"no STEPS_PER_S line from: {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("none", "msmemscope", "decompose", "memtracker"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--modes", default="none,msmemscope,decompose,memtracker")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.warmup)
        return
    if not CLI.is_file():
        raise SystemExit(f"{CLI} is missing: run scripts/setup.sh")
    modes = args.modes.split(",")
    out_dir = tempfile.mkdtemp(prefix="msmemscope_bench_torch_")
    try:
        print("commands (each run once per round, rounds interleaved):")
        for m in modes:
            cmd = " ".join(command(m, args.steps, args.warmup, out_dir))
            print(f"  {m:>10}: OMP_NUM_THREADS=1 {cmd}")
        results: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for m in modes:
                results[m].append(run(command(m, args.steps, args.warmup, out_dir)))
            print(f"round {r + 1}: " + ", ".join(f"{m} {results[m][-1]:.1f}" for m in modes))
        med = {m: statistics.median(v) for m, v in results.items()}
        print()
        print(f"{'mode':>12} {'steps/s (median)':>17} {'min':>8} {'max':>8} {'slowdown':>9}")
        base = med.get("none")
        for m in modes:
            slow = f"{base / med[m]:.2f}x" if base else "-"
            print(
                f"{m:>12} {med[m]:>17.1f} {min(results[m]):>8.1f} {max(results[m]):>8.1f} {slow:>9}"
            )
        if base and "msmemscope" in med and "memtracker" in med:
            ours = base / med["msmemscope"] - 1
            theirs = base / med["memtracker"] - 1
            print()
            print(
                f"added time per step: msmemscope {ours * 100:.0f}%,"
                f" MemTracker {theirs * 100:.0f}%; msmemscope steps/s / MemTracker steps/s = "
                f"{med['msmemscope'] / med['memtracker']:.2f}"
            )
            verdict = "PASS" if med["msmemscope"] > med["memtracker"] else "FAIL"
            print(f"{verdict}: msmemscope must cost less than MemTracker")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
