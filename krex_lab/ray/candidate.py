"""What an agent sends (:class:`Candidate`) and what runs on the node's warm context worker.

This module imports neither Ray nor anything heavy: :func:`run_candidate` is pickled by reference
to the pool, and the context worker that unpickles it imports only this module.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from krex_lab.region_report import RegionReport


@dataclasses.dataclass
class Candidate:
    """One kernel to evaluate: ``fn(*args, **kwargs)`` timed ``repeat`` times inside a region.

    ``setup`` (optional, outside the region: compiling, building inputs) returns the ``args`` to
    use instead of ``args``. ``warmup`` calls run outside the region too. ``key``: the agent's own
    id for it (returned in the result). ``fn``, ``setup`` and the arguments must pickle
    (cloudpickle) and be importable on the nodes, or be defined in ``__main__`` / registered with
    ``cloudpickle.register_pickle_by_value``.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # the caller's: any names and values
    name: str = ""
    key: Any = None
    setup: Callable[[], tuple[Any, ...]] | None = None
    repeat: int = 3
    warmup: int = 0
    max_hold: float | None = None


@dataclasses.dataclass
class CandidateRun:
    """What :func:`run_candidate` measured on the context worker; the evaluation task
    (:func:`krex_lab.ray.fleet.evaluate_one`) makes the :class:`~krex_lab.ray.fleet.EvalResult`
    of it. ``times`` in seconds; ``value``: the last value's repr; ``region``: the region's report
    (None: the candidate failed before its region)."""

    worker_pid: int
    started_at: float
    ok: bool = False
    times: list[float] = dataclasses.field(default_factory=list)
    value: str | None = None
    error: str | None = None
    traceback: str | None = None
    region: RegionReport | None = None
    gpu: int | None = None
    finished_at: float | None = None


def run_candidate(candidate: Candidate) -> CandidateRun:
    """On the context worker: set up and warm up outside the region, time inside it.

    Returns the times (seconds), the last value's repr, the region's report and the GPU; an
    exception of the candidate's own is returned as ``error``/``traceback`` (``ok`` False). KREX's
    own failures (no arbiter, a revoked region) raise, so that the caller may retry elsewhere.
    """
    from krex_lab.client import exclusive

    out = CandidateRun(worker_pid=os.getpid(), started_at=time.time())
    try:
        args = candidate.setup() if candidate.setup is not None else candidate.args
        for _ in range(candidate.warmup):
            candidate.fn(*args, **candidate.kwargs)
    except Exception as exc:
        out.error, out.traceback = f"{type(exc).__name__}: {exc}", traceback.format_exc()
        return out
    times: list[float] = []
    value: Any = None
    failure: BaseException | None = None
    with exclusive(max_hold=candidate.max_hold) as region:
        try:
            for _ in range(candidate.repeat):
                t0 = time.perf_counter()
                value = candidate.fn(*args, **candidate.kwargs)
                times.append(time.perf_counter() - t0)
        except Exception as exc:  # the candidate's: reported, the region still ends cleanly
            failure = exc
            out.traceback = traceback.format_exc()
    out.ok, out.times = failure is None, times
    out.value = None if value is None else repr(value)[:200]
    out.region, out.gpu, out.finished_at = region.report, region.gpu, time.time()
    if failure is not None:
        out.error = f"{type(failure).__name__}: {failure}"
    return out


def simulated_kernel(gpu_seconds: float, cpu_seconds: float = 0.0) -> float:
    """A candidate for the fake backend: a simulated GPU phase (a sleep: the GPU works, the CPU
    waits) after ``cpu_seconds`` of real CPU work (launch overhead). Returns the seconds slept."""
    end = time.perf_counter() + cpu_seconds
    while time.perf_counter() < end:
        pass
    time.sleep(gpu_seconds)
    return gpu_seconds
