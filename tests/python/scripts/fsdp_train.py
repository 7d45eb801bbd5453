"""Two training steps of a small MLP under FSDP on CPU (gloo), one rank per process.

Usage: fsdp_train.py fsdp1|fsdp2 [manual] [api=DIR]. The rendezvous comes from the environment
as torchrun sets it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). With ``manual`` the script
calls ``msmemscope.init_framework_hooks`` itself; with ``api=DIR`` it configures
(``analysis="decompose"``) and starts tracing itself, writing under DIR. Prints ``KNOWN
param_bytes N`` (the unsharded model's parameter bytes), ``ACTIVE ...`` (the applied hooks) and
``ARMED ...`` (automatic hooks waiting for a first use), and marks ``fsdp-check`` (an MSTX mark)
after the second step while everything is still alive.
"""

import gc
import sys

import torch
import torch.distributed as dist
from torch import nn

import msmemscope

kind = sys.argv[1]
manual = "manual" in sys.argv[2:]
# api=DIR: traced from Python (as under torchrun, whose workers the launcher does not trace).
api_output = next((a[4:] for a in sys.argv[2:] if a.startswith("api=")), None)
if api_output is not None:
    msmemscope.config(events="alloc,free", analysis="decompose", output_path=api_output)
    msmemscope.start()

torch.manual_seed(0)
dist.init_process_group("gloo")
rank = dist.get_rank()

# Every parameter's first dimension is even, so each of the 2 ranks holds exactly half.
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

if manual:
    version = "2.6+" if kind == "fsdp1" else "2.10+"
    msmemscope.init_framework_hooks("pytorch", version, kind, "decompose")

if kind == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
elif kind == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(model, device_id=torch.device("cpu"))
else:
    raise SystemExit(f"unknown kind {kind!r}: fsdp1 or fsdp2")

optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(4, 16)
for _ in range(2):
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    msmemscope.step()

from msmemscope.frameworks import hooks  # noqa: E402

print(f"KNOWN param_bytes {param_bytes}")
print("ACTIVE " + ";".join(",".join(h) for h in hooks.active_hooks()))
print("ARMED " + ",".join(hooks.armed()))
# gloo runs collectives on threads of its own and lets go of a reduce-scatter's buffers when
# its work completes: on a loaded machine that can come after the mark. Once every rank has
# passed a barrier, this rank's earlier collectives are done.
dist.barrier()
gc.collect()
msmemscope.mstx.mark("fsdp-check")
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
if api_output is not None:
    msmemscope.stop()
