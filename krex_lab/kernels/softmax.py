"""Row-wise softmax of a float32 matrix (rows x cols), numerically stable.

* naive: one thread per row, three sequential passes over its row (max, sum of exponentials,
  write): few threads, and a warp's loads are ``cols`` floats apart (uncoalesced);
* optimised: one block per row; each thread keeps an online (max, sum) pair over a strided slice
  of the row (one pass to read), the block combines the pairs in shared memory, then a second,
  coalesced pass writes ``exp(x - max) / sum``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import float32

from .spec import THREADS, KernelSpec, Work, blocks, cuda, device, write_back

NEG_INF = np.float32(-np.inf)


@cuda.jit
def softmax_row_per_thread(x, y):  # type: ignore[no-untyped-def]
    r = cuda.grid(1)
    if r < x.shape[0]:
        m = NEG_INF
        for j in range(x.shape[1]):
            m = max(m, x[r, j])
        s = float32(0.0)
        for j in range(x.shape[1]):
            s += math.exp(x[r, j] - m)
        inv = float32(1.0) / s
        for j in range(x.shape[1]):
            y[r, j] = math.exp(x[r, j] - m) * inv


@cuda.jit
def softmax_block_per_row(x, y):  # type: ignore[no-untyped-def]
    best = cuda.shared.array(THREADS, float32)
    total = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    row = cuda.blockIdx.x
    cols = x.shape[1]
    m = NEG_INF
    s = float32(0.0)
    j = t
    while j < cols:  # online softmax: rescale the running sum when a new maximum appears
        v = x[row, j]
        if v > m:
            s = s * math.exp(m - v) + float32(1.0)
            m = v
        else:
            s += math.exp(v - m)
        j += THREADS
    best[t] = m
    total[t] = s
    cuda.syncthreads()
    k = THREADS // 2
    while k > 0:
        if t < k:
            m1, m2 = best[t], best[t + k]
            mm = max(m1, m2)
            if mm == NEG_INF:  # both halves empty (a row shorter than the block)
                total[t] = float32(0.0)
            else:
                total[t] = total[t] * math.exp(m1 - mm) + total[t + k] * math.exp(m2 - mm)
            best[t] = mm
        cuda.syncthreads()
        k //= 2
    m = best[0]
    inv = float32(1.0) / total[0]
    j = t
    while j < cols:
        y[row, j] = math.exp(x[row, j] - m) * inv
        j += THREADS


def naive(x: Any, y: Any) -> None:
    dx, dy = device(x), device(y)
    softmax_row_per_thread[blocks(dx.shape[0]), THREADS](dx, dy)
    write_back(dy, y)


def optimised(x: Any, y: Any) -> None:
    dx, dy = device(x), device(y)
    softmax_block_per_row[dx.shape[0], THREADS](dx, dy)
    write_back(dy, y)


def reference(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def _shapes(rows: int, cols: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [(rows, cols)], [(rows, cols)]


SPEC = KernelSpec(
    name="softmax",
    summary="row-wise softmax of a float32 matrix; bandwidth-bound (8 B per element: read once, write once)",
    reference=reference,
    shapes=_shapes,
    candidates={"naive": naive, "optimised": optimised},
    presets={
        "0.05ms": {"rows": 5728, "cols": 4096},
        "0.1ms": {"rows": 11_968, "cols": 4096},
        "1ms": {"rows": 124_000, "cols": 4096},
        "10ms": {"rows": 1_244_608, "cols": 4096},
    },
    test_sizes=({"rows": 5, "cols": 70}, {"rows": 3, "cols": 9}),
    work=lambda rows, cols: Work(bytes=8.0 * rows * cols),
    rtol=1e-4,
    atol=1e-6,
    low=-4.0,
    high=4.0,
)
