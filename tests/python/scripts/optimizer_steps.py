"""A tiny training loop that marks no steps and calls no msmemscope API: four
``optimizer.step()`` calls, the only step boundaries msmemscope can see."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    loss = model(torch.randn(8, 16)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("trained 4 steps")
