"""c = a @ b in float32 (Triton): a program per BM x BN tile of c, BK deep steps through
``tl.dot`` in IEEE float32 (no TF32: the check compares with a float64 product)."""

# No `from __future__ import annotations`: Triton reads the kernels' `tl.constexpr` annotations.
from typing import Any

import triton
import triton.language as tl

from agent_triton.tensors import on_gpu, to_host

BM = 64
BN = 64
BK = 32
WARPS = 4


@triton.jit
def matmul_kernel(  # type: ignore[no-untyped-def]
    a_ptr, b_ptr, c_ptr, m, n, kdim, sam, sak, sbk, sbn, scm, scn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # @candidate@
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, kdim, BK):
        ka = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * sam + ka[None, :] * sak, mask=(rm[:, None] < m) & (ka[None, :] < kdim))
        b = tl.load(b_ptr + ka[:, None] * sbk + rn[None, :] * sbn, mask=(ka[:, None] < kdim) & (rn[None, :] < n))
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < m) & (rn[None, :] < n))


def run(a: Any, b: Any, c: Any) -> None:
    ta, tb, tc = on_gpu(a), on_gpu(b), on_gpu(c)
    m, n = tc.shape
    kdim = ta.shape[1]
    grid = (triton.cdiv(m, BM), triton.cdiv(n, BN))
    matmul_kernel[grid](
        ta, tb, tc, m, n, kdim, ta.stride(0), ta.stride(1), tb.stride(0), tb.stride(1), tc.stride(0), tc.stride(1),
        BM=BM, BN=BN, BK=BK, num_warps=WARPS,
    )  # fmt: skip
    to_host(tc, c)
