"""RMSNorm: one block per row, the mean of squares reduced in the block, then scaled by the weight."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
// only the headers this code uses: ATen/ATen.h would take most of the compile time
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>

// sum (or max) of one value per thread over the block; every thread gets the result
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float partial[32];
    __shared__ float result;
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_down_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int warps = (blockDim.x + 31) >> 5;
        v = lane < warps ? partial[lane] : (is_max ? -INFINITY : 0.f);
        for (int o = 16; o > 0; o >>= 1) {
            float other = __shfl_down_sync(0xffffffff, v, o);
            v = is_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) result = v;
    }
    __syncthreads();
    float out = result;
    __syncthreads();  // result and partial are reused by the next call
    return out;
}

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int64_t cols, float eps) {
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* out = y + (int64_t)blockIdx.x * cols;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += row[j] * row[j];
    ss = block_reduce(ss, false);
    float inv = rsqrtf(ss / (float)cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = row[j] * inv * w[j];
}

at::Tensor rmsnorm_cuda(at::Tensor x, at::Tensor w, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "rmsnorm_cuda: a float32 CUDA tensor");
    TORCH_CHECK(w.numel() == x.size(-1), "rmsnorm_cuda: one weight per column");
    x = x.contiguous();
    w = w.contiguous();
    auto y = at::empty_like(x);
    int64_t cols = x.size(-1), rows = x.numel() / cols;
    if (rows == 0) return y;
    rmsnorm_kernel<<<(unsigned)rows, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), cols, (float)eps);
    return y;
}

"""
CPP_SOURCE = "at::Tensor rmsnorm_cuda(at::Tensor x, at::Tensor w, double eps);"

_ext = load_inline(
    name="evalp_rmsnorm_cuda",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["rmsnorm_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        return _ext.rmsnorm_cuda(x, self.weight, self.eps)
