"""The job an evaluation sends its worker, pickled by name: the client never imports the worker
side (:mod:`.judge` and the formats), whose imports cost a tenth of a second."""

from __future__ import annotations

from .options import Job

__all__ = ["run_on_worker"]


def run_on_worker(job: Job, reference_cache: str | None) -> bytes:
    """:func:`krex_lab.evaluate.judge.session.run`, imported in the worker (the judge); its results msgpack-encoded
    (:func:`krex_lab.evaluate.outcomes.decode` reads them)."""
    from .judge.session import run
    from .outcomes import encode

    return encode(run(job, reference_cache))
