"""The native PyTorch capture on a GPU: a GPT-2 training step on CUDA, checked against the
caching allocator's own counter.

Runs (under the CLI, default options) one GPT-2 step (transformers, from config, random init) on
``cuda:0`` between two marks, after a warm-up step, and compares the dump's MALLOC rows on
``cuda:0`` inside the step with the growth of
``torch.cuda.memory_stats()["allocation.all.allocated"]`` over the same step; also that every
block the step frees has a FREE row, and the dump's live bytes on the device at the end of the
step against ``memory_allocated()``'s growth. Prints PASS/FAIL lines; exits 1 on a FAIL, 0 (with
SKIP) where no CUDA device is present.

Usage: ``.venv/bin/python bench/torch_capture_cuda.py``
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "target" / "release" / "msmemscope-cli"

CHILD = """
import json, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel
import msmemscope.mstx as mstx

torch.manual_seed(0)
dev = torch.device("cuda:0")
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000,
                                   n_positions=128)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 1000, (4, 64), device=dev)

def step():
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    torch.cuda.synchronize()

step()
s0 = torch.cuda.memory_stats(dev)
mstx.mark("cuda-step-begin")
step()
mstx.mark("cuda-step-end")
s1 = torch.cuda.memory_stats(dev)
print("STATS", json.dumps({
    "allocations": s1["allocation.all.allocated"] - s0["allocation.all.allocated"],
    "frees": s1["allocation.all.freed"] - s0["allocation.all.freed"],
    "allocated_growth": s1["allocated_bytes.all.current"] - s0["allocated_bytes.all.current"],
}))
"""


def main() -> int:
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        out = Path(tmp) / "out"
        env = dict(os.environ, MSMEMSCOPE_TORCH_CAPTURE="native")
        proc = subprocess.run(
            [str(CLI), "--analysis=none", "-o", str(out), sys.executable, str(script)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        print(proc.stderr[-2000:], file=sys.stderr)
        if proc.returncode != 0:
            print(f"FAIL: the program exited {proc.returncode}")
            return 1
        stats = json.loads(proc.stdout.split("STATS", 1)[1])
        [dump] = sorted(out.glob("msmemscope_*/device_0/dump/memscope_dump_*.csv"))
        with dump.open(newline="") as f:
            rows = list(csv.DictReader(f))
    inside, step = False, []
    for r in rows:
        text = r["Name"] + r["Attr"]
        if r["Event"] == "MSTX" or "cuda-step-" in text:
            inside = "cuda-step-begin" in text
            continue
        if inside and r["Device Id"] in ("0", "cuda:0"):
            step.append(r)
    mallocs = [r for r in step if r["Event"] == "MALLOC" and r["Event Type"] == "PTA"]
    frees = [r for r in step if r["Event"] == "FREE" and r["Event Type"] == "PTA"]
    net = sum(json.loads(r["Attr"])["size"] for r in mallocs)
    net -= sum(json.loads(r["Attr"])["size"] for r in frees)
    checks = [
        ("MALLOC rows == allocation.all.allocated growth", len(mallocs), stats["allocations"]),
        ("FREE rows == allocation.all.freed growth", len(frees), stats["frees"]),
        ("net bytes == allocated_bytes.all.current growth", net, stats["allocated_growth"]),
    ]
    failed = False
    for what, ours, theirs in checks:
        verdict = "PASS" if ours == theirs else "FAIL"
        failed |= verdict == "FAIL"
        print(f"{verdict}: {what}: {ours} vs {theirs}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
