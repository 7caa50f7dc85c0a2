"""``krex_lab.evaluate(reference, candidate)``: the one call that gives a candidate its verdict."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .options import Cases
from .result import Evaluation

if TYPE_CHECKING:
    from ..workers.client import PoolClient

__all__ = ["evaluate"]

PathOrSource = str | os.PathLike[str]


def evaluate(
    reference: PathOrSource,
    candidate: PathOrSource,
    *,
    format: str = "auto",
    gpu: int | None = None,
    timing: str = "format",
    measure: bool = True,
    trials: int | None = None,
    perf_trials: int | None = None,
    mode: str = "benchmark",
    tests: Cases | None = None,
    benchmarks: Cases | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int | None = None,
    strict: bool = False,
    retime_reference: bool = False,
    time_reference: bool = True,
    timeouts: Mapping[str, float] | None = None,
    memory_limit_mb: int | None = None,
    output_limit_mb: int | None = None,
    exclusive: bool = True,
    pool: PoolClient | None = None,
) -> Evaluation:
    """Compile, check and time ``candidate`` against ``reference`` on a warm context worker.

    ``reference`` and ``candidate`` are file paths or source text. ``format``: ``auto`` (told by
    the names the files define), ``kernelbench`` or ``gpumode``. ``gpu``: the GPU (default: the
    pool picks). ``timing``: ``format`` (the format's own method) or ``bench``
    (:func:`krex_lab.bench`'s); ``measure=False`` checks only. ``trials``: correctness trials
    (KernelBench: 5); ``perf_trials``: KernelBench's timed calls (100). GPU MODE: ``mode``
    (``test``, ``benchmark``, ``leaderboard``), ``tests`` / ``benchmarks`` (a file of
    ``key: value; key: value`` lines, that text, or a list of dicts or lines; default: the
    reference's ``TESTS`` / ``BENCHMARKS``, else ``tests.txt`` / ``benchmarks.txt`` beside it).
    ``atol`` / ``rtol``: default by the output's precision. ``seed``: the inputs' seed (None: a
    secret one, said in the result); ``strict``: re-check every timed call's output. ``retime_reference``: time the
    reference again even when its time is cached for this GPU model and method;
    ``time_reference=False``: no reference time, no speedup. ``timeouts``: seconds per phase
    (``load``, ``check``, ``time``). ``memory_limit_mb``: host memory the candidate may add;
    ``output_limit_mb``: what it may print per phase. ``exclusive=False`` times without a
    region (the result says so). ``pool``: a :class:`~krex_lab.workers.client.PoolClient`
    (default: this user's, started on demand).

    Returns an :class:`Evaluation` whatever the candidate does (compile error, crash, hang,
    cheat: each is a verdict). Raises only for a bad call: a missing file, an unknown format or
    option, a reference that is not of the format (ValueError, FileNotFoundError), or no pool
    (:class:`~krex_lab.errors.PoolUnavailable`).
    """
    from .orchestrate import build_job, run_job

    job = build_job(
        reference,
        candidate,
        format=format,
        timing=timing,
        measure=measure,
        trials=trials,
        perf_trials=perf_trials,
        mode=mode,
        tests=tests,
        benchmarks=benchmarks,
        atol=atol,
        rtol=rtol,
        seed=seed,
        strict=strict,
        retime_reference=retime_reference,
        time_reference=time_reference,
        timeouts=timeouts,
        memory_limit_mb=memory_limit_mb,
        output_limit_mb=output_limit_mb,
        exclusive=exclusive,
    )
    return run_job(job, gpu=gpu, pool=pool)
