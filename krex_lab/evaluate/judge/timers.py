"""Timing statistics, as both formats report them (µs per call): KernelBench's ``runtime_stats``
and GPU MODE's standard error; when a case has samples enough, and what its timing is called.
The timing itself happens in rounds (:mod:`.rounds`) and, for the reference, in
:mod:`.reference_time`."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from ..options import Options
from ..outcomes import SampleStats

__all__ = ["TimingError", "enough", "label", "stats"]


class TimingError(Exception):
    """The timed program failed while being timed (its message says how)."""


def stats(samples_us: list[float]) -> SampleStats:
    """KernelBench's runtime_stats (mean, std, min, max, num_trials) plus GPU MODE's err."""
    n = len(samples_us)
    mean = statistics.fmean(samples_us) if n else float("nan")
    std = statistics.stdev(samples_us) if n > 1 else 0.0
    return SampleStats(
        mean=round(mean, 4),
        std=round(std, 4),
        min=round(min(samples_us), 4) if n else float("nan"),
        max=round(max(samples_us), 4) if n else float("nan"),
        num_trials=n,
        err=round(std / math.sqrt(n), 4) if n > 1 else 0.0,
    )


def enough(samples: list[float], o: Options, fmt: str, started: float) -> bool:
    """Whether a case timed since ``started`` has its samples: a count (KernelBench), or a mean
    that settled, or its caps (GPU MODE, ``converge``)."""
    n = len(samples)
    if o.timing != "converge" and fmt != "gpumode":
        return n >= max(1, o.perf_trials)
    target = 0.001 if o.timing == "converge" else o.max_rel_err
    if n >= max(2, o.min_runs):
        mean = statistics.fmean(samples)
        err = statistics.stdev(samples) / math.sqrt(n)
        if mean > 0 and err / mean <= target:
            return True
    return n >= max(1, o.max_runs) or time.perf_counter() - started > o.max_case_s


def label(judge: Any) -> str:
    """What a judge's timing is called in the verdict (``timing_method``)."""
    if judge.opts.timing == "bench":  # the same rounds; named as asked
        return "bench" if judge.device == "cuda" else "bench-host-clock"
    fmt = "gpumode" if judge.job.format == "gpumode" else "kernelbench"
    return f"{fmt}-events" if judge.device == "cuda" else "host-clock"
