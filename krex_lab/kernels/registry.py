"""Every kernel of the library by name."""

from __future__ import annotations

from . import matmul, reduction, softmax, transpose, vector_add
from .spec import KernelSpec

REGISTRY: dict[str, KernelSpec] = {m.SPEC.name: m.SPEC for m in (vector_add, reduction, softmax, transpose, matmul)}
PRESETS = ("0.05ms", "0.1ms", "1ms", "10ms")


def get(name: str) -> KernelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no kernel {name!r}; the library has {', '.join(REGISTRY)}") from None
