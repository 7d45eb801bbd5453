"""A small training loop with a 2-worker DataLoader: an MLP on random data, SGD, 3 epochs of 40
batches of 64. Workloads for bench/python_host_leaks.py --jobs."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2560, 128), torch.randint(0, 10, (2560,)))
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
