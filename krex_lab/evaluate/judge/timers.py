"""Timing statistics, as both formats report them (µs per call): KernelBench's ``runtime_stats``
and GPU MODE's standard error. The timing itself happens in rounds (:mod:`.rounds`)."""

from __future__ import annotations

import math
import statistics

from ..outcomes import SampleStats

__all__ = ["TimingError", "stats"]


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
