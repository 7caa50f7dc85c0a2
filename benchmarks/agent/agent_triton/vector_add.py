"""c = a + b in float32 (Triton): one program per BLOCK elements, masked at the end."""

# No `from __future__ import annotations`: Triton reads the kernels' `tl.constexpr` annotations.
from typing import Any

import triton
import triton.language as tl

from agent_triton.tensors import on_gpu, to_host

BLOCK = 2048
WARPS = 4


@triton.jit
def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    # @candidate@
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(c_ptr + offs, a + b, mask=mask)


def run(a: Any, b: Any, c: Any) -> None:
    ta, tb, tc = on_gpu(a), on_gpu(b), on_gpu(c)
    n = tc.numel()
    add_kernel[(triton.cdiv(n, BLOCK),)](ta, tb, tc, n, BLOCK=BLOCK, num_warps=WARPS)
    to_host(tc, c)
