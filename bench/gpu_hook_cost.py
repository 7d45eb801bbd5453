"""What the CUDA hooks add per call, without a GPU: a C loop of cuMemAlloc_v2/cuMemFree_v2 pairs
and of cuLaunchKernel calls against the stand-in driver of the tests
(tests/fixtures/fake_cuda/libcuda.c, whose calls cost a few nanoseconds), run with no tool and
under msmemscope in four settings:

- deferred: the hooks are in place but nothing traces (``--collect-mode deferred``, no start());
- op level (the default): allocations are recorded, launches only checked against the filter;
- kernel level: launches are recorded too;
- launch only (``--events launch --analysis none``): the hooks keep their book of live blocks
  but write no allocation rows.

Prints the median ns per alloc/free pair and per launch over ``--rounds`` runs (the writer
thread shares the machine's cores with the program: on a loaded 2-core box its CSV writing is
most of the recorded cost). Usage: ``python3 bench/gpu_hook_cost.py [--calls N] [--rounds R]``
after ``cargo build --release``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "target", "release", "msmemscope-cli")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "fake_cuda/fake_cuda.h"
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    CUfunction f;
    cuModuleGetFunction(&f, NULL, "_Z6kernelPf");
    double t0 = now();
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        cuMemAlloc_v2(&p, 4096);
        cuMemFree_v2(p);
    }
    double t1 = now();
    for (long i = 0; i < n; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)0x51, NULL, NULL);
    double t2 = now();
    printf("%.1f %.1f\n", (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9);
    return 0;
}
"""

SETTINGS = {
    "no tool": None,
    "deferred (not tracing)": ["--collect-mode=deferred"],
    "op level (default)": [],
    "kernel level": ["--level=kernel"],
    "launch only": ["--events=launch", "--analysis=none"],
}


def build(work: str) -> str:
    lib = os.path.join(work, "libcuda.so.1")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            lib,
            os.path.join(FIXTURES, "fake_cuda", "libcuda.c"),
        ],
        check=True,
    )
    os.symlink("libcuda.so.1", os.path.join(work, "libcuda.so"))
    src = os.path.join(work, "loop.c")
    with open(src, "w") as f:
        f.write(LOOP)
    prog = os.path.join(work, "loop")
    subprocess.run(
        [
            "gcc",
            "-O2",
            f"-I{FIXTURES}",
            "-o",
            prog,
            src,
            f"-L{work}",
            "-lcuda",
            f"-Wl,-rpath,{work}",
        ],
        check=True,
    )
    return prog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="msmemscope-hook-cost-")
    try:
        prog = build(work)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in SETTINGS}
        for _ in range(args.rounds):
            for name, options in SETTINGS.items():
                out = os.path.join(work, "out")
                cmd = [prog, str(args.calls)]
                if options is not None:
                    cmd = [CLI, *options, "-o", out, *cmd]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                pair, launch = (float(v) for v in done.stdout.split())
                samples[name].append((pair, launch))
                shutil.rmtree(out, ignore_errors=True)
        print(f"{args.calls} calls each, median of {args.rounds} rounds, nproc {os.cpu_count()}")
        print(f"{'setting':26} {'ns/alloc+free pair':>20} {'ns/launch':>10}")
        for name, values in samples.items():
            pair = statistics.median(v[0] for v in values)
            launch = statistics.median(v[1] for v in values)
            print(f"{name:26} {pair:20.0f} {launch:10.0f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
