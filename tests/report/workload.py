"""The real run the report tests open: a small CPU training loop under `msmemscope`.

It keeps each step's logits (so the leaks analysis finds the line growing from step 2 on), marks the
steps with MSTX marks, watches a tensor that an op changes in place, and ends with a tensor
allocation that fails (so the oom analysis writes OOM_DETAIL rows). With the argument
`variant` one op more runs each step (the compare view's difference).
"""

import sys

import torch

import msmemscope
from msmemscope import mstx, watcher

variant = sys.argv[1:] == ["variant"]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
watched = torch.zeros(32)
watcher.watch(watched, name="counter", dump_nums=4)
watched.add_(1)  # an in-place op: the watch sees the checksum change inside it

for i in range(6):
    msmemscope.step()
    mstx.mark(f"iteration {i}")
    x = torch.randn(16, 64)
    if variant:
        x = x * 2
    logits = model(x)
    loss = logits.square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(logits)

try:
    torch.empty(2**50)
except RuntimeError:
    print("allocation failed as planned")
print("done")
