"""a + b + c as one numba.cuda kernel on torch's tensors (shared through __cuda_array_interface__, launched
on torch's current stream); without a GPU, numba's CUDA simulator runs it on the tensors' host memory."""

import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def _add3(a, b, c, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = a[i] + b[i] + c[i]


def launch(kernel, n, *tensors):
    blocks = (n + 255) // 256
    if tensors[0].is_cuda:
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        kernel[blocks, 256, stream](*(cuda.as_cuda_array(t.view(-1)) for t in tensors))
    else:
        kernel[blocks, 256](*(t.view(-1).numpy() for t in tensors))


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
        y = torch.empty_like(a)
        launch(_add3, y.numel(), a, b, c, y)
        return y
