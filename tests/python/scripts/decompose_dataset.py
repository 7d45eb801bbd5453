"""A training loop over a module-level dataset, marking no steps (optimizer.step() ends them):
the dataset's tensor (600 x 256 float32, 614400 bytes) and a module-level lookup table (1000
float32, 4000 bytes) are made before the first step and live throughout. Prints
``DATA <ptr> <bytes>`` and ``TABLE <ptr> <bytes>`` for the test to find their blocks."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
dataset = TensorDataset(torch.randn(600, 256))
TABLE = torch.linspace(0.0, 1.0, 1000)
loader = DataLoader(dataset, batch_size=100, shuffle=False)
model = nn.Sequential(nn.Linear(256, 32), nn.ReLU(), nn.Linear(32, 256))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for (x,) in loader:
    loss = (model(x) + TABLE[:256]).sub(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

for name, t in (("DATA", dataset.tensors[0]), ("TABLE", TABLE)):
    st = t.untyped_storage()
    print(name, st.data_ptr(), st.nbytes())
