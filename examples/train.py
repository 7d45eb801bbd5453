"""The quick-start demo's PyTorch part: a small CPU training loop with a classic leak.

It keeps every step's logits (for "later inspection") in a history list, so one 64x10 float
tensor per step (2560 bytes) stays alive from step to step. Run it under `msmemscope`: the
PyTorch tracker turns on by itself when torch is imported and the dump records every tensor
storage; each iteration calls `msmemscope.step()` when msmemscope is loaded, so the leaks
analysis names the kept logits from step 2 on.
"""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
history = []

step = getattr(sys.modules.get("msmemscope"), "step", None)  # set when run under msmemscope

for _ in range(5):
    if step:
        step()  # each iteration is one step for the leaks analysis
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(logits)  # the leak: each step's logits stay alive

print(f"trained 5 steps, last loss {loss.item():.4f}")
