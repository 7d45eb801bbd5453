"""A long training loop that marks no steps and calls no msmemscope API: a 4-layer MLP trained
for ``STEPS`` iterations (steps from ``optimizer.step()``). Two things happen late:

- at iteration ``SPIKE_AT`` a one-off 8 MiB temporary makes that step the run's peak;
- from iteration ``LEAK_FROM`` on, each iteration's hidden activation (64x64 float32, 16 KiB)
  is kept in ``late_cache``: the leak starts late.

``argv[1]``, when given, is an iteration at which the process kills itself with SIGKILL.
"""

import os
import signal
import sys

import torch

STEPS = 1600
SPIKE_AT = 600
LEAK_FROM = 1200
kill_at = int(sys.argv[1]) if len(sys.argv) > 1 else -1

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 64),
    torch.nn.ReLU(),
    torch.nn.Linear(64, 64),
    torch.nn.ReLU(),
    torch.nn.Linear(64, 64),
    torch.nn.ReLU(),
    torch.nn.Linear(64, 8),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
late_cache = []

for i in range(STEPS):
    if i == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.randn(64, 64)
    hidden = model[:2](x)
    loss = model[2:](hidden).square().mean()
    if i == SPIKE_AT:
        spike = torch.ones(2 << 20)  # 8 MiB, freed at once
        loss = loss + spike[0] * 0
        del spike
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if i >= LEAK_FROM:
        late_cache.append(hidden.detach())
print(f"trained {STEPS} steps")
