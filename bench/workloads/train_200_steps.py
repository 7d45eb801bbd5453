"""A 200-step training loop on CPU, in-process data: an MLP on random batches of 64, SGD.
Workload of bench/host_leak_sampling.py (import torch is part of it, as in any real job)."""

import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(200):
        x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
