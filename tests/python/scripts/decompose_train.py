"""An unedited-style CPU training loop (MLP + Adam) run under PyTorch's MemTracker, for the
decompose tests: it prints MemTracker's breakdown at the end of every step as JSON lines
``MEMTRACKER {"step": N, "current": {...}, "peak": {...}}`` (category -> bytes, CPU device).

Usage: decompose_train.py STEPS [describe]
With ``describe``, parts of the loop are labelled with msmemscope.describe (all four forms).
"""

import json
import sys

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

import msmemscope

steps = int(sys.argv[1])
describe_mode = len(sys.argv) > 2 and sys.argv[2] == "describe"

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
tracker = MemTracker()
tracker.track_external(model, optimizer)


def snapshot(kind):
    snap = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    return {getattr(k, "value", k): v for k, v in snap.items()}


def report(step):
    print(
        "MEMTRACKER "
        + json.dumps({"step": step, "current": snapshot("current"), "peak": snapshot("peak")})
    )


def batch():
    return torch.randn(32, 64), torch.randint(0, 10, (32,))


def train_step():
    x, y = batch()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


with tracker:
    for step in range(1, steps + 1):
        report(step - 1)
        msmemscope.step()
        tracker.reset_mod_stats()
        # A fresh peak per step, from what is live now.
        tracker._peak_mem = {}
        tracker._peak_mem_snap = {}
        train_step()
    report(steps)
