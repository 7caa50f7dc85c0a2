"""The judge's own figure for a timed case: measured from outside the candidate's process.

Per case, inside its region (:mod:`.rounds` drives it):

* **Brackets.** The judge's clock runs from each round sent until the round is over *as seen from
  outside*: on a GPU, the candidate's answer and then the driver's lock on each of its processes,
  which returns only once every stream's work is done (:mod:`.outside`); on a CPU, its answer.
* **A round trip calibrated in the same region**, right before and right after the timed rounds
  (the best of several), on a *twin*: the judge's next spare, a process forked from the same clean
  zygote with no candidate code in it, running the same harness on a no-op, bracketed the same
  way. The candidate cannot make it slow: the twin is not its process, and the candidate is held
  (locked and frozen) while the twin is timed.
* **The figure.** GPU: the brackets less the calibrated round trips, per call; the candidate's
  in-process event figure stays only where it is not below that by more than max(5 %, 1 us a call)
  (over-reporting costs only the candidate); otherwise the outside figure is the verdict's, and
  ``metadata.timing_bound`` says both. CPU: the CPU time of the candidate's cgroup (every thread
  and child, exited ones included) over the timed rounds, less the twin's harness CPU time, per
  call; never the candidate's own clock. The rounds' wall time, corrected the same way, is kept
  beside it (``metadata.timing_wall_us``).
* **Held while the reference is timed**: the candidate's processes locked (GPU) and frozen, so
  no candidate code runs while the judge times the reference or the twin; thawed and unlocked
  before the region ends (a process left stopped would be found by the next region's drain).
* **The judge's scheduling is its own**: before the rounds and again before the reference, every
  thread of the judge gets back its nice value from the evaluation's start and its affinity from
  the region's; a change found is the candidate's doing and rejects it (``judge_rescheduled``).

A candidate that skips its harness (patched) saves at most the calibrated harness cost a call
(``metadata.timing_overhead_us``): the one figure the judge cannot see from outside.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...procutil import GONE, proc_state, tree
from ..messages import Calibrate, Calibrated, Drop, Ok, Timed
from ..outcomes import SampleStats
from .harness_parts import parts_of, said_text
from .outside import Drain, DrainFailed, drain_for
from .timers import stats
from .values import CandidateFailed

__all__ = ["Figure", "OutsideClock", "Refused", "Scheduling", "harness_cpu"]

#: how many no-op rounds of each size the twin runs, before and after (the best one counts)
REPS = 3
#: the least disagreement that counts, a call
FLOOR_US = 1.0
#: the share of the outside figure within which the in-process one agrees
SHARE = 0.05

_DRAINS: dict[str, Drain] = {}


class Refused(CandidateFailed):
    """A cheat found from outside: ``rejected``, with ``name`` in ``metadata.rejected``."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__("rejected", "rejected", message)
        self.name = name


def harness_cpu(pid: int) -> float:
    """CPU time of every live thread of ``pid`` (the twin's: its threads never exit)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        pass
    return total / 1e9


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [os.getpid()]


class Scheduling:
    """The judge's nice values (taken when the evaluation starts) and affinities (taken when a
    region is granted), put back on demand; what had changed is reported."""

    def __init__(self) -> None:
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.affinity: dict[int, set[int]] = {}

    def pin(self) -> None:
        """The affinity of every thread now (the region's cores) is the one to keep."""
        self.affinity = {}
        for tid in _tids():
            with contextlib.suppress(OSError):
                self.affinity[tid] = os.sched_getaffinity(tid)

    def unpin(self) -> None:
        """The region is over: its cores are no longer the judge's to keep."""
        self.affinity = {}

    def reset(self, others: tuple[int | None, ...] = ()) -> list[str]:
        """Every thread of the judge (and of ``others``: its zygote, the calibration twin) back to
        the judge's nice value, the judge's to its pinned affinity (in a region); what was changed."""
        found: list[str] = []
        tids = [(tid, "the judge") for tid in _tids()]
        for pid in others:
            if pid:
                with contextlib.suppress(OSError):
                    tids += [(int(t), f"process {pid}") for t in os.listdir(f"/proc/{pid}/task")]
        for tid, whose in tids:
            try:
                nice = os.getpriority(os.PRIO_PROCESS, tid)
            except OSError:
                continue
            if nice != self.nice:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, self.nice)
                    found.append(f"{whose}: thread {tid} reniced from {self.nice} to {nice} (undone)")
                except OSError as exc:
                    found.append(
                        f"{whose}: thread {tid} reniced from {self.nice} to {nice} (not undone: {exc.strerror})"
                    )
            want = self.affinity.get(tid)
            if want is not None:
                with contextlib.suppress(OSError):
                    if os.sched_getaffinity(tid) != want:
                        os.sched_setaffinity(tid, want)
        return found


@dataclass
class Figure:
    """A case's figures, us a call: ``outside`` (the judge's), ``inprocess`` (the candidate's
    process's mean), and what the verdict uses (``stats``, ``method``, ``text`` when replaced)."""

    outside: float
    inprocess: float
    believed: bool
    stats: SampleStats
    method: str
    text: str = ""
    wall: float | None = None
    roundtrip: float = 0.0
    overhead: float = 0.0


@dataclass
class _Round:
    clock: OutsideClock
    #: whose device work ends the round (None: the candidate's processes, listed at its answer)
    pids: list[int] | None = None
    start: float = field(default_factory=time.perf_counter)
    #: when the answer came (the rest of the bracket is the wait for its device work)
    answer: float | None = None
    end: float | None = None

    def answered(self) -> None:
        """The candidate (or the twin) answered: wait for its device work, read the clock."""
        self.answer = time.perf_counter()
        self.end = self.clock.settle(self.pids)

    def split(self) -> tuple[float, float]:
        """(seconds to the answer, seconds of the wait after it)."""
        assert self.answer is not None and self.end is not None
        return self.answer - self.start, self.end - self.answer


def _fit(table: dict[int, float]) -> tuple[float, float]:
    """(a round's own cost, a call's) from the best time of each round size."""
    if not table:
        return 0.0, 0.0
    small, big = min(table), max(table)
    per_call = max(0.0, (table[big] - table[small]) / (big - small)) if big > small else 0.0
    return max(0.0, table[small] - per_call * small), per_call


class OutsideClock:
    """One case's outside figure (see the module's docstring). ``method``: the harness's timing
    method. The twin's no-op rounds take sets shaped as a round's (the judge's
    ``_calibration_sets``): taking a round's sets over and copying each value into the judge's
    buffers is the harness's cost, not the candidate's."""

    def __init__(self, judge: Any, method: str = "host", let_go: bool = False, sample: Any = None) -> None:
        self.judge = judge
        #: (a set of the case's, its output buffers' layout): the twin's rounds take sets of the
        #: case's own shapes, whose harness cost (their pages first touched, an output of that size
        #: copied) is the candidate's too (None: the first check trial's)
        self.sample = sample
        #: the twin lets go of each calibration round's sets between rounds, outside the bracket
        #: (where the candidate does so too: :data:`.rounds.LET_GO`)
        self.let_go = let_go
        #: what the harness times each call with (the twin's rounds are timed as the candidate's)
        self.method = method
        self.cuda = judge.device == "cuda"
        self.drain = _DRAINS.get(judge.device) or _DRAINS.setdefault(judge.device, drain_for(judge.device))
        self.wall: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        self.rounds: list[tuple[int, float]] = []
        #: (calls, to the answer, the wait after it) of each bracket: the candidate's rounds, and
        #: the twin's best of each size (``metadata.timing_split_us``)
        self.split: list[tuple[int, float, float]] = []
        self.twin_split: dict[int, tuple[float, float]] = {}
        #: what the harness says its calls' host time went to, µs a call: the candidate's rounds
        #: (summed) and the twin's best of each size (shown, never used for a figure)
        self.parts: dict[str, float] = {}
        self.parts_calls = 0
        self.twin_parts: dict[int, dict[str, float]] = {}
        self.notes: list[str] = []
        #: seconds each defence took in this case (``metadata.timing_cost_ms``)
        self.spent: dict[str, float] = {}
        self.twin: Any = None
        #: the CPU window's figure (``cpu1 - cpu0``), and its opening readings: the cgroup's (None:
        #: none) and /proc's, per process
        self.cpu0 = self.cpu1 = 0.0
        self.cgroup0: float | None = None
        self.proc0: dict[tuple[int, int], float] = {}
        #: the candidate's processes found outside its cgroup when the CPU window opened or closed
        self.strayed: list[int] = []
        #: the window's figure came from /proc (processes were outside the cgroup, and /proc's was
        #: the larger)
        self.on_proc = False
        self.limit_s = max(1.0, float(judge.opts.limit("time")))

    # -- the candidate's processes -------------------------------------------------------------

    def _candidate_pids(self) -> list[int]:
        group = getattr(self.judge, "group", None)
        if group is not None:
            return group.pids()
        return tree(self.judge.proc.pid)

    def _cgroup_cpu(self) -> float | None:
        group = getattr(self.judge, "group", None)
        return None if group is None else group.cgroup_cpu_seconds()

    def _drain(self, pids: list[int] | None) -> list[int]:
        """The device work of ``pids`` (None: the candidate's) waited for; those now held."""
        if not self.drain.available:
            return []
        try:
            return self.drain.settle(self._candidate_pids() if pids is None else pids, self.limit_s)
        except DrainFailed as exc:
            if exc.kind == "stopped":
                raise Refused("stopped_process", str(exc)) from None
            if exc.kind == "timeout":
                raise CandidateFailed("timeout", "timeout", str(exc)) from None
            raise CandidateFailed("error", "evaluation_error", str(exc)) from None

    def settle(self, pids: list[int] | None) -> float:
        """Wait for the device work of ``pids`` (the drain), read the clock, let them go on."""
        t0 = time.perf_counter()
        held = self._drain(pids)
        end = time.perf_counter()
        self.drain.release(held)
        if self.drain.available:
            self.spent["drain"] = self.spent.get("drain", 0.0) + time.perf_counter() - t0
        return end

    @contextlib.contextmanager
    def round(self, calls: int) -> Iterator[_Round]:
        """A timed round of ``calls`` calls: pass ``answered`` to the judge's ``ask``."""
        r = _Round(self)
        yield r
        if r.end is not None:
            self.rounds.append((calls, r.end - r.start))
            self.split.append((calls, *r.split()))

    def said(self, calls: int, parts: dict[str, float]) -> None:
        """A timed round's :attr:`Timed.parts_us`, as the candidate's process says them."""
        for k, v in parts_of(parts).items():
            self.parts[k] = self.parts.get(k, 0.0) + v
        self.parts_calls += calls

    def _outside_group(self) -> list[int]:
        """The candidate's processes that are not in its cgroup now (a cpuset shield's partition
        took them for the region, or the candidate moved itself): the cgroup does not count them.
        One that was reaped between the listing and the look at its cgroup is none of them."""
        group = getattr(self.judge, "group", None)
        if group is None or self.cuda or group.path is None:
            return []
        return [p for p in group.pids() if not group.holds(p) and proc_state(p) not in (None, *GONE)]

    def start(self) -> None:
        """The CPU window opens (before the inputs of the first timed round are filled)."""
        if not self.cuda:
            from .account import proc_cpu_reading

            self.strayed = self._outside_group()
            self.cgroup0 = self._cgroup_cpu()
            self.proc0 = proc_cpu_reading(self._candidate_pids())

    @contextlib.contextmanager
    def _spending(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent[what] = self.spent.get(what, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No candidate code runs inside: its device work drained and held (GPU), its processes
        frozen; thawed, then unlocked, on the way out whatever happens (lock before freeze)."""
        with self._spending("hold"):
            held = self._drain(None)
        group = getattr(self.judge, "group", None)
        try:
            if group is not None:
                with self._spending("hold"):
                    group.freeze()
            try:
                yield
            finally:
                if group is not None:
                    with self._spending("hold"):
                        group.thaw()
        finally:
            with self._spending("hold"):
                self.drain.release(held)

    def stop(self) -> None:
        """The CPU window closes (the candidate held: nothing of it runs now): what the candidate
        used in it, in ``cpu1 - cpu0``."""
        if self.cuda:
            return
        from .account import proc_cpu_reading, proc_cpu_since

        self.strayed += self._outside_group()
        cgroup1 = self._cgroup_cpu()
        # /proc's figure counts each process's own difference: one that left during the window
        # takes nothing back (its CPU before the window once came off the total, and hid the work)
        by_proc = proc_cpu_since(self.proc0, proc_cpu_reading(self._candidate_pids()))
        if self.cgroup0 is None or cgroup1 is None:
            used, self.on_proc = by_proc, True
        else:
            used = cgroup1 - self.cgroup0
            # The cgroup misses a process outside it; /proc misses a child that exited unwaited,
            # and counts in 10 ms ticks. Both are lower bounds of what the candidate used: with a
            # process outside, the larger (never /proc's alone: a child reaped mid-look once
            # passed for one, to put the figure on /proc while an unwaited child did the work).
            if self.strayed and by_proc > used:
                used, self.on_proc = by_proc, True
        self.cpu0, self.cpu1 = 0.0, used

    # -- the twin ------------------------------------------------------------------------------------

    def prepare(self, size: int) -> None:
        """The twin found and warmed (its first rounds are slow), before the region."""
        from .spares import spares_for

        with self._spending("twin"):
            try:
                self.twin = spares_for(self.judge.device).twin()
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                self.notes.append(f"no calibration twin ({why}): the round trip is not subtracted")
                self.twin = None
                return
            self._twin_rounds([1, size], record=False)

    def calibrate(self, size: int) -> None:
        """The best of :data:`REPS` no-op rounds of 1 call and of ``size`` calls on the twin (call
        it with the candidate held)."""
        with self._spending("calibration"):
            self._twin_rounds([1, size] * REPS, record=True)

    def finish(self) -> None:
        """The twin lets go of what the calibration left it (it is the next candidate's process)."""
        if self.twin is not None:
            with contextlib.suppress(Exception):
                self.judge.ask(Calibrated(), Ok, proc=self.twin)

    def _twin_rounds(self, sizes: list[int], record: bool) -> None:
        if self.twin is None:
            return
        for calls in sizes:
            sets, shared = self.judge._calibration_sets(calls, self.sample)
            r = _Round(self, [self.twin.pid])
            c0 = harness_cpu(self.twin.pid)
            try:
                body = self.judge.ask(
                    Calibrate(calls=calls, method=self.method, sets=[cs.entry for cs in sets], keep=self.let_go),
                    Timed,
                    shared,
                    proc=self.twin,
                    on_answer=r.answered,
                )
                if self.let_go:  # outside the bracket, as the candidate lets go of its rounds'
                    self.judge.ask(Drop(), Ok, proc=self.twin)
                if not self.cuda:
                    # freed by the judge, as a candidate's round's sets are (``refill``): else the
                    # twin, the last to map them, paid for freeing their pages (12 ms a set of
                    # 48 MiB, where the candidate's letting go costs 0.1 ms), after its answer and
                    # so in the next round's figure or not, as the two processes raced
                    for cs in sets:
                        cs.release()
            except Exception as exc:  # the twin failed (or was killed): no calibration from it
                self.notes.append(f"the calibration twin failed ({type(exc).__name__}: {exc})")
                from .spares import spares_for

                with contextlib.suppress(Exception):
                    spares_for(self.judge.device).drop_twin()
                self.twin = None
                return
            if record and r.end is not None:
                if r.end - r.start < self.wall.get(calls, float("inf")):
                    self.twin_split[calls] = r.split()
                    self.twin_parts[calls] = {k: v / calls for k, v in parts_of(body.parts_us).items()}
                self.wall[calls] = min(self.wall.get(calls, float("inf")), r.end - r.start)
                self.cpu[calls] = min(self.cpu.get(calls, float("inf")), harness_cpu(self.twin.pid) - c0)

    def accounting(self) -> str:
        """Where the outside figure comes from, in words (``metadata.timing_accounting``)."""
        if self.cuda:
            return f"the judge's clock; a round ends at {self.drain.what}"
        group = getattr(self.judge, "group", None)
        if group is not None and (not self.on_proc or group.kind == "proc"):
            return str(group.accounting)
        why = f" (processes {sorted(set(self.strayed))[:4]} were outside its cgroup)" if self.strayed else ""
        return f"/proc: the candidate's processes' own and reaped children's CPU time{why}"

    def split_text(self) -> str:
        """Where a bracket's time goes, us: to the answer and the wait for the device work after
        it, for the candidate's rounds (medians, by size) and the twin's best of each size. Where
        the outside figure and the candidate's disagree, this says which part differs."""
        by_size: dict[int, list[tuple[float, float]]] = {}
        for n, ask, wait in self.split:
            by_size.setdefault(n, []).append((ask, wait))
        parts = []
        for n, pairs in sorted(by_size.items()):
            ask = statistics.median(a for a, _ in pairs) * 1e6
            wait = statistics.median(w for _, w in pairs) * 1e6
            parts.append(f"candidate, {len(pairs)} round(s) of {n} calls: {ask:.0f} + {wait:.0f}")
        if self.parts and self.parts_calls:
            parts[-1] += f" ({said_text({k: v / self.parts_calls for k, v in self.parts.items()})})"
        for n, (ask, wait) in sorted(self.twin_split.items()):
            said = f" ({said_text(self.twin_parts[n])})" if self.twin_parts.get(n) else ""
            parts.append(f"twin, {n} calls: {ask * 1e6:.0f} + {wait * 1e6:.0f}{said}")
        return "; ".join(parts)

    # -- the figure -----------------------------------------------------------------------------------

    def _round_figures(self, per_round: float, per_call: float) -> list[tuple[float, int]]:
        """(us a call, calls) of each round: its bracket less the calibrated round trip."""
        out = []
        for n, t in self.rounds:
            if n > 0:
                used = t - per_round - per_call * n
                out.append(((used if used > 0 else t) / n * 1e6, n))
        return out

    def figure(self, samples: list[float], label: str, name: str) -> Figure:
        """The case's figure from the rounds, the calibration and the candidate's ``samples``."""
        calls = sum(n for n, _ in self.rounds) or len(samples) or 1
        inproc = statistics.fmean(samples) if samples else 0.0
        wall_round, wall_call = _fit(self.wall)
        raw_wall = sum(t for _, t in self.rounds)
        wall = raw_wall - sum(wall_round + wall_call * n for n, _ in self.rounds)
        if wall <= 0:  # calibration noise above the whole bracket: the uncorrected bracket
            wall = raw_wall
        wall_us = wall / calls * 1e6
        if self.cuda:
            outside, overhead = wall_us, wall_call * 1e6
        else:
            cpu_round, cpu_call = _fit(self.cpu)
            raw = self.cpu1 - self.cpu0
            used = raw - sum(cpu_round + cpu_call * n for n, _ in self.rounds)
            outside, overhead = (used if used > 0 else raw) / calls * 1e6, cpu_call * 1e6
            if self.on_proc and wall_us > outside:
                # /proc counts no child that exited unwaited (SIGCHLD ignored: reaped by the
                # kernel), and a process that waits for one uses no CPU: without a cgroup that
                # counts every process, the rounds' wall time is the least the figure can be.
                self.notes.append(
                    f"its processes used {max(outside, 0.0):.3f} us of CPU a call as /proc counts it, "
                    f"less than the {wall_us:.3f} us a call of wall time: the wall time is used"
                )
                outside = wall_us
        outside = max(outside, 0.0)
        slack = max(SHARE * outside, FLOOR_US)
        believed = inproc >= outside - slack
        flat = SampleStats(
            mean=round(outside, 4), std=0.0, min=round(outside, 4), max=round(outside, 4), num_trials=len(samples)
        )
        fig = Figure(
            outside=outside,
            inprocess=inproc,
            believed=believed,
            stats=flat,
            method=label,
            wall=None if self.cuda else wall_us,
            roundtrip=self.wall[min(self.wall)] * 1e6 if self.wall else 0.0,
            overhead=overhead,
        )
        if self.cuda and believed:
            fig.stats = stats(samples)
        elif self.cuda and self.rounds:
            # the spread the judge saw: each round's figure, once for each of its calls (one round
            # alone has none to show)
            st = stats([v for v, n in self._round_figures(wall_round, wall_call) for _ in range(n)])
            mean = round(outside, 4)
            st.mean, st.min, st.max = mean, min(st.min, mean), max(st.max, mean)
            fig.stats = st
        elif not self.cuda and inproc > 0:
            # a CPU's figure is always the judge's; the spread is the candidate's, scaled to it
            fig.stats = stats([s * outside / inproc for s in samples])
        what = "CPU time of its cgroup" if not self.cuda else "from outside its process"
        if not believed:
            fig.text = (
                f"{name or 'forward'}: the candidate's process reported {inproc:.3f} us a call; {what} it took "
                f"{outside:.3f} us a call: the outside figure is used"
            )
            if self.cuda:
                fig.method = f"outside (the {label} figure was below it)"
        return fig
