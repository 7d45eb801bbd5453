"""The quick-start demo's PyTorch part: a small CPU training loop with a classic leak.

It keeps every step's loss tensor (not `loss.item()`) in a history list, so each step's
autograd graph and activations stay alive. Run unedited under `msmemscope`: the PyTorch tracker
turns on by itself when torch is imported and the dump records every tensor storage.
"""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
history = []

for step in range(5):
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(loss)  # the leak: the tensor, its graph and saved activations stay alive

print(f"trained 5 steps, last loss {history[-1].item():.4f}")
