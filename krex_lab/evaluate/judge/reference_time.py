"""The reference's time, measured in the judge as the candidate's is: the case's own sets in turn,
one call each, in the case's region; kept in this judge by problem and settings, so that the next
candidate of the same problem is compared with the same figure. Used by :mod:`.rounds`."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from ..outcomes import ReferenceEntry, ReferenceKey, ReferenceTime
from .tensors import synchronize
from .timers import enough, label, stats

#: the judge of :mod:`.session` (not imported: the session imports the rounds, which import this)
Judge = Any

__all__ = ["reference_time"]

#: reference times measured in this judge, by problem and settings
_REFERENCE_TIMES: dict[str, ReferenceEntry] = {}


def _reference_key(judge: Judge, case: str | None) -> str:
    o = judge.opts
    return "|".join(
        str(x)
        for x in (
            judge.job.reference.sha256,
            judge.job.format,
            judge.device_name,
            o.timing,
            o.perf_trials,
            o.warmup_calls,
            o.warmup_s,
            o.min_runs,
            o.max_runs,
            o.max_rel_err,
            o.max_case_s,
            o.mode,
            o.exclusive,
            case,
        )
    )


def _time_rotating(judge: Judge, ref: Any, sets: list[Any]) -> tuple[str, list[float]]:
    """The reference timed as the candidate is: the same sets in turn, one call each, after a
    warm-up over all of them (an event pair and a synchronisation per call on a GPU; on a CPU the
    judge's CPU time, in one thread, as the candidate's harness runs it)."""
    o, fmt = judge.opts, judge.job.format
    cuda = judge.device == "cuda"
    samples: list[float] = []
    with _one_thread(cuda):
        for args in sets:
            ref(args)
        synchronize()
        started = time.perf_counter()
        if cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush = torch.empty((32, 1024, 1024), dtype=torch.int64, device="cuda")
        i = 0
        while not enough(samples, o, fmt, started):
            args = sets[i % len(sets)]
            i += 1
            if cuda:
                flush.fill_(42)  # the formats' L2 thrash, outside the event pair (as the candidate's)
                start.record()
                ref(args)
                end.record()
                torch.cuda.synchronize()
                samples.append(float(start.elapsed_time(end)) * 1e3)
            else:
                # the CPU time the judge used, as the candidate's figure is its cgroup's: a shared
                # host's waits for a core are in neither
                t0 = time.process_time()
                ref(args)
                samples.append((time.process_time() - t0) * 1e6)
    return label(judge), samples


@contextlib.contextmanager
def _one_thread(cuda: bool) -> Iterator[None]:
    """On a CPU, torch's work in this thread alone while the reference is timed, as the candidate's
    harness has it: a CPU-time figure counts every thread, and threads that spin at a barrier while
    a shared host keeps their peer off a core would count their wait (ten times the work, seen)."""
    torch = sys.modules.get("torch")
    if cuda or torch is None:
        yield
        return
    before = int(torch.get_num_threads())
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_time(
    judge: Judge, name: str | None, pristine: list[Any], protected: bool
) -> tuple[ReferenceTime | None, bool]:
    """The reference's time on case ``name`` (on the case's last ``pristine`` sets), and whether
    it is one measured before: measured here, in the case's region, unless this judge measured it
    before with the same settings on the same GPU model. ``protected``: the case has its region
    (a case timed without one is compared with a reference timed the same way, now: never with a
    figure measured under a region, and none is kept)."""
    o = judge.opts
    if not o.time_reference:
        return None, False
    key = _reference_key(judge, name)
    entry = _REFERENCE_TIMES.get(key) if protected else None
    if entry is not None and not o.retime_reference:
        judge.reference_timed_at = entry.timed_at
        return entry.parts.get(str(name)), True
    assert judge.problem is not None
    ref = judge.problem.reference
    sets = [judge.problem.args(p) for p in pristine]  # the case's last use of them
    method, samples = _time_rotating(judge, ref, sets)
    part = ReferenceTime(method=method, stats=stats(samples), region=None)
    if not protected:
        return part, False
    _REFERENCE_TIMES[key] = ReferenceEntry(
        parts={str(name): part},
        timed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=judge.device_name,
        key=_record_key(judge),
    )
    return part, False


def _record_key(judge: Judge) -> ReferenceKey:

    o = judge.opts
    return ReferenceKey(
        reference=judge.job.reference.sha256,
        format=judge.job.format,
        device=judge.device_name,
        timing=o.timing,
        settings=[],
        seed=0,
        benchmarks=judge.job.benchmarks,
        mode=o.mode,
        exclusive=o.exclusive,
    )
