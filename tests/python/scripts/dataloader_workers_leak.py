"""A DataLoader whose spawned workers keep a copy of every sample they read.

Two epochs over 768 samples in batches of 8 with two non-persistent ``spawn`` workers: each
epoch starts two fresh worker processes, four in all, and each of them appends a 4 KiB
``bytearray`` per sample it reads to the module-level list ``KEPT`` (the leak), so every worker
keeps 384 of them until it exits. Prints the sum of everything read.
"""

import torch

KEPT = []


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 768

    def __getitem__(self, i):
        KEPT.append(bytearray(4096))  # the leak
        return torch.full((4,), float(i))


def read_all():
    loader = torch.utils.data.DataLoader(
        Samples(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=False,
    )
    total = 0.0
    for _ in range(2):
        for batch in loader:
            total += float(batch.sum())
    return total


if __name__ == "__main__":
    print(f"sum {read_all():.0f}")
