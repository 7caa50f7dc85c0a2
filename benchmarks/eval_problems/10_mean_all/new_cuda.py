"""Mean of every element: per-block partial sums, then one block sums the partials."""

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

__global__ void partial_sums_kernel(const float* __restrict__ x, float* __restrict__ partial, int64_t n) {
    float acc = 0.f;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) acc += x[i];
    acc = block_reduce(acc, false);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void finish_mean_kernel(const float* __restrict__ partial, int count, float* __restrict__ out, double n) {
    float acc = 0.f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_reduce(acc, false);
    if (threadIdx.x == 0) out[0] = (float)(acc / n);
}

at::Tensor mean_all_cuda(at::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "mean_all_cuda: a float32 CUDA tensor");
    x = x.contiguous();
    int64_t n = x.numel();
    TORCH_CHECK(n > 0, "mean_all_cuda: an empty tensor has no mean");
    const int threads = 256;
    int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 1024);
    auto partial = at::empty({blocks}, x.options());
    auto out = at::empty({}, x.options());
    auto stream = c10::cuda::getCurrentCUDAStream();
    partial_sums_kernel<<<blocks, threads, 0, stream>>>(x.data_ptr<float>(), partial.data_ptr<float>(), n);
    finish_mean_kernel<<<1, 1024, 0, stream>>>(partial.data_ptr<float>(), blocks, out.data_ptr<float>(), (double)n);
    return out;
}

"""
CPP_SOURCE = "at::Tensor mean_all_cuda(at::Tensor x);"

_ext = load_inline(
    name="evalp_mean_all_cuda",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["mean_all_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.mean_all_cuda(x)
