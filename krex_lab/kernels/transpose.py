"""Transpose of a float32 matrix (rows x cols -> cols x rows): bandwidth-bound, 8 bytes per element.

* naive: one thread per element, reads along a row (coalesced) and writes down a column, so
  every warp's stores are ``rows`` floats apart;
* optimised: the classic shared-memory tile (:data:`TILE` x :data:`TILE`, one column of padding
  against bank conflicts): a block reads a tile row by row and writes it transposed, row by row,
  so both global reads and writes are coalesced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import float32

from .spec import SIMULATOR, KernelSpec, Work, cuda, device, write_back

TILE = 8 if SIMULATOR else 32
ROWS = 2 if SIMULATOR else 8  # block = TILE x ROWS threads, each handling TILE / ROWS elements
PADDED = TILE + 1


@cuda.jit
def transpose_naive(x, y):  # type: ignore[no-untyped-def]
    j, i = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        y[j, i] = x[i, j]


@cuda.jit
def transpose_tiled(x, y):  # type: ignore[no-untyped-def]
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col0 = cuda.blockIdx.x * TILE
    row0 = cuda.blockIdx.y * TILE
    rows, cols = x.shape
    k = ty
    while k < TILE:
        i, j = row0 + k, col0 + tx
        if i < rows and j < cols:
            tile[k, tx] = x[i, j]
        k += ROWS
    cuda.syncthreads()
    k = ty
    while k < TILE:
        i, j = col0 + k, row0 + tx  # y[i, j] = x[j, i]
        if i < cols and j < rows:
            y[i, j] = tile[tx, k]
        k += ROWS


def naive(x: Any, y: Any) -> None:
    dx, dy = device(x), device(y)
    rows, cols = dx.shape
    transpose_naive[(-(-cols // TILE), -(-rows // ROWS)), (TILE, ROWS)](dx, dy)
    write_back(dy, y)


def optimised(x: Any, y: Any) -> None:
    dx, dy = device(x), device(y)
    rows, cols = dx.shape
    transpose_tiled[(-(-cols // TILE), -(-rows // TILE)), (TILE, ROWS)](dx, dy)
    write_back(dy, y)


def reference(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T)


def _shapes(rows: int, cols: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [(rows, cols)], [(cols, rows)]


SPEC = KernelSpec(
    name="transpose",
    summary="out = x.T for a float32 matrix; bandwidth-bound (8 B per element)",
    reference=reference,
    shapes=_shapes,
    candidates={"naive": naive, "optimised": optimised},
    presets={
        "0.05ms": {"rows": 4832, "cols": 4832},
        "0.1ms": {"rows": 7008, "cols": 7008},
        "1ms": {"rows": 22_528, "cols": 22_528},
        "10ms": {"rows": 71_392, "cols": 71_392},
    },
    test_sizes=({"rows": 19, "cols": 13}, {"rows": 8, "cols": 3}),
    work=lambda rows, cols: Work(bytes=8.0 * rows * cols),
    rtol=0.0,
    atol=0.0,
)
