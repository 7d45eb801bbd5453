"""Storage edge cases for the PyTorch tracker; prints `KNOWN <label> <data_ptr> <nbytes>` lines.

Run under `msmemscope` (the tracker is on from `import torch`)."""

import gc

import torch


def known(label, t):
    st = t.untyped_storage()
    print(f"KNOWN {label} {st.data_ptr()} {st.nbytes()}", flush=True)


base = torch.empty(250, dtype=torch.float32)  # 1000 bytes
known("base", base)
view = base[10:20]  # a view: no second MALLOC
view2 = base.view(25, 10).t()
known("view", view)
del base
gc.collect()
print("MARK base-deleted", flush=True)
del view, view2  # the storage dies here: one FREE
print("MARK views-deleted", flush=True)

grow = torch.empty(0, dtype=torch.float64)  # zero bytes: no MALLOC
grow.resize_(10)  # 80 bytes
known("grow80", grow)
grow.resize_(500)  # 4000 bytes: FREE 80 + MALLOC 4000
known("grow4000", grow)

out = torch.empty(0)
torch.add(torch.ones(3), torch.ones(3), out=out)  # out= resizes: 12 bytes
known("out12", out)

parts = torch.ones(6, dtype=torch.int32).split(2)  # views of one storage
known("split", parts[0])
both = torch.cat(parts)  # 24 bytes, new
known("cat", both)
