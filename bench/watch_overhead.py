"""Memory block watch: checksum throughput and the cost per watched op.

1. CRC-64 throughput of ``_native.watch_crc64`` (slicing-by-8, in place) on a 256 MiB CPU
   tensor, next to ``zlib.crc32`` (a different CRC, as a well-known speed reference) on the same
   bytes.
2. Per-op cost under the CLI: a loop of ``x.add_(1)`` on a 256-float tensor, with nothing
   watched, with a 4 KiB block watched (checksum CSV), with a 1 MiB block watched, and with a
   4 KiB block in full-content mode (one .bin file per op side). The median µs per op of
   interleaved rounds, and what the watch adds to the unwatched run.

Usage: ``.venv/bin/python bench/watch_overhead.py [--rounds 3] [--ops 20000]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "target" / "release" / "msmemscope-cli"
PYTHON = REPO / ".venv" / "bin" / "python"

MODES = {
    "unwatched": ([], 0),
    "watch 4 KiB": ([], 4096),
    "watch 1 MiB": ([], 1 << 20),
    "full-content 4 KiB": (["--watch=aten::add_.Tensor,aten::sum.default,full-content"], 4096),
}


def worker(ops: int, block: int) -> None:
    import torch

    from msmemscope import watcher

    torch.set_num_threads(1)
    x = torch.zeros(256)
    if block:
        watched = torch.ones(block // 4)
        watcher.watch(watched, name="bench")
    for _ in range(200):
        x.add_(1)
    t0 = time.perf_counter()
    for _ in range(ops):
        x.add_(1)
    dt = time.perf_counter() - t0
    x.sum()  # closes a --watch range
    print(f"US_PER_OP {dt / ops * 1e6:.3f}", flush=True)


def crc_throughput() -> None:
    import torch

    from msmemscope import _native

    n = 256 << 20
    t = torch.randint(0, 256, (n,), dtype=torch.uint8)
    data = bytes(t.numpy())
    best = {}
    for _ in range(3):
        t0 = time.perf_counter()
        _native.watch_crc64(t.data_ptr(), n)
        best["crc64 (msmemscope, in place)"] = min(
            best.get("crc64 (msmemscope, in place)", 1e9), time.perf_counter() - t0
        )
        t0 = time.perf_counter()
        zlib.crc32(data)
        best["zlib.crc32 (reference)"] = min(
            best.get("zlib.crc32 (reference)", 1e9), time.perf_counter() - t0
        )
    for name, dt in best.items():
        print(f"{name:32s} {n / dt / 1e9:6.2f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    crc_throughput()
    results: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode, (options, block) in MODES.items():
                cmd = [
                    str(CLI),
                    "--analysis=none",
                    *options,
                    "-o",
                    f"{tmp}/{r}",
                    str(PYTHON),
                    __file__,
                    "--worker",
                    str(args.ops),
                    str(block),
                ]
                if r == 0:
                    print("$", " ".join(cmd), file=sys.stderr)
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                us = float(out.split("US_PER_OP")[1].split()[0])
                results[mode].append(us)
    base = statistics.median(results["unwatched"])
    print(f"{'mode':20s} {'us/op':>8s} {'added':>8s}")
    for mode, values in results.items():
        med = statistics.median(values)
        print(f"{mode:20s} {med:8.2f} {med - base:8.2f}")


if __name__ == "__main__":
    main()
