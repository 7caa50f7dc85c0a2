"""What the judge (the evaluation's pool job) hands back to the client side, as typed structs.

:mod:`.judge.session` and :mod:`.judge.rounds` make them (one per phase, in one
:class:`PhaseResults`), the problems (:mod:`.judge.problems`) make the :class:`CheckOutcome` that
the check phase reads, and :mod:`.orchestrate` reads them to judge the
candidate. They travel as msgpack (:func:`encode` on the worker, :func:`decode` on the client), so
the client imports nothing of the worker side. :mod:`.cache` keeps :class:`ReferenceTime` entries
on disk under a :class:`ReferenceKey`. This module imports msgspec alone.
"""

from __future__ import annotations

import msgspec

from ..region_report import RegionReport
from .result import CaseResult, Reproducibility, TimingCheck, TimingStats
from .task import Case

__all__ = [
    "CheckOutcome",
    "CheckResult",
    "LoadResult",
    "PhaseResult",
    "PhaseResults",
    "ReferenceEntry",
    "ReferenceKey",
    "ReferenceTime",
    "SampleStats",
    "TimeResult",
    "TimedCase",
    "decode",
    "encode",
]


class SampleStats(TimingStats, kw_only=True):
    """:class:`~.result.TimingStats` of a list of samples (µs) plus GPU MODE's ``err`` (the
    standard error of the mean); made by :func:`krex_lab.evaluate.judge.timers.stats`."""

    err: float = 0.0


#: a phase's findings by name: messages, KernelBench's differences per output, the cheats found
Metadata = dict[str, str | list[float] | dict[str, str]]


class PhaseResult(msgspec.Struct, kw_only=True):
    """What every phase gives: ``verdict`` (None: go on), ``metadata`` (errors by name, merged
    into :attr:`Evaluation.metadata <krex_lab.evaluate.result.Evaluation.metadata>`),
    ``seconds`` the phase took, what the candidate printed (``output``, head and tail) and how
    much (``output_bytes``)."""

    verdict: str | None = None
    metadata: Metadata = {}
    seconds: float = 0.0
    output: str = ""
    output_bytes: int = 0

    def fail(self, verdict: str, key: str, message: str) -> None:
        """The candidate's (or the evaluation's) failure: ``verdict``, and ``message`` under ``key``."""
        self.verdict = verdict
        self.metadata[key] = message


class LoadResult(PhaseResult, kw_only=True):
    """The load phase: what ran it (``device``, the GPU's model or the host's CPU), whether a GPU
    is timed, and whether the candidate compiled."""

    device: str
    gpu_timed: bool
    compiled: bool = False


class CheckResult(PhaseResult, kw_only=True):
    """The check phase: GPU MODE's cases as checked (KernelBench: none)."""

    cases: list[CaseResult] = []


class ReferenceTime(msgspec.Struct, kw_only=True):
    """The reference's time on one case, and the region it was timed in (kept in the cache)."""

    method: str
    stats: SampleStats
    region: RegionReport | None = None


class TimedCase(msgspec.Struct, kw_only=True):
    """One timed case: the candidate's samples' statistics by ``method``, the region's report
    (None: timed without one, ``notice`` says why), the device-wide check and the reference's time
    (timed now or read from the cache; None: not timed)."""

    case: str | None
    method: str
    stats: SampleStats
    region: RegionReport | None = None
    notice: str | None = None
    timing_check: TimingCheck | None = None
    reference: ReferenceTime | None = None


class TimeResult(PhaseResult, kw_only=True):
    """The time phase: each timed case, and when the reference's time was measured (now, or when
    the cached figure was)."""

    parts: list[TimedCase] = []
    reference_timed_at: str | None = None
    reference_cached: bool = False


class PhaseResults(msgspec.Struct, kw_only=True):
    """Every phase of one evaluation, as far as the candidate got."""

    load: LoadResult
    check: CheckResult | None = None
    time: TimeResult | None = None
    #: :func:`krex_lab.evaluate.judge.record.collect`'s record, made by the judge as it starts
    reproducibility: Reproducibility | None = None


class CheckOutcome(msgspec.Struct, kw_only=True):
    """A format's correctness answer (``KernelBench.check``, ``GpuMode.check``), read by the check
    phase: ``correct``; ``rejected`` names a cheat (empty: none); ``trials`` passed of run
    (``"(5 / 5)"``); ``issue``: what differs; KernelBench's differences per output (empty: not
    compared); GPU MODE's ``cases``. The check phase puts them in the metadata under
    KernelBench's names (``correctness_trials``, ``correctness_issue``, ``max_difference``, ...)."""

    correct: bool
    trials: str
    rejected: dict[str, str] = {}
    issue: str = ""
    max_difference: list[float] | None = None
    avg_difference: list[float] | None = None
    cases: list[CaseResult] = []


class ReferenceKey(msgspec.Struct, kw_only=True):
    """What a reference's time depends on: the problem, the GPU model, the method and its
    settings. Made by the time phase; :func:`krex_lab.evaluate.cache.reference_key` hashes it."""

    reference: str
    format: str
    device: str
    timing: str
    settings: list[float]
    seed: int
    #: GPU MODE's benchmark cases: the arguments of ``generate_input``, as the user wrote them
    benchmarks: list[Case]
    mode: str
    exclusive: bool


class ReferenceEntry(msgspec.Struct, kw_only=True):
    """A cached reference time: per case (its spec; ``"None"`` for KernelBench's one case), when
    it was measured, on what, under which key. Written and read by :mod:`.cache`."""

    parts: dict[str, ReferenceTime | None]
    timed_at: str
    device: str
    key: ReferenceKey


_decoder = msgspec.msgpack.Decoder(PhaseResults)


def encode(results: PhaseResults) -> bytes:
    return msgspec.msgpack.encode(results)


def decode(data: bytes) -> PhaseResults:
    return _decoder.decode(data)
