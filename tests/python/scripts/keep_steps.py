"""Trains long enough to pass a 1 MiB dump budget, asking the bounded dump to keep step 40."""

import torch

import msmemscope

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
asked = False
for _ in range(600):
    msmemscope.step()
    if not asked:
        asked = msmemscope.keep_steps(40)
    x = torch.randn(16, 64)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("asked" if asked else "not asked")
