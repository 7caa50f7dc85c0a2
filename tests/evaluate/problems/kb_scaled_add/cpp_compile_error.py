"""A C++ kernel that does not compile (an undeclared name); pybind11 alone, as cpp_inline.py."""

from torch import nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
#include <pybind11/pybind11.h>
double scaled_add(double a, double b, double alpha) {
  return alpha * a + undeclared_tensor;
}
"""

ext = load_inline(
    "krex_test_scaled_add_broken",
    cpp_sources=SOURCE,
    functions=["scaled_add"],
    no_implicit_headers=True,
    with_pytorch_error_handling=False,
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return ext.scaled_add(a, b, self.alpha)
