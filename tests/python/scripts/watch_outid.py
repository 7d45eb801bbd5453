"""A list-returning start op for --watch=aten::split.Tensor:1,aten::mul_.Tensor: only the
second piece is watched; the op that follows writes the second piece in place."""

import torch

x = torch.arange(12.0)
parts = x.split(4)  # aten::split.Tensor: three views of x
parts[0].add_(1)  # aten::add_.Tensor: the first piece, not the watched one
parts[1].mul_(2)  # aten::mul_.Tensor: the watched piece; the range ends after it
parts[1].mul_(2)  # outside the range
