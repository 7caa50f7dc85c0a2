"""How a cheat of the corpus is judged: shared by the CPU tests, the GPU tests and
benchmarks/redteam.py. :func:`judge_cheat` evaluates the honest twin, the cheat and what its
checks ask for after it, and says what was forged (nothing, for an evaluator that stops it)."""

from __future__ import annotations

import os
import signal
import site
import sys
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

    def get(self, judge: Judge, problem: str, name: str) -> Evaluation:
        if (problem, name) not in self.seen:
            ev = judge(problem, PROBLEMS / problem / f"{name}.py")
            if ev.verdict != "correct" or ev.runtime <= 0:
                raise AssertionError(f"the plain {name} candidate of {problem}: {ev.summary}")
            self.seen[(problem, name)] = ev
        return self.seen[(problem, name)]


def forged_speed(ev: Evaluation, twin: Evaluation) -> str | None:
    """Why ``ev`` is a forged ``correct`` against its honest twin (None: it is not)."""
    if ev.verdict != "correct":
        return None
    if 0 < ev.runtime < twin.runtime / SLACK:
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


def clean_up(pythonpath: str) -> None:
    """What cheats leave, removed whatever the evaluator did: each daemon they named killed by
    its pid, each file they planted for later interpreters deleted."""
    for pid in daemons():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    dirs = [Path(d) for d in pythonpath.split(os.pathsep) if d]
    dirs += [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages(), *sys.path] if p]
    for d in dirs:
        for name in ("sitecustomize.py", "usercustomize.py"):
            path = d / name
            try:
                if path.is_file() and path.read_text().startswith(PLANTED):
                    path.unlink()
            except OSError:
                pass


def recycle_workers(pool: Any) -> None:
    """Every worker of ``pool`` (a PoolProc) replaced: the next evaluations run in interpreters
    started after the cheat (what a file it planted for new interpreters would reach)."""
    for pid in pool.worker_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pool.wait_ready(120)


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
    if twin.verdict != "correct":
        raise AssertionError(f"the honest twin of {cheat.name}: {twin.summary}")
    if not honest.runtime / SLACK <= twin.runtime <= honest.runtime * SLACK:
        raise AssertionError(f"the honest twin of {cheat.name}: {twin.summary}; the plain one: {honest.summary}")
    ev = judge(cheat.problem, cheat.path, timeouts=SHORT if "limit" in cheat.checks else limits)
    left = daemons()
    rec = Record(cheat, twin, ev)
    if "speed" in cheat.checks and (why := forged_speed(ev, twin)):
        rec.found.append(why)
    if "limit" in cheat.checks and ev.verdict != "timeout" and not _denied(ev):
        rec.found.append(f"it spent 10 s in one call with a check limit of 3 s: {ev.verdict}, not timeout")
    if "daemon" in cheat.checks and left:
        rec.found.append(f"its process(es) {left} outlived the evaluation")
    if "cache" in cheat.checks:
        after = judge(cheat.problem, PROBLEMS / cheat.problem / "honest.py")
        rec.later.append(("honest", after))
        if after.ref_runtime > twin.ref_runtime * SLACK:
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
                    rec.found.append(f"a slow candidate evaluated next: {why}")
                if later.worker_pid == ev.worker_pid:
                    break
    return rec
