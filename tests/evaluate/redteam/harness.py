"""How a cheat of the corpus is judged: shared by the CPU tests, the GPU tests and
benchmarks/eval/redteam.py. :func:`judge_cheat` evaluates the honest twin, the cheat and what its
checks ask for after it, and says what was forged (nothing, for an evaluator that stops it)."""

from __future__ import annotations

import os
import signal
import site
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krex_lab.evaluate import Evaluation, evaluate

from . import PROBLEMS, Cheat

#: the phase limits of the cheats that spend 10 s in one call ("limit")
SHORT = {"load": 120.0, "check": 3.0, "time": 30.0}
#: what a forged time is off by (30-1000x) against what noise on a shared CPU is (< 2x)
SLACK = 3.0
DAEMON_NAME = "krexrt-"
PLANTED = "# krexrt-planted"

#: judge(problem, candidate (path or source text), **options) -> Evaluation
Judge = Callable[..., Evaluation]


def make_judge(pool: Any, limits: dict[str, float], **defaults: Any) -> Judge:
    """A judge on ``pool`` (a PoolProc) with ``limits`` and other evaluate() options by default."""

    def go(problem: str, candidate: str | Path, **options: Any) -> Evaluation:
        options = {"timeouts": limits, **defaults, **options}
        return evaluate(PROBLEMS / problem / "reference.py", candidate, pool=pool.client, **options)

    return go


@dataclass
class Record:
    """One cheat judged: ``found`` says what was forged (empty: nothing)."""

    cheat: Cheat
    twin: Evaluation
    ev: Evaluation
    found: list[str] = field(default_factory=list)
    later: list[tuple[str, Evaluation]] = field(default_factory=list)


class Baselines:
    """The plain ``honest.py`` / ``slow.py`` of each problem, evaluated once (before any cheat
    that could change what later evaluations see)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], Evaluation] = {}

    def get(self, judge: Judge, problem: str, name: str, again: bool = False) -> Evaluation:
        if again or (problem, name) not in self.seen:
            ev = judge(problem, PROBLEMS / problem / f"{name}.py")
            if ev.verdict != "correct" or ev.runtime <= 0:
                raise AssertionError(f"the plain {name} candidate of {problem}: {ev.summary}")
            self.seen[(problem, name)] = ev
        return self.seen[(problem, name)]


def forged_speed(ev: Evaluation, twin: Evaluation) -> str | None:
    """Why ``ev`` is a forged ``correct`` against its honest twin (None: it is not)."""
    if ev.verdict != "correct":
        return None
    if 0 <= ev.runtime < twin.runtime / SLACK:  # 0: a figure that came out at or below zero
        return f"correct at {ev.runtime:.2f} us, its honest twin takes {twin.runtime:.2f} us"
    if ev.ref_runtime > twin.ref_runtime * SLACK:
        return f"reference time {ev.ref_runtime:.2f} us, honestly {twin.ref_runtime:.2f} us"
    return None


def daemons() -> list[int]:
    """Processes a cheat started and named ``krexrt-*``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(DAEMON_NAME):
                found.append(int(entry))
    return found


def clean_up(pythonpath: str) -> list[Path]:
    """What cheats leave, removed whatever the evaluator did: each daemon they named killed by
    its pid, each file they planted for later interpreters deleted (returned: workers started
    while one was there ran it)."""
    for pid in daemons():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    dirs = [Path(d) for d in pythonpath.split(os.pathsep) if d]
    dirs += [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages(), *sys.path] if p]
    removed = []
    for d in dirs:
        for name in ("sitecustomize.py", "usercustomize.py"):
            path = d / name
            try:
                if path.is_file() and path.read_text().startswith(PLANTED):
                    path.unlink()
                    removed.append(path)
            except OSError:
                pass
    return removed


def recycle_workers(pool: Any, timeout: float = 120) -> None:
    """Every worker of ``pool`` (a PoolProc) replaced: the next evaluations run in interpreters
    started after the cheat (what a file it planted for new interpreters would reach, what it did
    to its judge's process). Waits until none of the old workers is listed any more: a pool that
    has not yet seen one die still counts it ready."""
    old = set(pool.worker_pids())
    for pid in old:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        status = pool.status()
        if status.ready and not status.running and not status.queue and not old & set(pool.worker_pids(status=status)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the pool's workers were not replaced within {timeout} s: {status}")
        time.sleep(0.05)


def _denied(ev: Any) -> bool:
    """The cheat was stopped by the candidate's sandbox (a signal to the judge refused): it ran
    no time past the limit at all, and its verdict names the denial."""
    text = str(ev.metadata.get("runtime_error", ""))
    return ev.verdict == "runtime_error" and ("Operation not permitted" in text or "Permission denied" in text)


def judge_cheat(cheat: Cheat, judge: Judge, pool: Any, baselines: Baselines, limits: dict[str, float]) -> Record:
    """The honest twin (which also caches an honest reference time), then the cheat, then what its
    checks ask for; the twin must be correct at the plain honest candidate's speed."""
    honest = baselines.get(judge, cheat.problem, "honest")
    slow = baselines.get(judge, cheat.problem, "slow") if "next" in cheat.checks else None
    twin = judge(cheat.problem, cheat.twin(), retime_reference=True)
    if twin.verdict == "timeout":
        # out of time on a busy 2-core machine (two evaluations at once beside the rest of a whole
        # run: two honest twins of 72 once ran past 30 s): judged again before it is blamed
        twin = judge(cheat.problem, cheat.twin(), retime_reference=True)
    if twin.verdict != "correct":
        raise AssertionError(f"the honest twin of {cheat.name}: {twin.summary}")
    if not honest.runtime / SLACK <= twin.runtime <= honest.runtime * SLACK:
        # a baseline or a twin measured while the host was busier (the pool's first evaluations,
        # other work on a shared machine) is measured again before the twin is blamed
        honest = baselines.get(judge, cheat.problem, "honest", again=True)
        if not honest.runtime / SLACK <= twin.runtime <= honest.runtime * SLACK:
            twin = judge(cheat.problem, cheat.twin(), retime_reference=True)
            if twin.verdict != "correct":
                raise AssertionError(f"the honest twin of {cheat.name}: {twin.summary}")
    if not honest.runtime / SLACK <= twin.runtime <= honest.runtime * SLACK:
        raise AssertionError(f"the honest twin of {cheat.name}: {twin.summary}; the plain one: {honest.summary}")
    extra = {"retime_reference": True} if cheat.retime else {}
    ev = judge(cheat.problem, cheat.path, timeouts=SHORT if "limit" in cheat.checks else limits, **extra)
    left = daemons()
    rec = Record(cheat, twin, ev)
    if "speed" in cheat.checks and (why := forged_speed(ev, twin)):
        # a forged time is 10-1000x off; a busy shared host can put an honest one past the slack
        # now and then: a forgery counts when the cheat and its twin, judged again, show it again
        twin2 = judge(cheat.problem, cheat.twin(), retime_reference=True)
        ev2 = judge(cheat.problem, cheat.path, timeouts=limits, **extra)
        rec.later += [("twin again", twin2), ("cheat again", ev2)]
        if twin2.verdict == "correct" and (again := forged_speed(ev2, twin2)):
            rec.found.append(f"{why}; again: {again}")
    if "wrong" in cheat.checks:
        # wrong in a share of its timed calls only, it passes the random re-checks by luck or not
        # at all: judged four times in all, it is never `correct`
        again = [ev] + [judge(cheat.problem, cheat.path, timeouts=limits, **extra) for _ in range(3)]
        rec.later += [("cheat again", e) for e in again[1:]]
        passed = [f"{e.summary}" for e in again if e.verdict == "correct"]
        if passed:
            rec.found.append(f"wrong outputs judged correct in {len(passed)} of 4: {passed[0]}")
    if "limit" in cheat.checks and ev.verdict != "timeout" and not _denied(ev):
        rec.found.append(f"it spent 10 s in one call with a check limit of 3 s: {ev.verdict}, not timeout")
    if "daemon" in cheat.checks and left:
        rec.found.append(f"its process(es) {left} outlived the evaluation")
    if "cache" in cheat.checks:
        for _ in range(2):  # a reference time it spoiled stays spoiled: seen twice, not once by noise
            after = judge(cheat.problem, PROBLEMS / cheat.problem / "honest.py")
            rec.later.append(("honest", after))
            if after.ref_runtime <= twin.ref_runtime * SLACK:
                break
        else:
            rec.found.append(
                f"the next candidate's reference time is {after.ref_runtime:.2f} us, honestly {twin.ref_runtime:.2f}"
            )
    if "recycle" in cheat.checks:
        recycle_workers(pool)
    if slow is not None:
        for name in ("wrong", "slow"):
            for _ in range(2):  # until one ran where the cheat ran (the same worker)
                later = judge(cheat.problem, PROBLEMS / cheat.problem / f"{name}.py")
                rec.later.append((name, later))
                if name == "wrong" and later.verdict == "correct":
                    rec.found.append(f"a wrong candidate evaluated next is correct: {later.summary}")
                # a judge that refuses to decide (it found planted start-up code) forges nothing
                refused = later.verdict == "error" and "refuses to decide" in later.summary
                if name == "slow" and later.verdict != "correct" and not refused:
                    rec.found.append(f"a slow honest candidate evaluated next: {later.summary}")
                if name == "slow" and (why := forged_speed(later, slow)):
                    # what the cheat left on its worker is there for the next one too: judged again
                    # where it ran, it shows again; noise does not
                    slow_again = _where(judge, cheat.problem, "slow.py", ev.worker_pid)
                    rec.later.append((name, slow_again))
                    slow = baselines.get(judge, cheat.problem, "slow", again=True)  # the baseline too
                    if forged_speed(slow_again, slow):
                        rec.found.append(f"a slow candidate evaluated next: {why}")
                if later.worker_pid == ev.worker_pid:
                    break
    return rec


def _where(judge: Judge, problem: str, candidate: str, worker_pid: int | None, tries: int = 3) -> Evaluation:
    """``candidate`` of ``problem`` judged until it ran on ``worker_pid`` (or ``tries`` times)."""
    for _ in range(tries):
        ev = judge(problem, PROBLEMS / problem / candidate)
        if ev.worker_pid == worker_pid:
            break
    return ev


def summary(rec: Record) -> dict[str, Any]:
    """One judged cheat as plain data: its verdict and times beside its twin's, what was forged."""

    def brief(ev: Evaluation) -> dict[str, Any]:
        return {
            "verdict": ev.verdict,
            "runtime_us": ev.runtime,
            "ref_runtime_us": ev.ref_runtime,
            "summary": ev.summary,
        }

    return {
        "cheat": rec.cheat.name,
        "problem": rec.cheat.problem,
        "class": rec.cheat.kind,
        "defence": rec.cheat.defence,
        "cheat_eval": brief(rec.ev),
        "twin_eval": brief(rec.twin),
        "later": [{"candidate": name, **brief(ev)} for name, ev in rec.later],
        "forged": rec.found,
    }
