"""Vector add ``c = a + b`` (float32): bandwidth-bound, 12 bytes per element.

* naive: each thread adds a contiguous chunk of :data:`CHUNK` elements, so neighbouring threads
  touch addresses ``CHUNK`` floats apart and no load is coalesced;
* optimised: a grid-stride loop; neighbouring threads read neighbouring floats (coalesced), and
  a capped grid keeps every SM busy without launching a block per 256 elements.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import int64

from .spec import THREADS, KernelSpec, Work, blocks, cuda, device, sm_count, write_back

CHUNK = 8


@cuda.jit
def add_chunked(a, b, c):  # type: ignore[no-untyped-def]
    start = int64(cuda.grid(1)) * CHUNK
    for k in range(CHUNK):
        i = start + k
        if i < c.size:
            c[i] = a[i] + b[i]


@cuda.jit
def add_grid_stride(a, b, c):  # type: ignore[no-untyped-def]
    i = int64(cuda.grid(1))
    stride = int64(cuda.gridsize(1))
    while i < c.size:
        c[i] = a[i] + b[i]
        i += stride


def naive(a: Any, b: Any, c: Any) -> None:
    da, db, dc = device(a), device(b), device(c)
    add_chunked[blocks(-(-dc.size // CHUNK)), THREADS](da, db, dc)
    write_back(dc, c)


def optimised(a: Any, b: Any, c: Any) -> None:
    da, db, dc = device(a), device(b), device(c)
    add_grid_stride[blocks(dc.size, THREADS, sm_count() * 16), THREADS](da, db, dc)
    write_back(dc, c)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def _shapes(n: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [(n,), (n,)], [(n,)]


SPEC = KernelSpec(
    name="vector_add",
    summary="c = a + b, float32; bandwidth-bound (12 B per element)",
    reference=reference,
    shapes=_shapes,
    candidates={"naive": naive, "optimised": optimised},
    presets={"0.05ms": {"n": 15 << 20}, "0.1ms": {"n": 31 << 20}, "1ms": {"n": 323 << 20}, "10ms": {"n": 3241 << 20}},
    test_sizes=({"n": 1000}, {"n": 37}),
    work=lambda n: Work(bytes=12.0 * n),
)
