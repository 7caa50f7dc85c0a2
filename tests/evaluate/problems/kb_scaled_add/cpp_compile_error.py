"""A C++ kernel that does not compile (an undeclared name)."""

from torch import nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
#include <torch/extension.h>
torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double alpha) {
  return alpha * a + undeclared_tensor;
}
"""

ext = load_inline("krex_test_scaled_add_broken", cpp_sources=SOURCE, functions=["scaled_add"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return ext.scaled_add(a, b, self.alpha)
