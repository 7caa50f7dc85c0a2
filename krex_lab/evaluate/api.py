"""``krex_lab.evaluate(reference, candidate)``: the one call that gives a candidate its verdict."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .options import Cases, EvaluateOptions, Phase
from .progress import Progress
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
    max_case_s: float | None = None,
    retime_reference: bool = False,
    time_reference: bool = True,
    timeouts: Mapping[Phase, float] | None = None,
    memory_limit_mb: int | None = None,
    output_limit_mb: int | None = None,
    disk_limit_mb: int | None = None,
    exclusive: bool = True,
    memory_budget_mb: int | None = None,
    options: EvaluateOptions | None = None,
    pool: PoolClient | None = None,
    progress: Progress | None = None,
) -> Evaluation:
    """Compile, check and time ``candidate`` against ``reference`` on a warm context worker.

        ``reference`` and ``candidate`` are file paths or source text; the reference may also be a
        published GPU MODE problem: its directory, or a file beside its ``task.yml`` (its files laid
        out beside the submission, its cases, its time limit per mode). ``format``: ``auto`` (told by
        the names the files define), ``kernelbench`` or ``gpumode``. ``gpu``: the GPU (default: the
        pool picks). ``timing``: ``format`` (the format's own method) or ``bench``
        (:func:`krex_lab.bench`'s) or ``converge`` (GPU MODE's, until the mean's relative standard
        error is 0.1 % or ``max_case_s`` seconds pass per case); ``measure=False`` checks only.
        ``trials``: correctness trials (KernelBench: 5); ``perf_trials``: KernelBench's timed calls
        (100). ``max_case_s``: GPU MODE's timing seconds per case at most (10). GPU MODE: ``mode``
        (``test``, ``benchmark``, ``leaderboard``), ``tests`` / ``benchmarks`` (a file of
        ``key: value; key: value`` lines, that text, or a list of dicts or lines; default: the
        reference's ``TESTS`` / ``BENCHMARKS``, else ``tests.txt`` / ``benchmarks.txt`` beside it).
        ``atol`` / ``rtol``: default by the output's precision. ``seed``: the inputs' seed (None: a
        secret one, said in the result); ``strict``: re-check every timed call's output. ``retime_reference``: time the
        reference again even when its time is cached for this GPU model and method;
        ``time_reference=False``: no reference time, no speedup. ``timeouts``: seconds per phase
        (``load``, ``check``, ``time``). ``memory_limit_mb``: host memory the candidate may add;
        ``output_limit_mb``: what it may print per phase; ``disk_limit_mb``: the disk it may use
        (its build directory; 4096). ``exclusive=False`` times without a
        region (the result says so). ``memory_budget_mb``: GPU memory the timed rounds' input sets
        may take (default 512 MiB; :func:`evaluate_many` and ``krex eval --batch`` size it to the
        memory free when they admit the evaluation). ``options``: these options as one
    :class:`~.options.EvaluateOptions` (a keyword given besides, other than its default, replaces its
    value). ``pool``: a :class:`~krex_lab.workers.client.PoolClient`
        (default: this user's, started on demand). ``progress``: called with ``(phase, detail)`` as
        the evaluation moves (``queued``, ``load``, ``check``, ``time``, ``done``; :mod:`.progress`).

        Returns an :class:`Evaluation` whatever the candidate does (compile error, crash, hang,
        cheat: each is a verdict). Raises only for a bad call: a missing file, an unknown format or
        option, a reference that is not of the format (ValueError, FileNotFoundError), or no pool
        (:class:`~krex_lab.errors.PoolUnavailable`).
    """
    from .job import build_job
    from .options import OPTION_DEFAULTS
    from .orchestrate import run_job
    from .progress import phase_started, reporting

    keywords = {k: v for k, v in locals().items() if k in EvaluateOptions.__struct_fields__}
    if options is None:
        checked = EvaluateOptions.of(keywords)
    else:
        checked = options.merged({k: v for k, v in keywords.items() if v != OPTION_DEFAULTS[k]})
    job = build_job(reference, candidate, checked)
    with reporting(progress):
        phase_started("queued", job.task.path if job.task is not None else job.reference.label)
        ev = run_job(job, gpu=checked.gpu, pool=pool)
        phase_started("done", ev.summary)
    return ev
