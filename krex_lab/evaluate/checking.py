"""Worker side: one correctness trial, the same for both formats.

Order matters against cheats. The candidate runs first, on the trial's data, so no result of the
reference can be lying in freed memory for it to return. A snapshot taken before it ran tells
which arrays it wrote; the reference then runs on a fresh copy of that snapshot, and the arrays
*it* writes (GPU MODE's output buffers) are the only ones the candidate may write too. An output
sharing memory with an array the reference only reads is an input returned as the result. After
the comparison everything is filled with NaN before it is freed, so the next trial's allocations
never hold this trial's answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .guards import ReferenceTrap, ThreadWatch
from .tensors import arrays, clone, compare, identical, memory_ranges, poison_all, synchronize

__all__ = ["Target", "Trial", "run_trial"]

#: one timed case: (its line, the candidate's call, the reference's call, a check of each run's output)
Target = tuple[str | None, Callable[[], Any], Callable[[], Any], Callable[[Any], None] | None]


@dataclass
class Trial:
    """What one trial found; ``rejected`` names a cheat (``inputs_modified``, ``aliased_output``,
    ``calls_reference``, ``threads_left``), ``issue`` says what differs."""

    ok: bool
    issue: str = ""
    rejected: dict[str, str] = field(default_factory=dict)
    max_difference: list[float] = field(default_factory=list)
    avg_difference: list[float] = field(default_factory=list)
    #: the candidate's output (poisoned): kept alive through the next trial, so that memory of
    #: it coming back can only mean the candidate kept it
    output: Any = None


def _changed(before: Any, after: Any) -> set[int]:
    return {k for k, (b, a) in enumerate(zip(arrays(before), arrays(after))) if not identical(b, a)}


def run_trial(
    data: Any,
    candidate: Callable[[Any], Any],
    reference: Callable[[Any], Any],
    *,
    atol: float | None,
    rtol: float | None,
    reference_files: set[str],
    checker: Callable[[Any, Any], tuple[bool, str]] | None = None,
    previous: Any = None,
) -> Trial:
    """Run ``candidate(data)`` and ``reference(copy)``, compare (or ``checker(copy, output)``).
    ``previous``: the outputs of the trials before, still alive, so no fresh allocation can reuse
    their memory: an output in it is one the candidate kept (it caches results across calls)."""
    from .tensors import tolerances

    pristine = clone(data)
    trap, threads = ReferenceTrap(reference_files), ThreadWatch()
    with threads, trap:
        out = candidate(data)
        synchronize()
    ref_data = clone(pristine)
    expected = reference(ref_data)
    synchronize()
    written_by_ref = _changed(pristine, ref_data)
    rejected: dict[str, str] = {}
    # the trial's own buffers (a GPU MODE output buffer, refilled) are not an earlier result
    kept = [p for p in arrays(previous) if not _shares(p, list(arrays(data)))] if previous is not None else []
    if kept and _shares(out, kept):
        rejected["cached_results"] = "the candidate returned an earlier call's result (it caches results across calls)"
    if trap.calls:
        rejected["calls_reference"] = f"the candidate called the reference's {', '.join(trap.calls)}"
    if threads.left:
        rejected["threads_left"] = (
            f"the candidate left thread(s) running after it returned ({', '.join(threads.left[:3])}): "
            "work a timer around the call would not see"
        )
    wrote = sorted(_changed(pristine, data) - written_by_ref)
    if wrote:
        rejected["inputs_modified"] = f"the candidate wrote into its input(s) {wrote} (the reference does not)"
    # arrays the reference only reads, and does not return either, are the candidate's to read
    returned_by_ref = {k for k, a in enumerate(arrays(ref_data)) if _shares(expected, [a])}
    read_only = [x for k, x in enumerate(arrays(data)) if k not in written_by_ref | returned_by_ref]
    if _shares(out, read_only):
        rejected["aliased_output"] = "the candidate returned one of its inputs (or a view of one) as its output"
    trial = Trial(ok=not rejected, rejected=rejected, output=out)
    if checker is not None:
        good, message = checker(clone(pristine), out)
        if not good:
            trial.ok, trial.issue = False, message or "the reference's check_implementation failed"
    else:
        a, r = tolerances(expected, atol, rtol)
        same, what, trial.max_difference, trial.avg_difference = compare(out, expected, a, r)
        if not same:
            trial.ok, trial.issue = False, f"Output mismatch (atol={a:g}, rtol={r:g}):\n{what}"
    for obj in (out, expected, ref_data, pristine):
        poison_all(obj)
    return trial


def _shares(out: Any, inputs: list[Any]) -> bool:
    ins = memory_ranges(inputs)
    return any(s < ie and is_ < e for s, e in memory_ranges(out) for is_, ie in ins)
