"""A numba kernel with a planted off-by-one (imported after tests.numba_sim.use_simulator())."""

from __future__ import annotations

from typing import Any

from numba import cuda


@cuda.jit
def add_skips_last(a, b, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size - 1:  # planted: the last element is never written
        out[i] = a[i] + b[i]


def candidate(a: Any, b: Any, out: Any) -> None:
    add_skips_last[2, 32](a, b, out)
