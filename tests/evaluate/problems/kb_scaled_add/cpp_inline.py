"""A C++ kernel built with torch.utils.cpp_extension.load_inline (the CPU twin of a CUDA candidate).

It includes pybind11 alone, not ``torch/extension.h``: what the evaluator handles (a build in the
candidate's own directory, found again the next time) is the same, and the build costs seconds of
CPU instead of minutes. The tensors reach the kernel as their data pointers."""

import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
#include <pybind11/pybind11.h>
#include <cstdint>
void scaled_add(std::uintptr_t a, std::uintptr_t b, std::uintptr_t out, std::int64_t n, double alpha) {
  const float* pa = reinterpret_cast<const float*>(a);
  const float* pb = reinterpret_cast<const float*>(b);
  float* po = reinterpret_cast<float*>(out);
  for (std::int64_t i = 0; i < n; ++i) po[i] = static_cast<float>(alpha) * pa[i] + pb[i];
}
"""

ext = load_inline(
    "krex_test_scaled_add",
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

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ac, bc = a.contiguous().float(), b.contiguous().float()
        out = torch.empty_like(ac)
        ext.scaled_add(ac.data_ptr(), bc.data_ptr(), out.data_ptr(), ac.numel(), self.alpha)
        return out
