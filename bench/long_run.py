"""A long training run with the tool left on: run-directory size, RSS and time per window.

The workload is the one the long-run issue measured: a 12-layer ``nn.TransformerEncoder`` LM
(d_model 128, 4 heads, feed-forward 512, vocab 1000), batch 4 x 32 token ids, next-token loss,
AdamW, ``torch.set_num_threads(1)``, ``torch.manual_seed(0)``, no msmemscope calls (the steps
come from ``optimizer.step()``). It runs the same number of steps twice, one after the other:
plain Python, then under ``msmemscope`` with default options (``--dump-budget`` as given, the
default 256MiB unless set). Each process prints, at the end of every window of ``--window``
steps, the window's wall time and its own RSS; for the traced run the benchmark also measures
the run directory's size on disk at that moment. At the end it prints one markdown table with
a row per window (plain time, traced time, the ratio, the traced process's RSS minus the plain
one's at the same window, the directory's size), the totals, the last window's cost against the
first's, the console lines the tool printed, and the issue's goals (last window no dearer than
the first, total <= 1.15x plain, directory <= 300 MiB).

Usage: ``.venv/bin/python bench/long_run.py [--steps 10000] [--window 1000]
[--budget 256MiB] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
CLI = REPO / "bin" / "msmemscope"

WORKER = r"""
import os, sys, time
import torch
steps, window = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
vocab, d, seq, batch = 1000, 128, 32, 4
class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, 4, 512, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, vocab)
    def forward(self, ids):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.body(self.embed(ids), mask=mask, is_causal=True))
model = LM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
start = time.perf_counter()
for i in range(1, steps + 1):
    ids = torch.randint(0, vocab, (batch, seq + 1))
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if i % window == 0:
        now = time.perf_counter()
        print(f"WINDOW {i} {now - start:.3f} {rss()}", flush=True)
        start = now
"""


def dir_bytes(root: Path) -> int:
    total = 0
    for base, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                pass
    return total


def run(
    cmd: list[str], out_dir: Path | None
) -> tuple[list[tuple[int, float, int, int]], list[str]]:
    """Runs a worker, reading its windows as they come: (step, seconds, rss, dir bytes)."""
    windows = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.startswith("WINDOW "):
            _, step, secs, rss = line.split()
            size = dir_bytes(out_dir) if out_dir else 0
            windows.append((int(step), float(secs), int(rss), size))
            print(
                f"  {'traced' if out_dir else 'plain '} step {step}: {float(secs):.1f} s, "
                f"rss {int(rss) >> 20} MiB, dir {size >> 20} MiB",
                file=sys.stderr,
                flush=True,
            )
    stderr = proc.stderr.read()
    if proc.wait() != 0:
        sys.exit(f"{cmd}: exit {proc.returncode}\n{stderr}")
    return windows, stderr.splitlines()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=1_000)
    ap.add_argument("--budget", default=None, help="--dump-budget for the traced run")
    ap.add_argument("--out", type=Path, default=None, help="keep the run directory here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="msmemscope_long_run_"))
    worker = tmp / "worker.py"
    worker.write_text(WORKER)
    out = args.out or tmp / "out"
    base = [str(PYTHON), str(worker), str(args.steps), str(args.window)]
    traced_cmd = [str(CLI), "-o", str(out)]
    if args.budget:
        traced_cmd.append(f"--dump-budget={args.budget}")
    traced_cmd += base
    print(
        f"plain:  {' '.join(base)}\ntraced: {' '.join(traced_cmd)}\nnproc {os.cpu_count()}",
        file=sys.stderr,
    )
    began = time.time()
    plain, _ = run(base, None)
    traced, console = run(traced_cmd, out)
    final = dir_bytes(out)
    print(f"\n{args.steps} steps, window {args.window}, {time.time() - began:.0f} s in all\n")
    print("| steps | plain s | traced s | traced/plain | RSS added MiB | run dir MiB |")
    print("|---|---|---|---|---|---|")
    for (step, p, prss, _), (_, t, trss, size) in zip(plain, traced):
        print(
            f"| {step} | {p:.1f} | {t:.1f} | {t / p:.2f}x | {(trss - prss) / 2**20:.0f} | "
            f"{size / 2**20:.0f} |"
        )
    total_plain = sum(w[1] for w in plain)
    total_traced = sum(w[1] for w in traced)
    first = traced[0][1] / plain[0][1]
    last = traced[-1][1] / plain[-1][1]
    print(
        f"\ntotal: plain {total_plain:.0f} s, traced {total_traced:.0f} s, "
        f"{total_traced / total_plain:.2f}x (goal <= 1.15x)"
    )
    print(f"first window {first:.2f}x, last window {last:.2f}x (goal: last no dearer than first)")
    print(f"run directory at the end: {final / 2**20:.0f} MiB (goal <= 300 MiB)")
    for log in sorted(out.glob("*/msmemscope_logs/runtime_*.log")):
        for line in log.read_text(errors="replace").splitlines():
            match = re.search(r"writer: (\d+) rows written in ([\d.]+) s of writer CPU", line)
            if match:
                rows, cpu = int(match.group(1)), float(match.group(2))
                print(f"writer: {rows} rows, {cpu:.1f} s of its CPU, {cpu / rows * 1e9:.0f} ns/row")
    print(f"console lines of the tool: {len(console)}")
    print("\n".join(f"    {line}" for line in console))
    if args.out is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
