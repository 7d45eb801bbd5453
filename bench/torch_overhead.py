"""PyTorch tracking overhead on real CPU training steps, against torch.profiler and MemTracker.

One run measures, in interleaved rounds, the steps/s of real CPU training steps
(``torch.set_num_threads(1)``, ``torch.manual_seed(0)``) on three workloads:

- ``mlp``: MLP 256-512-256-10 (Linear/ReLU), batch 64, cross-entropy, Adam;
- ``gpt2``: transformers ``GPT2LMHeadModel`` (2 layers, n_embd 128, 2 heads, vocab 1000,
  128 positions, random init, no download), batch 4 x 64 token ids, LM loss, AdamW;
- ``gpt2-6l``: the same model at a size where ops are not tiny: 6 layers, n_embd 512, 8 heads,
  vocab 8000, 256 positions, batch 8 x 128 token ids;
- ``cnn``: Conv2d 3->16 k3, ReLU, MaxPool2d(2), Conv2d 16->32 k3, ReLU, AdaptiveAvgPool2d(1),
  Linear 32->10 on a batch of 32 x 3 x 32 x 32, cross-entropy, SGD with momentum;

under six modes:

- ``none``: plain Python;
- ``native``: under the CLI with default options (``--events=alloc,free,launch``,
  ``--level=op``, leaks analysis) and ``MSMEMSCOPE_TORCH_CAPTURE=native``: the autostart hook
  turns on the native capture (the C++ library on PyTorch's allocator and RecordFunction);
- ``native-alloc``: the same with ``--events=alloc,free`` (no op rows);
- ``fallback``: under the CLI with default options and ``MSMEMSCOPE_TORCH_CAPTURE=python``
  (the TorchDispatchMode capture);
- ``profiler``: in-process ``torch.profiler.profile(activities=[CPU], profile_memory=True)``
  around the warmup and timed steps (its post-processing at exit is not timed);
- ``memtracker``: in-process ``torch.distributed._tools.mem_tracker.MemTracker`` (a
  TorchDispatchMode with weakref storage tracking), ``reset_mod_stats()`` before each step;
- ``baseline``, ``baseline-alloc`` (only with ``--baseline DIR``): ``native``,
  ``native-alloc`` under another checkout's CLI (``DIR/target/release/msmemscope-cli``, built
  there, with its own Python package), so an earlier commit is measured side by side with this
  one in the same run.

Usage: ``.venv/bin/python bench/torch_overhead.py [--rounds 3] [--steps N] [--warmup 5]
[--workloads mlp,gpt2,cnn,gpt2-6l] [--modes none,native,native-alloc,fallback,profiler,memtracker]
[--baseline DIR] [--paired ROUNDS]``

Timed steps default to mlp 200, gpt2 20, cnn 50, gpt2-6l 4 (``--steps`` sets them all). Each
round runs every workload under every mode once as a fresh process (the mode order rotates by
round); each CLI run gets a fresh ``-o`` directory that is deleted after its dump rows are
counted. Per workload the script prints a markdown table: median steps/s, time per step against
``none``, and for the CLI modes the dump rows per timed step and the added nanoseconds per
recorded row, (time/step(mode) - time/step(none)) / (rows/step). The rows per step are the dump
rows whose timestamp lies inside the timed window (the worker prints it with ``time.time_ns()``,
the clock of the dump's ``Timestamp(ns)``); the whole dump's rows / (warmup + timed steps),
which also counts import, setup and exit rows, is shown next to it. The exact commands are
printed first, and the issue's targets (native <= 1.10x on mlp, gpt2 and gpt2-6l, below
torch.profiler there, below MemTracker) last.

With ``--paired ROUNDS`` each CLI mode also runs once per workload in a process of its own
that times, in each round, three blocks of steps: the capture recording, installed but not
recording (``msmemscope.stop()``), and removed (the native library's op callback taken off
PyTorch and its allocator wrapper passing blocks through; the preloaded runtime stays), in an
order that changes every round, with two untimed steps after each switch. It prints the median
and quartiles of the per-round ratios recording / idle (what recording rows costs), idle /
removed (what the installed capture costs while it records nothing: PyTorch's RecordFunction
path for every op, our op callback, the wrapper) and recording / removed. The blocks of a round
run in the same process within a second, so what drifts between processes (a neighbour's load,
where the heap and the interpreter's objects landed, when the garbage collector runs) cancels
out.

With ``--instructions`` each mode that runs no in-process profiler also runs under callgrind
(valgrind), twice, with few and with more timed steps (``INSTRUCTION_STEPS``); the difference
of the two runs' instruction counts, per step, is what a step costs in instructions, apart from
the import and setup both runs share. It prints, per mode, the program's main thread and the
other threads (the runtime's writer), and the main thread's added instructions against
``none``. Instruction counts do not drift with the machine's load the way times do: a change of
a few percent in a mode's cost shows in one run. They count no cache misses and no waits, so
they are read next to the times, not instead of them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "target" / "release" / "msmemscope-cli"
PYTHON = REPO / ".venv" / "bin" / "python"

WORKLOADS = ("mlp", "gpt2", "cnn", "gpt2-6l")
DEFAULT_STEPS = {"mlp": 200, "gpt2": 20, "cnn": 50, "gpt2-6l": 4}
# --instructions: (fewer, more) timed steps of the two callgrind runs.
INSTRUCTION_STEPS = {"mlp": (20, 120), "gpt2": (2, 12), "cnn": (5, 30), "gpt2-6l": (1, 3)}
# Steps per block of --paired.
BLOCK_STEPS = {"mlp": 30, "gpt2": 4, "cnn": 10, "gpt2-6l": 1}
DESCRIPTIONS = {
    "mlp": "MLP 256-512-256-10, batch 64, Adam",
    "gpt2": "GPT2LMHeadModel 2 layers, n_embd 128, vocab 1000, batch 4x64 tokens, AdamW",
    "cnn": "CNN 2 conv + pool + linear, batch 32x3x32x32, SGD momentum",
    "gpt2-6l": "GPT2LMHeadModel 6 layers, n_embd 512, 8 heads, vocab 8000, batch 8x128, AdamW",
}
MODES = (
    "none",
    "native",
    "native-alloc",
    "fallback",
    "profiler",
    "memtracker",
    "baseline",
    "baseline-alloc",
)
DEFAULT_MODES = MODES[:-1]
# CLI modes: extra CLI options, MSMEMSCOPE_TORCH_CAPTURE.
CLI_MODES: dict[str, tuple[list[str], str]] = {
    "native": ([], "native"),
    "native-alloc": (["--events=alloc,free"], "native"),
    "fallback": ([], "python"),
    "baseline": ([], "native"),
    "baseline-alloc": (["--events=alloc,free"], "native"),
}
# --baseline: the other checkout whose CLI the `baseline` mode runs.
BASELINE: Path | None = None
CAPTURE_VARIABLE = "MSMEMSCOPE_TORCH_CAPTURE"
# Targets of the issue: native time/step vs none.
TARGETS = {"mlp": 1.10, "gpt2": 1.10, "gpt2-6l": 1.10}


# ----------------------------------------------------------------------------- worker


def build(workload: str) -> tuple[Callable[[], None], list[Any]]:
    """One training step of ``workload`` and what MemTracker should track externally."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    F = torch.nn.functional
    if workload == "mlp":
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Linear(256, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 10),
        )
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(64, 256)
        y = torch.randint(0, 10, (64,))

        def loss_fn() -> torch.Tensor:
            return F.cross_entropy(model(x), y)

        external: list[Any] = [model, opt, x, y]
    elif workload in ("gpt2", "gpt2-6l"):
        from transformers import GPT2Config, GPT2LMHeadModel

        if workload == "gpt2":
            config = GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000, n_positions=128)
            batch, tokens = 4, 64
        else:
            config = GPT2Config(
                n_layer=6,
                n_embd=512,
                n_head=8,
                vocab_size=8000,
                n_positions=256,
                bos_token_id=0,
                eos_token_id=0,
            )
            batch, tokens = 8, 128
        model = GPT2LMHeadModel(config)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, config.vocab_size, (batch, tokens))

        def loss_fn() -> torch.Tensor:
            return model(input_ids=ids, labels=ids).loss

        external = [model, opt, ids]
    elif workload == "cnn":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        x = torch.randn(32, 3, 32, 32)
        y = torch.randint(0, 10, (32,))

        def loss_fn() -> torch.Tensor:
            return F.cross_entropy(model(x), y)

        external = [model, opt, x, y]
    else:
        raise SystemExit(f"unknown workload {workload!r}")

    def step() -> None:
        opt.zero_grad()
        loss_fn().backward()
        opt.step()

    return step, external


def worker(workload: str, mode: str, steps: int, warmup: int) -> None:
    """Runs ``warmup`` then ``steps`` timed training steps; prints ``STEPS_PER_S <x>``,
    ``WINDOW_NS <t0> <t1>`` (``time.time_ns()`` around the timed steps) and ``CAPTURE <c>``."""
    step, external = build(workload)
    ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    reset: Callable[[], None] | None = None
    if mode == "memtracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(*external)
        # MemTracker refuses a second forward of a module without this.
        reset = tracker.reset_mod_stats
        ctx = tracker
    elif mode == "profiler":
        from torch.profiler import ProfilerActivity, profile

        ctx = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def one_step() -> None:
        if reset is not None:
            reset()
        step()

    with ctx:
        for _ in range(warmup):
            one_step()
        w0 = time.time_ns()
        t0 = time.perf_counter()
        for _ in range(steps):
            one_step()
        dt = time.perf_counter() - t0
        w1 = time.time_ns()
    tracker_module = sys.modules.get("msmemscope.capture.torch_tracker")
    capture = getattr(tracker_module, "capture", lambda: None)() if tracker_module else None
    print(f"STEPS_PER_S {steps / dt:.4f}", flush=True)
    print(f"WINDOW_NS {w0} {w1}", flush=True)
    print(f"CAPTURE {capture or 'none'}", flush=True)


def paired_worker(workload: str, blocks: int, steps: int, warmup: int) -> None:
    """Under the CLI: ``blocks`` rounds of three blocks of ``steps`` timed steps each, with the
    capture recording, installed but not recording (``msmemscope.stop()``), and removed (the
    native library's op callback taken off PyTorch, its allocator wrapper passing blocks
    through), in an order that changes every round; prints ``BLOCKS <recording s/step>
    <idle s/step> <removed s/step>`` per round."""
    import ctypes

    import torch

    import msmemscope
    from msmemscope.capture import native_build

    lib = ctypes.CDLL(str(native_build.library(torch)))  # the copy already loaded

    def recording() -> None:
        lib.msmemscope_torch_install()
        msmemscope.start()

    def idle() -> None:
        lib.msmemscope_torch_install()
        msmemscope.stop()

    def removed() -> None:
        msmemscope.stop()
        lib.msmemscope_torch_uninstall()

    states = [recording, idle, removed]
    step, _ = build(workload)
    for _ in range(warmup):
        step()
    for b in range(blocks):
        order = states[b % 3 :] + states[: b % 3]
        if (b // 3) % 2:
            order.reverse()
        times: dict[Callable[[], None], float] = {}
        for state in order:
            state()
            for _ in range(2):
                step()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            times[state] = (time.perf_counter() - t0) / steps
        print(f"BLOCKS {' '.join(f'{times[st]:.9f}' for st in states)}", flush=True)
    recording()  # the run ends as it began: recording


# ----------------------------------------------------------------------------- driver


@dataclass
class Run:
    steps_per_s: float
    rows_all: int | None = None  # every dump row
    rows_window: int | None = None  # dump rows inside the timed window
    capture: str = "none"


def steps_for(workload: str, override: int | None) -> int:
    return override if override is not None else DEFAULT_STEPS[workload]


def command(
    workload: str, mode: str, steps: int, warmup: int, out_dir: str, paired: int = 0
) -> list[str]:
    """The run of ``workload`` under ``mode``; with ``paired`` rounds, the paired worker's."""
    me = [str(PYTHON), str(Path(__file__).resolve())]
    me += ["--paired-worker", workload, str(paired)] if paired else ["--worker", workload, mode]
    me += ["--steps", str(steps), "--warmup", str(warmup)]
    if mode in CLI_MODES:
        cli = CLI
        if mode.startswith("baseline"):
            assert BASELINE is not None, "the baseline mode needs --baseline"
            cli = BASELINE / "target" / "release" / "msmemscope-cli"
        return [str(cli), *CLI_MODES[mode][0], "-o", out_dir, *me]
    return me


def environment(mode: str) -> dict[str, str]:
    drop = ("LD_PRELOAD", "PYTHONPATH", CAPTURE_VARIABLE)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.setdefault("OMP_NUM_THREADS", "1")
    if mode in CLI_MODES:
        env[CAPTURE_VARIABLE] = CLI_MODES[mode][1]
    return env


def env_prefix(mode: str) -> str:
    prefix = "OMP_NUM_THREADS=1"
    if mode in CLI_MODES:
        prefix += f" {CAPTURE_VARIABLE}={CLI_MODES[mode][1]}"
    return prefix


def count_rows(out_dir: Path, w0: int, w1: int) -> tuple[int, int]:
    """(all data rows, rows with ``w0 <= Timestamp(ns) <= w1``) of the run's CSV dumps."""
    total = window = 0
    for path in sorted(out_dir.glob("*/device_*/dump/memscope_dump_*.csv")):
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                continue
            col = header.index("Timestamp(ns)") if "Timestamp(ns)" in header else None
            for row in reader:
                total += 1
                if col is not None and col < len(row):
                    try:
                        ts = int(row[col])
                    except ValueError:
                        continue
                    if w0 <= ts <= w1:
                        window += 1
    return total, window


def launch(cmd: list[str], mode: str) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in the mode's environment; exits naming the command when it fails."""
    res = subprocess.run(cmd, capture_output=True, text=True, env=environment(mode), timeout=3600)
    if res.returncode != 0:
        shown = " ".join(shlex.quote(c) for c in cmd)
        raise SystemExit(f"failed ({res.returncode}): {shown}\n{res.stdout}\n{res.stderr[-4000:]}")
    return res


def run_once(workload: str, mode: str, steps: int, warmup: int, notes: list[str]) -> Run:
    out_dir = Path(tempfile.mkdtemp(prefix="msmemscope_bench_torch_"))
    try:
        cmd = command(workload, mode, steps, warmup, str(out_dir))
        res = launch(cmd, mode)
        shown = " ".join(shlex.quote(c) for c in cmd)
        values: dict[str, list[str]] = {}
        for line in res.stdout.splitlines():
            key, _, rest = line.partition(" ")
            if key in ("STEPS_PER_S", "WINDOW_NS", "CAPTURE"):
                values[key] = rest.split()
        if "STEPS_PER_S" not in values or "WINDOW_NS" not in values:
            raise SystemExit(f"no STEPS_PER_S line from: {shown}\n{res.stdout}\n{res.stderr}")
        run = Run(float(values["STEPS_PER_S"][0]), capture=values.get("CAPTURE", ["none"])[0])
        for line in res.stderr.splitlines():
            if "warning" in line.lower() or "unavailable" in line.lower():
                notes.append(f"{workload}/{mode} stderr: {line.strip()}")
        if mode in CLI_MODES:
            want = CLI_MODES[mode][1]
            if run.capture != want:
                notes.append(f"{workload}/{mode}: capture was {run.capture!r}, expected {want!r}")
            w0, w1 = (int(v) for v in values["WINDOW_NS"][:2])
            run.rows_all, run.rows_window = count_rows(out_dir, w0, w1)
        return run
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def paired_once(workload: str, mode: str, blocks: int, warmup: int) -> list[list[float]]:
    """Per round of one paired run of ``mode``: (recording, idle, removed) seconds per step."""
    out_dir = Path(tempfile.mkdtemp(prefix="msmemscope_bench_torch_"))
    try:
        cmd = command(workload, mode, BLOCK_STEPS[workload], warmup, str(out_dir), blocks)
        res = launch(cmd, mode)
        rounds = [
            [float(v) for v in line.split()[1:]]
            for line in res.stdout.splitlines()
            if line.startswith("BLOCKS ")
        ]
        if len(rounds) != blocks:
            raise SystemExit(f"{len(rounds)} of {blocks} BLOCKS lines from: {cmd}\n{res.stdout}")
        return rounds
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def spread(ratios: list[float]) -> str:
    """``median (first-third quartile)`` of per-round ratios."""
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    return f"{q2:.3f}x ({q1:.3f}-{q3:.3f})"


def paired_table(workloads: list[str], modes: list[str], blocks: int, warmup: int) -> None:
    print(
        f"### the capture's cost in one process ({blocks} rounds of three blocks; steps per "
        "block: " + ", ".join(f"{w} {BLOCK_STEPS[w]}" for w in workloads) + ")"
    )
    print()
    print(
        "time per step: recording = capture installed and recording; idle = installed, "
        "msmemscope.stop(); removed = op callback off PyTorch, allocator wrapper passing "
        "through. Median of the per-round ratios (quartiles)."
    )
    print()
    print("| workload | mode | recording / idle | idle / removed | recording / removed |")
    print("|---|---|---:|---:|---:|")
    for w in workloads:
        for m in modes:
            rounds = paired_once(w, m, blocks, warmup)
            print(
                f"| {w} | {m} | {spread([r / i for r, i, _ in rounds])} "
                f"| {spread([i / u for _, i, u in rounds])} "
                f"| {spread([r / u for r, _, u in rounds])} |",
                flush=True,
            )
    print()


def callgrind_totals(out_dir: Path) -> tuple[int, int]:
    """(main thread, other threads) instructions of the worker process in ``out_dir``."""
    main = other = 0
    for path in out_dir.glob("cg.*"):
        text = path.read_text(errors="replace")
        argv = text.partition("\ncmd:")[2].partition("\n")[0].split()
        # The worker's Python, not the CLI that launched it (whose argv names it too).
        if "--worker" not in argv or Path(argv[0]).name.startswith("msmemscope"):
            continue
        total = next(
            (int(line.split()[1]) for line in text.splitlines() if line.startswith("totals:")),
            0,
        )
        if "\nthread: 1\n" in text:
            main += total
        else:
            other += total
    return main, other


def instructions_once(workload: str, mode: str, steps: int, warmup: int) -> tuple[int, int]:
    """Instructions (main thread, other threads) of one run of ``mode`` under callgrind."""
    out_dir = Path(tempfile.mkdtemp(prefix="msmemscope_bench_cg_"))
    try:
        cmd = command(workload, mode, steps, warmup, str(out_dir / "dump"))
        cg = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--trace-children=yes"]
        cg += [f"--callgrind-out-file={out_dir}/cg.%p"]
        launch(cg + cmd, mode)
        return callgrind_totals(out_dir)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def instructions_table(workloads: list[str], modes: list[str], warmup: int) -> None:
    measured = [m for m in modes if m not in ("profiler", "memtracker")]
    if shutil.which("valgrind") is None:
        print("--instructions: valgrind is not installed; skipped")
        return
    print("### instructions per step (callgrind; (run with more steps - run with fewer) / steps)")
    print()
    print("| workload | mode | main thread | added vs none | other threads |")
    print("|---|---|---:|---:|---:|")
    for w in workloads:
        few, more = INSTRUCTION_STEPS[w]
        per_step: dict[str, tuple[float, float]] = {}
        for m in measured:
            # The two runs of a mode at once: one per core.
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                runs = [pool.submit(instructions_once, w, m, n, warmup) for n in (few, more)]
                a, b = (run.result() for run in runs)
            per_step[m] = ((b[0] - a[0]) / (more - few), (b[1] - a[1]) / (more - few))
        base = per_step.get("none", (0.0, 0.0))[0]
        for m, (main, other) in per_step.items():
            added = f"{(main - base) / base * 100:+.1f}%" if base and m != "none" else "-"
            print(f"| {w} | {m} | {main:,.0f} | {added} | {other:,.0f} |", flush=True)
    print()


def median_of(values: list[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def table(
    workload: str, modes: list[str], runs: dict[str, list[Run]], steps: int, warmup: int
) -> dict[str, float]:
    """Prints the workload's markdown table; returns the time ratio of each mode vs none."""
    med = {m: statistics.median(r.steps_per_s for r in runs[m]) for m in modes}
    base = med.get("none")
    rounds = len(runs[modes[0]])
    print(
        f"### {workload}: {DESCRIPTIONS[workload]} "
        f"({steps} timed steps after {warmup} warmup, median of {rounds} round(s))"
    )
    print()
    print(
        "| mode | steps/s (median) | min | max | time/step vs none | rows/step (timed) "
        "| rows/step (whole dump) | ns per row |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios: dict[str, float] = {}
    for m in modes:
        sps = [r.steps_per_s for r in runs[m]]
        ratio = base / med[m] if base else None
        if ratio is not None:
            ratios[m] = ratio
        per_step = median_of([r.rows_window for r in runs[m]])
        per_step = per_step / steps if per_step is not None else None
        whole = median_of([r.rows_all for r in runs[m]])
        whole = whole / (steps + warmup) if whole is not None else None
        ns = None
        if base and per_step:
            ns = (1.0 / med[m] - 1.0 / base) * 1e9 / per_step
        print(
            f"| {m} | {med[m]:.4g} | {min(sps):.4g} | {max(sps):.4g} "
            f"| {fmt(ratio, '.2f', 'x')} | {fmt(per_step, '.0f')} | {fmt(whole, '.0f')} "
            f"| {fmt(ns, '.0f')} |"
        )
    print()
    return ratios


def verdicts(all_ratios: dict[str, dict[str, float]]) -> None:
    lines: list[str] = []
    for workload, ratios in all_ratios.items():
        native = ratios.get("native")
        if native is None:
            continue
        target = TARGETS.get(workload)
        if target is not None:
            ok = "PASS" if native <= target else "FAIL"
            lines.append(f"{ok}: {workload} native {native:.2f}x <= {target}x none")
        for other in ("profiler", "memtracker"):
            if other in ratios and (workload in TARGETS or other == "memtracker"):
                ok = "PASS" if native < ratios[other] else "FAIL"
                lines.append(
                    f"{ok}: {workload} native {native:.2f}x < {other} {ratios[other]:.2f}x"
                )
    if lines:
        print("targets (time per step against none):")
        for line in lines:
            print(f"  {line}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "MODE"))
    ap.add_argument("--paired-worker", nargs=2, metavar=("WORKLOAD", "BLOCKS"))
    ap.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also measure each CLI mode recording, idle and removed, in one process",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="also count each mode's instructions per step under callgrind (needs valgrind)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps (default mlp 200, gpt2 20, cnn 50, gpt2-6l 4)",
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=None)
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout (built) whose CLI the baseline mode runs",
    )
    args = ap.parse_args()
    global BASELINE
    BASELINE = args.baseline.resolve() if args.baseline else None
    if args.modes is None:
        args.modes = ",".join(DEFAULT_MODES + (("baseline",) if BASELINE else ()))
    if args.paired_worker:
        workload, blocks = args.paired_worker
        paired_worker(workload, int(blocks), BLOCK_STEPS[workload], args.warmup)
        return
    if args.worker:
        workload, mode = args.worker
        worker(workload, mode, args.steps if args.steps is not None else 1, args.warmup)
        return
    workloads = [w for w in args.workloads.split(",") if w]
    modes = [m for m in args.modes.split(",") if m]
    for w in workloads:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}: choose from {', '.join(WORKLOADS)}")
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}: choose from {', '.join(MODES)}")
        if m.startswith("baseline") and BASELINE is None:
            raise SystemExit("the baseline mode needs --baseline DIR (a built checkout)")
    if any(m in CLI_MODES for m in modes) and not CLI.is_file():
        raise SystemExit(f"{CLI} is missing: run scripts/setup.sh")

    print(f"nproc {os.cpu_count()}, python {sys.version.split()[0]}")
    print("commands (each run once per round as a fresh process, modes rotated by round;")
    print("OUTDIR is a fresh temp dir per run, deleted after counting its dump rows):")
    for w in workloads:
        for m in modes:
            cmd = " ".join(command(w, m, steps_for(w, args.steps), args.warmup, "OUTDIR"))
            print(f"  {w:>4} {m:>12}: {env_prefix(m)} {cmd}")
    print()

    notes: list[str] = []
    results: dict[str, dict[str, list[Run]]] = {w: {m: [] for m in modes} for w in workloads}
    for r in range(args.rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for w in workloads:
            steps = steps_for(w, args.steps)
            for m in order:
                results[w][m].append(run_once(w, m, steps, args.warmup, notes))
            shown = ", ".join(f"{m} {results[w][m][-1].steps_per_s:.4g}" for m in modes)
            print(f"round {r + 1} {w}: steps/s {shown}", flush=True)
    print()

    all_ratios: dict[str, dict[str, float]] = {}
    if args.rounds > 0:  # --rounds 0: only the paired and instruction tables
        for w in workloads:
            all_ratios[w] = table(w, modes, results[w], steps_for(w, args.steps), args.warmup)
        print(
            "rows/step (timed): dump rows stamped inside the timed steps / timed steps; "
            "rows/step (whole dump): all dump rows / (warmup + timed steps), which also counts "
            "the import, model setup and exit rows. ns per row: (time/step(mode) - "
            "time/step(none)) / rows/step (timed)."
        )
        print()
    cli_modes = [m for m in modes if m in CLI_MODES]
    if args.paired and cli_modes:
        paired_table(workloads, cli_modes, args.paired, args.warmup)
    if args.instructions:
        instructions_table(workloads, modes, args.warmup)
    verdicts(all_ratios)
    if notes:
        print()
        print("notes:")
        for note in dict.fromkeys(notes):
            print(f"  {note}")


if __name__ == "__main__":
    main()
