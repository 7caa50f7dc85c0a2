"""Row-wise softmax of a float32 matrix (Triton): one program per row, the row in registers."""

# No `from __future__ import annotations`: Triton reads the kernels' `tl.constexpr` annotations.
from typing import Any

import triton
import triton.language as tl

from agent_triton.tensors import on_gpu, to_host

WARPS = 4


@triton.jit
def softmax_kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    # @candidate@
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    total = tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride + offs, e / total, mask=mask)


def run(x: Any, y: Any) -> None:
    tx, ty = on_gpu(x), on_gpu(y)
    rows, cols = tx.shape
    block = triton.next_power_of_2(cols)
    softmax_kernel[(rows,)](tx, ty, cols, tx.stride(0), BLOCK=block, num_warps=WARPS)
    to_host(ty, y)
