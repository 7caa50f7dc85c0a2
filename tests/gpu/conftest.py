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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A failure's whole report written the moment it happens, under ``$KREX_GPU_DIAG/failures/``
    when that is set: a device call cut by its time limit loses pytest's summary at the end, and
    with it every reason a test failed."""
    import os
    import re

    root = os.environ.get("KREX_GPU_DIAG")
    if not root or not report.failed:
        return
    folder = os.path.join(root, "failures")
    os.makedirs(folder, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", report.nodeid)[-150:]
    with open(os.path.join(folder, f"{name}.{report.when}.txt"), "w") as f:
        f.write(f"{report.nodeid} ({report.when}, {report.duration:.1f} s)\n\n{report.longreprtext}\n")
        for title, text in report.sections:
            f.write(f"\n--- {title} ---\n{text[-20000:]}\n")
