"""Tests marked ``gpu`` run only where an NVIDIA GPU answers NVML; elsewhere they skip.

The probe runs once, and only when a collected test carries the marker, so CI (no GPU) pays
nothing for it.
"""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def nvidia_unusable() -> str | None:
    """Why no NVIDIA GPU can be used here, or None when one can."""
    try:
        from krex_lab.gpu.nvidia import NvidiaBackend

        backend = NvidiaBackend()
    except Exception as exc:  # ImportError, BackendError, anything NVML raises
        return f"no usable NVIDIA GPU: {exc}"
    backend.close()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        reason = nvidia_unusable()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
