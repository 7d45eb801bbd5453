"""Five FSDP2 training steps of a small MLP on CPU (gloo), one rank per process, for
``msmemscope ranks``.

Usage: ranks_train.py [leak=RANK]. The rendezvous comes from the environment as torchrun sets it
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The rank named by ``leak=`` keeps one 1,000,000-byte
tensor from each of steps 2 and 3 for the rest of the run: two blocks the leaks analysis finds
at the ends of steps 3 and 4.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import msmemscope

leaky_rank = next((int(a[5:]) for a in sys.argv[1:] if a.startswith("leak=")), None)

torch.manual_seed(0)
dist.init_process_group("gloo")
rank = dist.get_rank()

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(4, 16)
kept = []
for step in range(5):
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    if rank == leaky_rank and step in (2, 3):
        kept.append(torch.empty(250_000, dtype=torch.float32))
    msmemscope.step()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done, kept {len(kept)}")
