"""Matrix product ``c = a @ b`` in float32 (a: m x k, b: k x n): compute-bound, 2 m n k flops.

* naive: one thread per element of ``c``, each reading a row of ``a`` and a column of ``b``
  from global memory (the caches do what they can);
* optimised (tiled): a block computes a :data:`BM` x :data:`BM` tile of ``c``; per step of
  :data:`BK` it stages a tile of ``a`` (transposed, padded) and of ``b`` in shared memory, and
  each thread accumulates a :data:`TM` x :data:`TM` micro-tile in registers (``TM`` loads of
  each operand feed ``TM * TM`` multiply-adds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import float32

from .spec import SIMULATOR, TILED_MATMUL_FLOPS, KernelSpec, Work, cuda, device, write_back

TD = 4 if SIMULATOR else 16  # threads per block side
TM = 4  # outputs per thread per side
BM = TD * TM  # tile of c per block side
BK = 4 if SIMULATOR else 16  # depth of one shared-memory step
NT = TD * TD
BM_PAD = BM + 1
NAIVE = 8 if SIMULATOR else 16


@cuda.jit
def matmul_naive(a, b, c):  # type: ignore[no-untyped-def]
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0.0)
        for k in range(a.shape[1]):
            acc += a[row, k] * b[k, col]
        c[row, col] = acc


@cuda.jit
def matmul_tiled(a, b, c):  # type: ignore[no-untyped-def]
    a_tile = cuda.shared.array((BK, BM_PAD), float32)  # a_tile[kk, r] = a[row0 + r, k0 + kk]
    b_tile = cuda.shared.array((BK, BM), float32)  # b_tile[kk, q] = b[k0 + kk, col0 + q]
    acc = cuda.local.array((TM, TM), float32)
    a_frag = cuda.local.array(TM, float32)
    b_frag = cuda.local.array(TM, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * TD + tx
    row0 = cuda.blockIdx.y * BM
    col0 = cuda.blockIdx.x * BM
    m, kdim = a.shape
    n = b.shape[1]
    for i in range(TM):
        for j in range(TM):
            acc[i, j] = float32(0.0)
    for k0 in range(0, kdim, BK):
        q = tid
        while q < BM * BK:
            r, kk = q // BK, q % BK
            gr, gk = row0 + r, k0 + kk
            a_tile[kk, r] = a[gr, gk] if gr < m and gk < kdim else float32(0.0)
            q += NT
        q = tid
        while q < BK * BM:
            kk, cc = q // BM, q % BM
            gk, gc = k0 + kk, col0 + cc
            b_tile[kk, cc] = b[gk, gc] if gk < kdim and gc < n else float32(0.0)
            q += NT
        cuda.syncthreads()
        for kk in range(BK):
            for i in range(TM):
                a_frag[i] = a_tile[kk, ty + TD * i]
            for j in range(TM):
                b_frag[j] = b_tile[kk, tx + TD * j]
            for i in range(TM):
                for j in range(TM):
                    acc[i, j] += a_frag[i] * b_frag[j]
        cuda.syncthreads()
    for i in range(TM):
        for j in range(TM):
            r, cc = row0 + ty + TD * i, col0 + tx + TD * j
            if r < m and cc < n:
                c[r, cc] = acc[i, j]


def naive(a: Any, b: Any, c: Any) -> None:
    da, db, dc = device(a), device(b), device(c)
    m, n = dc.shape
    matmul_naive[(-(-n // NAIVE), -(-m // NAIVE)), (NAIVE, NAIVE)](da, db, dc)
    write_back(dc, c)


def optimised(a: Any, b: Any, c: Any) -> None:
    da, db, dc = device(a), device(b), device(c)
    m, n = dc.shape
    matmul_tiled[(-(-n // BM), -(-m // BM)), (TD, TD)](da, db, dc)
    write_back(dc, c)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def _shapes(m: int, k: int, n: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [(m, k), (k, n)], [(m, n)]


def _square(n: int) -> dict[str, int]:
    return {"m": n, "k": n, "n": n}


SPEC = KernelSpec(
    name="matmul",
    summary="c = a @ b in float32; compute-bound (2 m n k flops)",
    reference=reference,
    shapes=_shapes,
    candidates={"naive": naive, "optimised": optimised},
    presets={"0.05ms": _square(640), "0.1ms": _square(832), "1ms": _square(1792), "10ms": _square(3904)},
    test_sizes=({"m": 20, "k": 19, "n": 22}, {"m": 5, "k": 3, "n": 2}),
    work=lambda m, k, n: Work(bytes=4.0 * (m * k + k * n + m * n), flops=2.0 * m * n * k),
    rtol=1e-4,
    atol=1e-4,
    flops_rate=TILED_MATMUL_FLOPS,
)
