"""watch() of the address of a tensor that is gone: refused, naming the freed block."""

import gc

import torch

from msmemscope import watcher

t = torch.ones(1000, dtype=torch.float32)
ptr = t.data_ptr()
del t
gc.collect()
print(f"ptr 0x{ptr:x}")
try:
    watcher.watch(ptr + 16, length=64, name="gone")
except ValueError as e:
    print(f"refused {e}")
else:
    print("accepted")
