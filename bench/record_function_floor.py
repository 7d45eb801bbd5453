"""What PyTorch's RecordFunction path costs a training step with a callback that does nothing.

The native capture's ATEN_START/ATEN_END rows come from a global RecordFunction callback
(scope FUNCTION, no inputs or outputs). With any such callback registered, PyTorch builds a
RecordFunction for every dispatcher op and calls the callback at the op's start and end; that
part of the capture's cost is PyTorch's, the same for torch.profiler, and no callback of ours
can go below it. This benchmark measures it: it compiles an empty callback (one ``g++`` call
against the running torch's headers, the flags the native capture uses) and times blocks of
training steps (``torch_overhead.py``'s workloads; ``mlp`` by default: 256-512-256-10, batch
64, Adam) with the callback registered and removed, alternating in one process. It prints the
median and quartiles of the per-round ratios registered / removed.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/record_function_floor.py [--rounds 40]
[--steps 30] [--workload mlp]``
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from msmemscope.capture import native_build

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_overhead import build

SOURCE = r"""
#include <ATen/record_function.h>

namespace {
at::CallbackHandle handle = 0;
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) { return nullptr; }
void on_end(const at::RecordFunction&, at::ObserverContext*) {}
}  // namespace

extern "C" __attribute__((visibility("default"))) void floor_register() {
  if (handle == 0) {
    handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                       .needsInputs(false)
                                       .needsOutputs(false)
                                       .scopes({at::RecordScope::FUNCTION}));
  }
}

extern "C" __attribute__((visibility("default"))) void floor_remove() {
  if (handle != 0) {
    at::removeCallback(handle);
    handle = 0;
  }
}
"""


def compile_floor(directory: Path) -> ctypes.CDLL:
    source = directory / "floor.cpp"
    source.write_text(SOURCE)
    library = directory / "floor.so"
    subprocess.run(native_build.compile_command(torch, "g++", [source], library), check=True)
    return ctypes.CDLL(str(library))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per block")
    ap.add_argument("--workload", default="mlp", help="one of torch_overhead.py's workloads")
    args = ap.parse_args()

    step, _ = build(args.workload)

    def block() -> float:
        for _ in range(2):  # untimed after each switch
            step()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - t0) / args.steps

    with tempfile.TemporaryDirectory() as tmp:
        lib = compile_floor(Path(tmp))
        for _ in range(10):
            step()
        ratios, removed_times = [], []
        for r in range(args.rounds):
            times = {}
            for state in ("removed", "registered") if r % 2 == 0 else ("registered", "removed"):
                (lib.floor_register if state == "registered" else lib.floor_remove)()
                times[state] = block()
            lib.floor_remove()
            ratios.append(times["registered"] / times["removed"])
            removed_times.append(times["removed"])
    q = statistics.quantiles(ratios, n=4)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    print(
        f"{args.workload} step, empty RecordFunction callback registered / removed: "
        f"{statistics.median(ratios):.3f}x (quartiles {q[0]:.3f}-{q[2]:.3f}; {args.rounds} rounds "
        f"of {args.steps} steps; removed: {statistics.median(removed_times) * 1e3:.2f} ms/step)"
    )


if __name__ == "__main__":
    main()
