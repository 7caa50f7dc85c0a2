"""Candidate GPU kernels (numba.cuda) with references, input makers and size presets.

    from krex_lab import kernels
    spec = kernels.REGISTRY["softmax"]          # or kernels.get("softmax")
    spec.check("optimised")                     # krex_lab.check against the NumPy reference
    x, out = spec.device_inputs("1ms")[0] + spec.device_inputs("1ms")[1]
    krex_lab.bench(spec.candidates["optimised"], *inputs, *outputs)

Kernels: vector_add, reduction, softmax, transpose, matmul; each has a ``naive`` and an
``optimised`` candidate, a NumPy ``reference``, ``make_inputs`` / ``device_inputs`` and presets
``0.05ms``, ``0.1ms``, ``1ms``, ``10ms`` (sizes estimated to take about that long on an H200 for
the optimised candidate; the naive ones are slower by design). Everything runs under numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) at the small ``test_sizes``.

numba is imported on first use of a name below, not by ``from krex_lab import kernels``, and
``import krex_lab`` does not import this package at all. It lives inside ``krex_lab`` because a
published PyPI distribution (Hugging Face's ``kernels``) owns the top-level import name ``kernels``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["PRESETS", "REGISTRY", "KernelSpec", "get"]

if TYPE_CHECKING:
    from .registry import PRESETS, REGISTRY, get
    from .spec import KernelSpec


def __getattr__(name: str) -> Any:
    if name in ("REGISTRY", "PRESETS", "get"):
        from . import registry

        return getattr(registry, name)
    if name == "KernelSpec":
        from .spec import KernelSpec

        return KernelSpec
    raise AttributeError(f"module 'krex_lab.kernels' has no attribute {name!r}")
