"""Column maxima as a max over the transposed view's rows."""

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.t().max(dim=1).values
