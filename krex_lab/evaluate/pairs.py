"""A batch's pairs and results, shared by :mod:`.batch` (manifests, ``krex eval --batch``) and
:mod:`.many` (``evaluate_many``, the engine): :class:`Pair`, :class:`BatchRecord`, the error result
of a pair that cannot run, and the progress line."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from .result import Evaluation

__all__ = ["PAIR_OPTIONS", "BatchRecord", "Pair", "Progress", "error_result"]

#: what a JSON manifest line may set for its pair
PAIR_OPTIONS = (
    "format",
    "gpu",
    "timing",
    "mode",
    "tests",
    "benchmarks",
    "trials",
    "perf_trials",
    "measure",
    "seed",
    "strict",
    "atol",
    "rtol",
    "max_case_s",
)


@dataclass
class Pair:
    """One pair of a manifest, made by :func:`parse_manifest`, evaluated by :func:`run_batch`."""

    index: int
    line: int
    reference: str = ""
    candidate: str = ""
    id: str | None = None
    #: the options the pair sets over the batch's (checked when the pair is read)
    options: dict[str, object] = field(default_factory=dict)
    #: why the line could not be read (the pair's result is an error)
    problem: str | None = None


class BatchRecord(Evaluation, kw_only=True):
    """One line of a batch's output: the pair's :class:`Evaluation`, its ``index`` in the
    manifest (from 0) and its ``id`` (as given, else the candidate's path)."""

    index: int
    id: str


def error_result(pair: Pair, message: str, key: str = "evaluation_error") -> Evaluation:
    return Evaluation(
        format=str(pair.options.get("format", "unknown")),
        verdict="error",
        summary=f"error: {message.splitlines()[0] if message else ''}",
        reference=pair.reference,
        candidate=pair.candidate,
        metadata={key: message},
    )


class Progress:
    """The batch's progress: done/total, the verdicts so far, and how many pairs wait for GPU
    memory. On a terminal, one status line (``\\r``-rewritten); elsewhere (a log, a pipe), a plain
    line at most every :attr:`every_s` seconds and at the end, so that a log says where a long
    batch stands and what it waits for."""

    every_s = 10.0

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream = total, stream
        self.done = 0
        self.verdicts: Counter[str] = Counter()
        self.enabled = stream.isatty()
        self.memory_waits = 0
        self.memory_detail = ""
        self._said_at = 0.0
        self._said = ""

    def update(self, verdict: str) -> None:
        self.done += 1
        self.verdicts[verdict] += 1
        self._draw()

    def waiting(self, n: int, detail: str = "") -> None:
        """``n`` pairs wait in the queue for GPU memory (said while there are any); ``detail``:
        what the first of them needs and what is free."""
        if n != self.memory_waits or detail != self.memory_detail:
            self.memory_waits, self.memory_detail = n, detail
            self._draw()

    def _state(self) -> str:
        counts = ", ".join(f"{v} {n}" for v, n in self.verdicts.most_common())
        wait = f"{'; ' if counts else ''}{self.memory_waits} waiting for GPU memory" if self.memory_waits else ""
        if wait and self.memory_detail:
            wait += f" ({self.memory_detail})"
        return f"{counts}{wait}"

    def _draw(self) -> None:
        if self.enabled:
            width = 30
            filled = int(width * self.done / max(1, self.total))
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            self.stream.write(f"\r{bar} {self._state()}\x1b[K")
            self.stream.flush()
            return
        line = f"krex eval: {self.done}/{self.total} done" + (f" ({self._state()})" if self._state() else "")
        now = time.monotonic()
        if line != self._said and (now - self._said_at >= self.every_s or self.done == self.total):
            self._said, self._said_at = line, now
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
