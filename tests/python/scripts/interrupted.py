"""A traced PyTorch program interrupted by Ctrl-C: a KeyboardInterrupt nobody catches.
Python then ends the process by SIGINT itself, without the C exit handlers."""

import os
import signal

import torch

kept = torch.ones(1024, dtype=torch.float32)  # 4096 bytes, alive at the interrupt
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGINT)
raise SystemExit("not reached: KeyboardInterrupt expected")
