"""Square matmul as torch.mm on contiguous operands."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.mm(a.contiguous(), b.contiguous())
