"""A PyTorch training loop that uses no framework msmemscope hooks (no FSDP, vLLM...): under
``--analysis=decompose`` the hooks are registered but none may activate. Prints ``WATCHING``
(the module names the lazy hooks wait for), ``ARMED`` (hooks waiting for a first use),
``ACTIVATIONS n`` and ``LOADED`` (vLLM/Megatron/verl modules imported)."""

import sys

import torch
from torch import nn

from msmemscope.frameworks import hooks
from msmemscope.frameworks.hooks import _post_import

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.Adam(model.parameters())
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()

print("WATCHING " + ",".join(sorted(_post_import.callbacks)))
print("ARMED " + ",".join(hooks.armed()))
print(f"ACTIVATIONS {hooks.activation_count()}")
frameworks = ("vllm", "megatron", "verl")
print("LOADED " + ",".join(m for m in sorted(sys.modules) if m.startswith(frameworks)))
