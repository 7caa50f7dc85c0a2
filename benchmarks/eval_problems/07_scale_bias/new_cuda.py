"""x * alpha + beta as one fused multiply-add per element."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
// only the headers this code uses: ATen/ATen.h would take most of the compile time
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>

__global__ void scale_bias_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                  float alpha, float beta) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = fmaf(v, alpha, beta);
    }
}

at::Tensor scale_bias_cuda(at::Tensor x, double alpha, double beta) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "scale_bias_cuda: a float32 CUDA tensor");
    x = x.contiguous();
    auto y = at::empty_like(x);
    int64_t n = x.numel();
    if (n == 0) return y;
    const int threads = 256;
    int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 132 * 32);
    scale_bias_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, (float)alpha, (float)beta);
    return y;
}

"""
CPP_SOURCE = "at::Tensor scale_bias_cuda(at::Tensor x, double alpha, double beta);"

_ext = load_inline(
    name="evalp_scale_bias_cuda",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["scale_bias_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, alpha, beta):
        super().__init__()
        self.alpha, self.beta = float(alpha), float(beta)

    def forward(self, x):
        return _ext.scale_bias_cuda(x, self.alpha, self.beta)
