"""Evaluate what agents write: KernelBench and GPU MODE problems, end to end.

    import krex_lab
    ev = krex_lab.evaluate("reference.py", "candidate.py")   # paths or source text
    ev.verdict, ev.correctness, ev.runtime, ev.ref_runtime, ev.speedup, ev.metadata
    print(ev.to_json())

Client side: :mod:`.api` (``evaluate``), :mod:`.orchestrate` (the phases on one pool job),
:mod:`.source` (reading programs, telling their format), :mod:`.cache` (build directories),
:mod:`.batch` and :mod:`.cli` (``krex eval``), :mod:`.many` (``evaluate_many``: many pairs over every GPU,
admitted by GPU memory: :mod:`.admission`), :mod:`.mcp_server` (``krex mcp``). The judge (the pool
job; it never runs candidate code): :mod:`.judge` (:mod:`.judge.session` load and check,
:mod:`.judge.rounds` timing, :mod:`.judge.clock` the figure from outside, :mod:`.judge.tensors` the
problem's arrays, :mod:`.judge.timers` the statistics, :mod:`.judge.record` the reproducibility record).
The candidate's side (a sandboxed one-shot process): :mod:`.candidate`. Between them: :mod:`.channel`.
Both: :mod:`.result` (``Evaluation``), :mod:`.options`, :mod:`.outcomes`, :mod:`.numerics`. Importing
this package imports no torch. See ``docs/evaluate.md``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .api import evaluate
from .many import evaluate_many
from .result import FORMATS, METHODS, VERDICTS, CaseResult, Evaluation, TimedPart, TimingStats

__all__ = [
    "FORMATS",
    "METHODS",
    "VERDICTS",
    "CaseResult",
    "Evaluation",
    "TimedPart",
    "TimingStats",
    "evaluate",
    "evaluate_many",
]


class _CallableModule(types.ModuleType):
    """``krex_lab.evaluate(reference, candidate)`` calls :func:`~.api.evaluate`, whether
    ``krex_lab.evaluate`` is this package (once imported) or not yet (as ``krex_lab.bench``)."""

    def __call__(self, reference: Any, candidate: Any, **options: Any) -> Evaluation:
        return evaluate(reference, candidate, **options)


sys.modules[__name__].__class__ = _CallableModule
