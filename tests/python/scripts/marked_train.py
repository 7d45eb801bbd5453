"""A small CPU training loop with an MSTX mark per step and a leak, for the Parquet tests.

Usage: marked_train.py [--steps N] [--forever]
First a mark whose message has a quote and a comma; then each step (in a function, so stacks
are two frames deep): mstx.mark("iter"), forward/backward/optimizer step of a small model, and
one 4096-byte tensor kept for the rest of the run (the leak check_leaks finds between marks);
prints `STEP <n> done` after it. With --forever it steps (every 50 ms) until it is killed.
"""

import argparse
import time

import torch

from msmemscope import mstx

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--forever", action="store_true")
opts = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(16, 32)
y = torch.randn(16, 8)
kept = []


def train_step(step):
    """One step, inside a function: its blocks' Python stacks are two frames deep."""
    mstx.mark("iter")
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    kept.append(torch.empty(1024, dtype=torch.float32))  # 4096 bytes, never freed
    print(f"STEP {step} done loss={loss.item():.4f}", flush=True)


# A message with the characters CSV quotes.
mstx.mark('epoch "0", start')
step = 0
while opts.forever or step < opts.steps:
    step += 1
    train_step(step)
    if opts.forever:
        time.sleep(0.05)
