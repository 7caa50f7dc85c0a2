"""Sum of a float32 vector into one float32: bandwidth-bound, 4 bytes per element.

* naive: the first kernel of Mark Harris' "Optimizing Parallel Reduction": one element per
  thread, a shared-memory tree with interleaved addressing (``t % (2 s) == 0``: divergent warps,
  bank conflicts), one atomic add per block;
* optimised: a grid-stride loop accumulates many elements per thread in a register, then a
  sequential-addressing shared-memory tree and one atomic add per block (no warp shuffles, so
  the same code runs in numba's simulator).

Both zero the output first (a one-thread kernel on the same stream): the NaN that
``krex_lab.check`` puts there catches a candidate that forgets to.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import float32, int64

from .spec import THREADS, KernelSpec, Work, blocks, cuda, device, sm_count, write_back


@cuda.jit
def zero_first(out):  # type: ignore[no-untyped-def]
    if cuda.grid(1) == 0:
        out[0] = float32(0.0)


@cuda.jit
def reduce_interleaved(x, out):  # type: ignore[no-untyped-def]
    partial = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = int64(cuda.blockIdx.x) * THREADS + t
    partial[t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()
    s = 1
    while s < THREADS:
        if t % (2 * s) == 0:
            partial[t] += partial[t + s]
        cuda.syncthreads()
        s *= 2
    if t == 0:
        cuda.atomic.add(out, 0, partial[0])


@cuda.jit
def reduce_grid_stride(x, out):  # type: ignore[no-untyped-def]
    partial = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = int64(cuda.blockIdx.x) * THREADS + t
    stride = int64(cuda.gridDim.x) * THREADS
    acc = float32(0.0)
    while i < x.size:
        acc += x[i]
        i += stride
    partial[t] = acc
    cuda.syncthreads()
    s = THREADS // 2
    while s > 0:
        if t < s:
            partial[t] += partial[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        cuda.atomic.add(out, 0, partial[0])


def naive(x: Any, out: Any) -> None:
    dx, dout = device(x), device(out)
    zero_first[1, 1](dout)
    reduce_interleaved[blocks(dx.size), THREADS](dx, dout)
    write_back(dout, out)


def optimised(x: Any, out: Any) -> None:
    dx, dout = device(x), device(out)
    zero_first[1, 1](dout)
    reduce_grid_stride[blocks(dx.size, THREADS, sm_count() * 8), THREADS](dx, dout)
    write_back(dout, out)


def reference(x: np.ndarray) -> np.ndarray:
    return np.array([x.astype(np.float64).sum()], dtype=np.float32)


def _shapes(n: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [(n,)], [(1,)]


SPEC = KernelSpec(
    name="reduction",
    summary="sum of a float32 vector; bandwidth-bound (4 B per element)",
    reference=reference,
    shapes=_shapes,
    candidates={"naive": naive, "optimised": optimised},
    presets={"0.05ms": {"n": 45 << 20}, "0.1ms": {"n": 93 << 20}, "1ms": {"n": 969 << 20}, "10ms": {"n": 9724 << 20}},
    test_sizes=({"n": 300}, {"n": 33}),
    work=lambda n: Work(bytes=4.0 * n),
    rtol=1e-4,
    atol=1e-3,
    low=0.0,
)
