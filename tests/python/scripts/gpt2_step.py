"""One GPT-2 training step (transformers, from config, random init) between two marks.

With `--api OUT`, msmemscope is started from Python (no preloaded runtime, so an LD_PRELOAD
counter sees every call). With `--counter`, the LD_PRELOAD counter
(tests/python/native/memalign_counter.c) counts c10's CPU allocations in the step; with
`--profiler`, torch.profiler (profile_memory) records the step instead. Prints `COUNTED n` or
`PROFILER_NET bytes`."""

import ctypes
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import msmemscope
import msmemscope.mstx as mstx

if "--api" in sys.argv:  # the Python API instead of the launcher: OUT is the last argument
    msmemscope.config(output_path=sys.argv[-1], analysis="none")
    msmemscope.start()

torch.manual_seed(0)
torch.set_num_threads(1)
config = GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000, n_positions=128)
model = GPT2LMHeadModel(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 1000, (4, 64))


def step():
    opt.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()


step()  # the first step makes the optimizer's state and the lazy caches
counter = ctypes.CDLL(None) if "--counter" in sys.argv else None
if "--profiler" in sys.argv:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    net = sum(e.self_cpu_memory_usage for e in prof.events())
    print("PROFILER_NET", net)
else:
    mstx.mark("step-begin")
    if counter is not None:
        counter.counter_start()
    step()
    if counter is not None:
        print("COUNTED", counter.counter_stop())
    mstx.mark("step-end")
if "--api" in sys.argv:
    msmemscope.stop()
