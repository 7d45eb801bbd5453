"""Worker processes as Python starts them, for ``--follow``; no msmemscope call.

``spawn_leak``: the main process starts one ``multiprocessing`` worker with the ``spawn``
method; it trains six steps and keeps one 40,000-byte tensor (10,000 float32) from each.

``dataloader``: a DataLoader over 64 samples of 4x8 float32 in batches of 8, read once with two
``spawn`` workers and once with two ``fork`` workers, both persistent for two epochs; prints
the sum of everything read.
"""

import multiprocessing as mp
import sys

import torch


def train_and_keep(steps):
    w = torch.randn(64, 64, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=0.1)
    kept = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (w @ torch.randn(64, 64)).square().mean()
        loss.backward()
        optimizer.step()
        kept.append(torch.empty(10_000, dtype=torch.float32))  # the leak
    print(f"worker kept {len(kept)}", flush=True)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4, 8), float(i))


def read_all(context):
    loader = torch.utils.data.DataLoader(
        Samples(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,
    )
    total = 0.0
    for _ in range(2):
        for batch in loader:
            total += float(batch.sum())
    return total


if __name__ == "__main__":
    if sys.argv[1] == "spawn_leak":
        worker = mp.get_context("spawn").Process(target=train_and_keep, args=(6,))
        worker.start()
        worker.join()
        print(f"worker exit {worker.exitcode}")
    else:
        print(f"spawn {read_all('spawn'):.0f} fork {read_all('fork'):.0f}")
