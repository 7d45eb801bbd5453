"""Six data-parallel training steps of a small MLP on CPU (gloo), one process per rank, as
``torchrun --nproc-per-node=2`` starts them; the program has no msmemscope call.

Rank 1 keeps one 100,000-byte tensor (25,000 float32) from every step in ``kept``: the leak
the job's summary must pin on rank 1 alone.
"""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
y = torch.randint(0, 10, (32,))
kept = []
for _ in range(6):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    if rank == 1:
        kept.append(torch.empty(25_000, dtype=torch.float32))  # the leak
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done")
