"""The measurement harness: ``krex_lab.bench`` (timing you can trust) and ``krex_lab.check`` (correctness).

    import krex_lab
    m = krex_lab.bench(my_kernel, x, out)      # a Measurement: median, p5, p95, noise, region report…
    krex_lab.check(my_kernel, numpy_reference, make_inputs, rtol=1e-5, atol=1e-6)
    krex_lab.bench.compare(naive, m)           # side by side, speed-ups against the first

Modules: :mod:`.stats` (statistics, nvbench's stopping rule; pure), :mod:`.throttle` (NVML clocks),
:mod:`.frameworks` (torch / CuPy / numba.cuda / host adapters), :mod:`.timing` (samplers, the
collection loop), :mod:`.measurement` (``Measurement``, ``compare``), :mod:`.api` (``bench``),
:mod:`.correctness` (``check``). Importing this package imports no numpy and no GPU library.

Once imported, ``krex_lab.bench`` is this package (Python sets the attribute), so the package is
callable: ``krex_lab.bench(fn, *args)`` is :func:`~krex_lab.bench.api.bench` either way.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .api import bench
from .correctness import CheckFailed, CheckResult, check
from .measurement import Comparison, Measurement, compare
from .stats import Criterion

__all__ = ["CheckFailed", "CheckResult", "Comparison", "Criterion", "Measurement", "bench", "check", "compare"]


class _CallableModule(types.ModuleType):
    def __call__(self, fn: Any, *args: Any, **options: Any) -> Measurement:
        return bench(fn, *args, **options)


sys.modules[__name__].__class__ = _CallableModule
