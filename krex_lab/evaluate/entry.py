"""The job an evaluation sends its worker, pickled by name: the client never imports the worker
side (:mod:`.phases` and the formats), whose imports cost a tenth of a second."""

from __future__ import annotations

from typing import Any

from .options import Job

__all__ = ["run_on_worker"]


def run_on_worker(job: Job, reference_cache: str | None) -> dict[str, Any]:
    """:func:`krex_lab.evaluate.phases.run`, imported in the worker."""
    from .phases import run

    return run(job, reference_cache)
