"""The time phase, driven by the judge: rounds of fresh inputs, re-checked outputs, a bound from
outside the candidate's process, and the reference timed here.

Per case, inside one region:

* K distinct input sets are made (as many as the calls to time, within a memory budget), each in
  memory of its own with its output buffers (:mod:`.buffers`), and sent with the round that uses
  them: a round's inputs are memory the candidate's process has never seen before that round is
  sent, and no set reaches another through its memory. A *round* calls the candidate once per
  set, each call timed in its process by the format's method (``kernelbench-events`` /
  ``gpumode-events``, after the formats' 256 MiB L2 thrash; ``host-clock`` without a GPU); each
  call's value lands in the judge's buffers before the round's answer.
* After each round the judge checks every call of it: inputs compared with their pristine
  copies, outputs that share an input's memory, threads left running the candidate's code, CPU
  spent while no call ran, outputs changed after the answer; and re-checks outputs (16 drawn at
  random after the round, ``RECHECKS``, or every one in strict / leaderboard mode) against the reference on
  the same inputs. The next round's sets are new memory under new seeds: a result kept by
  pointer, ``_version`` or content meets new inputs, and a stale answer fails the re-check.
* The figure is the judge's (:mod:`.clock`): each round bracketed by its clock until the round is
  over as seen from outside the candidate's process (the driver's lock on a GPU), less a round
  trip calibrated in the same region on a clean twin; on a CPU the CPU time of the candidate's
  cgroup. The candidate's in-process figure stays only where it agrees (GPU).
* The reference is timed with the candidate's processes held (locked, frozen), after the
  judge's own scheduling is put back.

Reference times are kept in this judge's memory only (per problem, GPU model, method, settings):
no file the candidate's user can write holds a time that a verdict uses.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import random
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from ...region_report import RegionReport
from .. import cuda_ipc
from ..messages import Drop, Ok, Round, Timed
from ..options import Case, Options
from ..outcomes import SampleStats, TimedCase, TimeResult
from .clock import OutsideClock, Refused, harness_cpu
from .compare import compare, tolerances
from .reference_time import reference_time
from .roundsets import case_layout, l2_flush, make_sets, memory_mark, read_round, refill, round_checks
from .tensors import arrays, clone
from .timers import TimingError, enough, stats
from .timers import label as timer_label
from .values import CandidateFailed

#: the judge of :mod:`.session` (not imported: the session imports this module)
Judge = Any

__all__ = ["method_name", "timing"]

#: memory the input sets (and their pristine copies) of one case may take
#: (a GPU is shared by all its workers' judges: 16 of them must fit beside their candidates)
_BUDGET = {"cuda": 512 << 20, "cpu": 256 << 20}
#: input sets of a case at most (a round's calls)
MAX_SETS = 128
#: calls of each timed round re-checked against the reference, drawn at random after it (all of
#: them in strict / leaderboard mode). A candidate wrong in a share ``w`` of its timed calls (to
#: save their work) passes a round with probability ``(1 - w) ** RECHECKS``: with 2, a half wrong
#: passed a quarter of the time at twice its speed; with 16, one in 65,536
RECHECKS = 16


#: GPU memory the running job was admitted with for its input sets (bytes; 0: no admission)
ADMITTED: contextvars.ContextVar[int] = contextvars.ContextVar("krex_admitted_input_memory", default=0)


def budget(device: str) -> int:
    """Bytes a case's input sets and outputs may take on ``device`` (less on a GPU where the
    batch admitted the job with less memory free)."""
    base = _BUDGET.get(device, _BUDGET["cpu"])
    admitted = ADMITTED.get()
    return max(16 << 20, min(base, admitted)) if admitted and device == "cuda" else base


def method_name(device: str, what: str) -> str:
    """What the candidate process times with: an event pair on a GPU, else the host clock."""
    if what == "warmup":
        return "warmup"
    return "events" if device == "cuda" else "host"


def _target_calls(o: Options, fmt: str) -> int:
    if o.timing == "converge" or fmt == "gpumode":
        return max(1, o.max_runs)
    return max(1, o.perf_trials)


def timing(judge: Judge, reference_cache: str | None = None) -> TimeResult:
    """Every timed case of the problem (see the module's docstring)."""
    judge.phase = "time"
    result = TimeResult()
    t0 = time.perf_counter()
    assert judge.problem is not None
    cached_any = False
    try:
        for case in judge.problem.time_cases:
            part, cached = _time_case(judge, case, result)
            cached_any = cached_any or cached
            result.parts.append(part)
            if result.verdict is not None:
                break
    except Refused as exc:
        result.fail("rejected", "rejected", "")
        result.metadata["rejected"] = {exc.name: exc.message}
    except CandidateFailed as exc:
        exc.record(result)
    except TimingError as exc:
        result.fail("error", "reference_error", f"the reference failed while timed: {exc}")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result.reference_cached = cached_any
    result.reference_timed_at = judge.reference_timed_at if cached_any else now
    result.seconds = round(time.perf_counter() - t0, 6)
    return result


#: on a GPU, the candidate's process and the calibration twin let go of a round's sets between
#: rounds, outside any bracket (KREX_JUDGE_LET_GO=1; off until its GPU run): else the candidate
#: closes the last round's CUDA IPC handles at the start of the next round, inside that round's
#: bracket, while the twin closes its own after its answer, so a cost of the harness is counted
#: as the candidate's
LET_GO = os.environ.get("KREX_JUDGE_LET_GO", "0") == "1"


def _let_go(judge: Judge, rs: Any) -> None:
    """The candidate lets go of round ``rs``'s sets (with :data:`LET_GO`, on a GPU): once it says
    it did, a set it still holds is one it kept, GPU memory the judge cannot give back while it
    lives (a round's sets a round is a neighbour's out-of-memory within a few dozen rounds)."""
    if not (LET_GO and judge.device == "cuda"):
        return
    judge.ask(Drop(), Ok)
    kept = cuda_ipc.held_of(rs.shared.counters)
    if kept:
        raise Refused(
            "kept_inputs",
            f"the candidate's process kept {kept} of the judge's input memories of a round it was done with "
            "(GPU memory that stays allocated while it holds them)",
        )


def _idle_cpu_ms(judge: Judge, since: float) -> float:
    """CPU (ms) the candidate's process used between a round's answer and now, when it had no call
    to run. Said in the result, never a verdict by itself: an honest framework's threads spin after
    a call (OpenBLAS's for tens of milliseconds each), so only work the judge can see the effect of
    (an output written late, a thread left running its code) is rejected."""
    assert judge.proc is not None
    return (harness_cpu(judge.proc.pid) - since) * 1e3


def _recheck(judge: Judge, pristine: Any, out: Any) -> tuple[bool, str]:
    assert judge.problem is not None
    if judge.problem.checker is not None:
        return judge.problem.checker(clone(pristine), out)
    expected = judge.problem.reference(clone(pristine))
    exp = list(arrays(expected))
    a, r = tolerances(exp, judge.opts.atol, judge.opts.rtol)
    cmp = compare(list(arrays(out)) if out is not None else [], exp, a, r)
    return cmp.ok, cmp.issue


def _time_case(judge: Judge, case: Case | None, result: TimeResult) -> tuple[TimedCase, bool]:
    assert judge.problem is not None and judge.proc is not None
    o, fmt = judge.opts, judge.job.format
    name = judge.problem.case_name(case)
    target = _target_calls(o, fmt)
    spec, written, per_set, sample = case_layout(judge, case)
    k = max(1, min(target, budget(judge.device) // per_set, MAX_SETS))
    if fmt == "gpumode" or o.timing == "converge":
        k = min(k, 16)  # runs until the mean settles: rounds of a few sets, refilled between them
    rs = make_sets(judge, case, k, spec)
    # warm-up: every set once (the format's warm-up calls at least); a call long enough that that
    # would take over a second warms one set only
    t_warm = time.perf_counter()
    judge.ask(Round(order=[0], method="warmup", sets=rs.entries()), Timed, rs.shared)
    one_call = time.perf_counter() - t_warm
    if one_call * k < 1.0:
        warm = list(range(k)) + [0] * max(0, o.warmup_calls - k)
        judge.ask(Round(order=warm, method="warmup"), Timed)
    clock = OutsideClock(
        judge, method_name(judge.device, "timed"), let_go=LET_GO and judge.device == "cuda", sample=(sample, spec)
    )
    clock.prepare(k)
    clock.start()  # the candidate's CPU from here on is the timed rounds' (inputs filled next)
    _let_go(judge, rs)
    rs = refill(judge, case, rs, spec)  # what the warm-up saw is never timed: a memo of it misses
    strict = o.strict or o.mode == "leaderboard"
    samples: list[float] = []
    rounds = 0
    idle_ms = 0.0
    trace: list[tuple[int, int, int, int]] = []  # (round, MiB allocated, MiB reserved, shares held) after each refill
    rng = random.Random()
    label = timer_label(judge)
    paused = judge.disk.paused() if judge.disk is not None else contextlib.nullcontext()
    with _region(o, judge.device != "cuda") as region, _pinned(judge), paused:
        _own_scheduling(judge, clock)
        with clock.hold():  # the twin timed with no candidate code running
            clock.calibrate(k)
        started = time.perf_counter()
        while not enough(samples, o, fmt, started):
            left = (target if (fmt == "kernelbench" and o.timing != "converge") else o.max_runs) - len(samples)
            size = min(k, max(1, left))
            if fmt == "gpumode" or o.timing == "converge":  # rounds that end near the case's time cap
                spare_s = o.max_case_s - (time.perf_counter() - started)
                size = max(1, min(size, int(spare_s / max(one_call, 1e-6))))
            order = list(range(size))
            message = Round(order=order, method=method_name(judge.device, "timed"), sets=rs.entries())
            with clock.round(len(order)) as bracket:
                body = judge.ask(message, Timed, rs.shared, on_answer=bracket.answered)
            c1 = harness_cpu(judge.proc.pid)
            clock.said(len(order), body.parts_us)
            outs = read_round(rs, order, body)
            rounds += 1
            got = body.samples
            if len(got) != len(order) or any(not math.isfinite(s) or s < 0 for s in got):
                result.fail("rejected", "rejected", "")
                result.metadata["rejected"] = {
                    "protocol": "the candidate's process answered a timed round with the wrong number "
                    "of samples or outputs"
                }
                break
            samples += got
            reasons = round_checks(judge, rs, order, body, outs, written)
            if reasons:
                result.fail("rejected", "rejected", "")
                result.metadata["rejected"] = reasons
                break
            picks = range(len(order)) if strict else rng.sample(range(len(order)), min(RECHECKS, len(order)))
            for i in picks:
                ok, issue = _recheck(judge, rs.pristine[order[i]], outs[i])
                if not ok:
                    result.fail(
                        "incorrect",
                        "correctness_issue",
                        f"a timed call's output was wrong (call {len(samples) - len(order) + i + 1}"
                        + (f", case {name}" if name else "")
                        + f"): {issue}",
                    )
                    break
            del outs
            if result.verdict is not None:
                break
            idle_ms = max(idle_ms, _idle_cpu_ms(judge, c1))
            _let_go(judge, rs)
            rs = refill(judge, case, rs, spec)
            if (mark := memory_mark()) is not None:
                trace.append((rounds, *mark))
        with clock.hold():  # no candidate code runs while the twin and the reference are timed
            clock.stop()
            clock.calibrate(k)
            _own_scheduling(judge, clock)
            ref_part, cached = reference_time(judge, name, rs.pristine, protected=region.notice is None)
    judge.ask(Drop(), Ok)
    rs.release()
    clock.finish()
    if trace:
        shown = trace if len(trace) <= 6 else [*trace[:3], *trace[-3:]]
        result.metadata["judge_memory_rounds"] = "; ".join(
            f"round {r}: {mib} MiB allocated, {res} MiB reserved, {held} shares held" for r, mib, res, held in shown
        )
    st = stats(samples) if samples else SampleStats(mean=-1.0, std=0.0, min=-1.0, max=-1.0, num_trials=0)
    part = TimedCase(case=name, method=label, stats=st, region=region.report, notice=region.notice)
    if ref_part is not None and not cached:
        ref_part.region = region.report  # timed in the same region
    part.reference = ref_part
    if cached:
        result.metadata["ref_runtime_cached"] = "the reference's time measured earlier by this judge"
    if samples:
        fig = clock.figure(samples, label, name or "")
        part.stats = fig.stats
        part.method = fig.method
        meta = result.metadata
        for key, value in (
            ("timing_bound_us", fig.outside),
            ("timing_roundtrip_us", fig.roundtrip),
            *((("timing_wall_us", fig.wall),) if fig.wall is not None else ()),
        ):
            meta.setdefault(key, [])
            meta[key].append(round(value, 4))  # type: ignore[union-attr]
        meta["timing_accounting"] = clock.accounting()
        if fig.text:
            meta["timing_bound"] = fig.text
        if clock.notes:
            meta["timing_calibration"] = "; ".join(clock.notes)
        meta["timing_cost_ms"] = {k: f"{v * 1e3:.2f}" for k, v in clock.spent.items()}
        meta["timing_split_us"] = clock.split_text()
        result.metadata["input_sets"] = str(k)
        result.metadata["l2_flush"] = l2_flush(judge.device)
        result.metadata["idle_cpu_ms"] = str(round(idle_ms, 3))
        result.metadata["timing_overhead_us"] = str(round(fig.overhead, 3))
        result.metadata["timed_rounds"] = str(rounds)
        if o.timing == "converge" or fmt == "gpumode":
            result.metadata["converged"] = str(
                st.mean > 0 and st.err / st.mean <= (0.001 if o.timing == "converge" else o.max_rel_err)
            )
    return part, cached


@contextlib.contextmanager
def _pinned(judge: Judge) -> Iterator[None]:
    """The judge's affinity in its region is the one its scheduling is put back to, until the
    region ends."""
    judge.scheduling.pin()
    try:
        yield
    finally:
        judge.scheduling.unpin()


def _own_scheduling(judge: Judge, clock: OutsideClock) -> None:
    """The judge's threads back to their own nice value and the region's cores (its zygote's and
    the twin's nice value too: the next candidate's process and the calibration inherit them); a
    change found was the candidate's (nothing else renices a judge): rejected, the reference left
    untimed."""
    from .spares import spares_for

    zygote = spares_for(judge.device).pid
    judge.rescheduled += judge.scheduling.reset((zygote, clock.twin.pid if clock.twin is not None else None))
    if judge.rescheduled:
        raise Refused(
            "judge_rescheduled",
            "the judge's scheduling was changed while the candidate ran: " + "; ".join(judge.rescheduled[:4]),
        )


class _Region:
    """A timed case's region: its report once released (None: timed without one, ``notice`` says why)."""

    def __init__(self) -> None:
        self.report: RegionReport | None = None
        self.notice: str | None = None


@contextlib.contextmanager
def _region(opts: Options, cpu: bool) -> Iterator[_Region]:
    """The case's region; on a CPU every other GPU's of the node too (:mod:`.node_region`)."""
    holder = _Region()
    if not opts.exclusive:
        holder.notice = "timed without a region (exclusive=False): other work may have shared the GPU"
        yield holder
        return
    from ...client import exclusive
    from .node_region import hold_node, release_all

    region = exclusive(max_hold=opts.limit("time"))
    others: list[Any] = []
    try:
        if cpu:
            others = hold_node(region, opts.limit("time"))
        else:
            region.acquire()
    except Exception as exc:
        holder.notice = f"timed without a region ({type(exc).__name__}: {exc})"
        yield holder
        return
    threads = _fit_threads()
    try:
        yield holder
    finally:
        try:
            holder.report = region.release()
        finally:
            release_all(others)
        if threads is not None:
            sys.modules["torch"].set_num_threads(threads)


def _fit_threads() -> int | None:
    """On the CPU, torch's threads to the cores the region left this process."""
    torch = sys.modules.get("torch")
    if torch is None or torch.cuda.is_available():
        return None
    before = int(torch.get_num_threads())
    cores = len(os.sched_getaffinity(0))
    if cores >= before:
        return None
    torch.set_num_threads(max(1, cores))
    return before
