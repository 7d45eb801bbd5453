"""A small CPU training loop for the install tests, run with the torch of the environment that
msmemscope was installed into. Its weights are (64*256 + 256 + 256*10 + 10) * 4 = 76840 bytes.
An MSTX mark "step" opens each step and one closes the last; each step keeps one tensor of
1000 float32 (4000 bytes) alive to the end, so check_leaks(dump, "step", 0) finds one block."""

import torch
from torch import nn

from msmemscope import mstx

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for _ in range(3):
    mstx.mark("step")
    kept.append(torch.empty(1000))
    loss = model(torch.randn(32, 64)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
mstx.mark("step")
print("trained with torch", torch.__version__)
