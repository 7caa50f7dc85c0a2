"""Progress of one evaluation as it runs: ``evaluate(..., progress=fn)`` calls ``fn(phase, detail)``.

Phases in order: ``queued`` (the job is submitted, waiting for a worker), ``load``, ``check``,
``time`` (as the judge's phase markers arrive), ``done`` (the verdict is in; ``detail`` is its
summary). The callback is the caller's: it runs in the evaluating thread, between two reads of
the job's output, so it should return quickly; an exception it raises is kept out of the
evaluation (the evaluation goes on, the callback is not called again).

The orchestrator reports a phase with :func:`phase_started` where it reads a phase marker; the
callback in force is the one of the :func:`reporting` block around the call (a context variable:
each thread, each batch pair, has its own).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

__all__ = ["PHASES", "Progress", "phase_started", "reporting"]

#: what a callback is called with: (phase, detail)
Progress = Callable[[str, str], None]
PHASES = ("queued", "load", "check", "time", "done")

_current: contextvars.ContextVar[list[Progress] | None] = contextvars.ContextVar("krex_evaluate_progress", default=None)


@contextlib.contextmanager
def reporting(progress: Progress | None) -> Iterator[None]:
    """``progress`` is the callback of every :func:`phase_started` inside the block."""
    token = _current.set([progress] if progress is not None else None)
    try:
        yield
    finally:
        _current.reset(token)


def phase_started(phase: str, detail: str = "") -> None:
    """Tell the caller's callback (if any) that ``phase`` began. Never raises: a callback that
    fails is dropped for the rest of the evaluation."""
    held = _current.get()
    if not held:
        return
    try:
        held[0](phase, detail)
    except Exception:
        held.clear()
