"""A watched block stomped twice: once by an in-place op on a view that aliases it, once by a
custom op whose CPU kernel writes past the end of its output into it.

One float32 buffer of 16 elements holds both: the custom op's output is buf[0:8], the watched
block is buf[8:16] (32 bytes), so "past its output" is the watched block's first elements and
stays inside memory the buffer owns.

    python watch_stomp.py MODE [DUMP_NUMS]

MODE: tensor (watch the tensor), address (watch data_ptr() and length), none (watch nothing
from Python: the --watch range watches its start op's outputs). The script prints
`KNOWN name address length` for the watched block and `PHASE name` markers on stdout.
"""

import sys

import torch

import msmemscope
from msmemscope import watcher

mode = sys.argv[1]
dump_nums = int(sys.argv[2]) if len(sys.argv) > 2 else None

lib = torch.library.Library("mswatch", "DEF")
lib.define("stomp(Tensor(a!) out, int extra) -> ()")


def stomp_cpu(out, extra):
    # Fills `out` and the `extra` elements after it: a kernel that miscounts its output size.
    wide = out.as_strided((out.numel() + extra,), (1,))
    wide.fill_(7.0)


lib.impl("stomp", stomp_cpu, "CPU")

buf = torch.zeros(16)
out = buf[0:8]
w = buf[8:16]
print("KNOWN w", w.data_ptr(), w.numel() * w.element_size(), flush=True)

if mode == "tensor":
    watcher.watch(w, name="w", dump_nums=dump_nums)
elif mode == "address":
    watcher.watch(w.data_ptr(), length=32, name="w", dump_nums=dump_nums)

a = torch.ones(8)
b = a + 1  # aten::add.Tensor: does not touch the block
alias = w[4:8]  # a view aliasing the watched block's last four elements
alias.add_(1)  # aten::add_.Tensor: writes the block through the alias
c = b * 2  # aten::mul.Tensor
c.add_(1)  # aten::add_.Tensor on c: only the --watch range's own block changes here
torch.ops.mswatch.stomp(out, 2)  # writes buf[0:10]: the block's first two elements
s = c.sum()  # aten::sum.default

if mode == "tensor":
    watcher.remove(w)
elif mode == "address":
    watcher.remove(w.data_ptr(), length=32)
print("PHASE removed", flush=True)

w.mul_(3)  # after remove: no dumps
e = c + 1
msmemscope.step()
