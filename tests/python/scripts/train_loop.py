"""A small CPU training loop that knows nothing of msmemscope (the "unedited" program).

Usage: train_loop.py [--steps N] [--optim sgd|adam] [--step-api] [--deferred] [--threads]
  --step-api   call msmemscope.step() after each step
  --deferred   call msmemscope.start() after the first step (for --collect-mode=deferred)
Prints `KNOWN <label> <data_ptr> <nbytes>` for tensors whose sizes the tests check, and
`STEP <n> done` after each step.
"""

import argparse
import threading

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--optim", default="adam")
parser.add_argument("--step-api", action="store_true")
parser.add_argument("--deferred", action="store_true")
parser.add_argument("--threads", action="store_true")
opts = parser.parse_args()

if opts.step_api or opts.deferred:
    import msmemscope


def known(label, t):
    st = t.untyped_storage()
    print(f"KNOWN {label} {st.data_ptr()} {st.nbytes()}", flush=True)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = (
    torch.optim.Adam(model.parameters(), lr=1e-3)
    if opts.optim == "adam"
    else torch.optim.SGD(model.parameters(), lr=0.1)
)
known("weight0", model[0].weight)  # 64*32*4 = 8192

x = torch.randn(16, 32)
y = torch.randn(16, 8)
for step in range(1, opts.steps + 1):
    if opts.deferred and step == 2:
        msmemscope.start()
    scratch = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
    known(f"empty1000_step{step}", scratch)
    half = torch.zeros(37, dtype=torch.float16)  # 74 bytes
    known(f"zeros37_step{step}", half)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    del scratch, half
    if opts.step_api:
        msmemscope.step()
    print(f"STEP {step} done loss={loss.item():.4f}", flush=True)

if opts.threads:

    def work():
        t = torch.ones(300, dtype=torch.float64)  # 2400 bytes
        known("thread_ones300", t)

    th = threading.Thread(target=work)
    th.start()
    th.join()
