"""Long-K matmul split in two halves of K whose products are summed."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        k = a.shape[1] // 2
        return torch.addmm(a[:, :k] @ b[:k], a[:, k:], b[k:])
