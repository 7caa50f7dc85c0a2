"""The region's promises on a GPU, at the arbiter level: a real ``krex arbiter --backend nvidia``,
real CUDA processes (torch, :mod:`tests.gpu.procs_cuda`), real locks, signals and NVML.

Marker ``gpu``: skipped where no NVIDIA GPU answers NVML (tests/gpu/conftest.py), where torch
is missing, or where the driver cannot lock.

Process layout: the holder and every victim are *separate children of the test process*. The
arbiter exempts the holder's lineage (its descendants and its ancestors, so the test process
too), itself and its guardian; a victim must therefore never be the holder's child or parent.
The test process itself never creates a CUDA context (its :class:`Probe` calls only cuInit,
NVML and ``cuCheckpointProcessGetState``).

Each test collects every failed expectation and reports them together, followed by a
timeline (seconds relative to the grant), the region report, each child's output and the
arbiter's debug log, so that one run on the device is enough to understand a failure. The
same text, for passed tests too (the numbers for the closing note), is written to
``$KREX_GPU_DIAG/regions_nvidia/<test>.txt`` (else ``$OUT/...``) when either is set.

    python3 -m pytest -q -rA -m gpu tests/gpu/test_regions_nvidia.py     # about 1-2 min on the H200
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab import protocol
from krex_lab.gpu.nvidia import NvidiaBackend
from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the CUDA children need torch"),
]

GPU = 0
WORK_S = 0.4  # queued matmuls in the victim when the holder asks
HOLD_S = 1.0  # how long a region is held while the test watches
TOL_S = 0.005  # a tick may carry a timestamp this much after the grant (taken after its op ended)
RELEASE_S = 1.0  # everything RUNNING and thawed within 1 s of a SIGKILL
READY_S = 90.0  # import torch (3-4 s) + context, several children at once


# -- helpers ----------------------------------------------------------------------------------


def thread_states(pid: int) -> str:
    """The state letters of all threads of ``pid`` ("" when gone), e.g. "SSR" or "TTT"."""
    letters = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return ""
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        letters.append(raw[raw.rfind(")") + 2])
    return "".join(letters)


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    states = thread_states(pid)
    return bool(states) and states[0] not in "ZX"


def stopped(pid: int) -> bool:
    return any(c in "Tt" for c in thread_states(pid))


class Probe:
    """The driver's checkpoint state and NVML's process list, read from the test process.

    A stopped process is never asked (the driver may hang on it, as its lock does); every
    driver call runs in a thread under a deadline, so a hang fails a check instead of the run.
    """

    def __init__(self, backend: NvidiaBackend) -> None:
        self.be = backend

    def state(self, pid: int, timeout: float = 2.0) -> str:
        """RUNNING / LOCKED / CHECKPOINTED / FAILED, or why not: gone, stopped(..), error: .., hang."""
        if not alive(pid):
            return "gone"
        if stopped(pid):
            return f"stopped({thread_states(pid)})"
        box: list[str] = []

        def ask() -> None:
            try:
                box.append(self.be.checkpoint_state(pid).name)
            except Exception as exc:
                box.append(f"error: {exc}")

        th = threading.Thread(target=ask, daemon=True)
        th.start()
        th.join(timeout)
        return box[0] if box else f"hang(>{timeout:g}s)"

    def on_gpu(self, pid: int) -> bool:
        try:
            return pid in [p.pid for p in self.be.processes(GPU)]
        except Exception:
            return False


class Child:
    """A :mod:`tests.gpu.procs_cuda` process; its output pumped into lines and ticks."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.gpu.procs_cuda", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[tuple[float, str]] = []  # (arrival time, line) except ticks
        self.ticks: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        self._used: set[int] = set()
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            tick = None
            if len(words) == 3 and words[0].endswith("tick"):
                try:
                    tick = (float(words[1]), float(words[2]))
                except ValueError:
                    tick = None
            with self._cond:
                if tick is not None:
                    self.ticks[words[0][: -len("tick")]].append(tick)
                else:
                    self.lines.append((time.time(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self.lines.append((time.time(), f"<EOF, exit code {self.proc.wait()}>"))
            self._cond.notify_all()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def find(self, word: str) -> list[str] | None:
        """The first unused line starting with ``word`` (marked used), or None; never waits."""
        with self._cond:
            for i, (_, line) in enumerate(self.lines):
                if i not in self._used and line.split()[:1] == [word]:
                    self._used.add(i)
                    return line.split()
        return None

    def has(self, word: str) -> bool:
        """Whether any line (used or not) starts with ``word``; never waits."""
        with self._cond:
            return any(line.split()[:1] == [word] for _, line in self.lines)

    def expect(self, word: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self.find(word)
                if found is not None:
                    return found
                if self.proc.poll() is not None and self.lines and self.lines[-1][1].startswith("<EOF"):
                    raise AssertionError(f"{self.name} exited before saying {word!r}:\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name} said no {word!r} within {timeout:g} s:\n{self.tail()}")
                self._cond.wait(min(left, 0.2))

    def expect_json(self, word: str, timeout: float) -> dict[str, Any]:
        line = self.expect(word, timeout)
        return json.loads(" ".join(line[1:]))  # type: ignore[no-any-return]

    def tick_count(self, prefix: str = "") -> int:
        with self._cond:
            return len(self.ticks[prefix])

    def tail(self, n: int = 40) -> str:
        with self._cond:
            lines = [f"    {t:.3f} {line[:400]}" for t, line in self.lines[-n:]]
        return f"  {self.name} (pid {self.pid}, args {self.args}):\n" + "\n".join(lines)


class Kids:
    """Children of the test process; continued and killed (whole trees) at teardown."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: list[Child] = []

    def start(self, name: str, *args: str) -> Child:
        child = Child(name, list(args), self.env)
        self.children.append(child)
        return child

    def cleanup(self) -> None:
        for child in self.children:
            try:
                procs = [*psutil.Process(child.pid).children(recursive=True), psutil.Process(child.pid)]
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except psutil.Error:
                    pass
            try:
                child.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


class ArbiterLog:
    """Drains the arbiter's stdout (a full pipe would block it) and keeps it for diagnostics."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=400)
        self.proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        last, repeats = "", 0
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            body = line[24:]  # past "YYYY-MM-DD HH:MM:SS,mmm ": a poll may log the same thing 10 times a second
            if body and body == last:
                repeats += 1
                continue
            if repeats:
                self.lines.append(f"    (previous message repeated {repeats} more times)")
            last, repeats = body, 0
            self.lines.append(line)

    def tail(self, n: int = 80) -> str:
        return "\n".join(f"    {line[:400]}" for line in list(self.lines)[-n:])


class Findings:
    """Expectations collected over a test, reported together with the diagnostics."""

    def __init__(self, name: str, arbiter: ArbiterProc, log: ArbiterLog, kids: Kids) -> None:
        self.name = name
        self.finished = False
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.events: list[tuple[float, str]] = []
        self.reports: dict[str, Any] = {}
        self.base = 0.0
        self.arbiter = arbiter
        self.log = log
        self.kids = kids

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)

    def event(self, what: str, t: float | None = None) -> float:
        t = time.time() if t is None else t
        self.events.append((t, what))
        return t

    def rel(self, t: float) -> str:
        return f"{t - self.base:+.4f}s"

    def ticks(self, child: Child, prefix: str = "", lo: float = -1e18, hi: float = 1e18, n: int = 12) -> str:
        """Ticks of ``child`` whose end falls in [lo, hi], first and last ``n // 2``, relative times."""
        sel = [(tb, ta) for tb, ta in list(child.ticks[prefix]) if lo <= ta <= hi]
        shown = sel if len(sel) <= n else [*sel[: n // 2], None, *sel[-n // 2 :]]
        parts = ["..." if x is None else f"[{self.rel(x[0])} .. {self.rel(x[1])}]" for x in shown]
        return f"{len(sel)} ticks: " + ", ".join(parts)

    def render(self) -> str:
        out = [f"{len(self.failures)} failed expectation(s):"]
        if not self.finished:
            out[0] = f"(test stopped early, see its traceback) {out[0]}"
        out += [f"  - {f}" for f in self.failures]
        if self.notes:
            out += ["notes:"] + [f"  - {n}" for n in self.notes]
        out.append(f"timeline (relative to t={self.base:.6f}):")
        out += [f"  {self.rel(t)}  {what}" for t, what in sorted(self.events)]
        for name, report in self.reports.items():
            out.append(f"{name}: {json.dumps(report, sort_keys=True)}")
        for child in self.kids.children:
            out.append(child.tail())
            for prefix in list(child.ticks):
                out.append(f"    {prefix or ''}ticks: {self.ticks(child, prefix)}")
        out.append(f"arbiter log (pid {self.arbiter.proc.pid if self.arbiter.proc else '?'}):")
        out.append(self.log.tail())
        return "\n".join(out)

    def done(self) -> None:
        self.finished = True
        assert not self.failures, self.render()

    def save(self) -> None:
        """Write the diagnostics of every run, passed or not, under $KREX_GPU_DIAG (else $OUT), if set."""
        root = os.environ.get("KREX_GPU_DIAG") or os.environ.get("OUT")
        if not root:
            return
        verdict = "PASSED" if self.finished and not self.failures else "FAILED"
        safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in self.name).strip("_")
        path = Path(root) / "regions_nvidia" / f"{safe}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{verdict} {self.name}\n{self.render()}\n")
        except OSError:
            pass


def until(pred: Callable[[], bool], timeout: float, interval: float = 0.005) -> float | None:
    """Seconds until ``pred()`` held, or None if it did not within ``timeout``."""
    t0 = time.monotonic()
    while True:
        if pred():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(interval)


def regions(endpoint: str) -> list[dict[str, Any]]:
    from krex_lab.client import Connection

    conn = Connection(endpoint)
    try:
        return conn.call(protocol.Regions(limit=5), timeout=5.0)  # type: ignore[no-any-return]
    finally:
        conn.close()


def report_checks(f: Findings, report: dict[str, Any], what: str) -> None:
    f.check(
        report.get("backend") == "nvidia" and report.get("simulated") is False,
        f"{what}: backend {report.get('backend')!r}, simulated {report.get('simulated')!r} (want nvidia, False)",
    )
    f.check(report.get("lock_capable") is True, f"{what}: lock_capable is {report.get('lock_capable')!r}")


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def probe() -> Iterator[Probe]:
    be = NvidiaBackend()
    if not be.capabilities.lock:
        be.close()
        pytest.skip(f"this driver cannot lock: {be.capabilities.reason}")
    try:
        yield Probe(be)
    finally:
        be.close()


@pytest.fixture
def nv(tmp_path: Path, probe: Probe, request: pytest.FixtureRequest) -> Iterator[Findings]:
    """A real ``krex arbiter --backend nvidia`` (guardian on, debug log), a Kids pool using it, and
    the test's Findings (saved at teardown, see :meth:`Findings.save`)."""
    from krex_lab import client

    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=1, extra=("--debug",), backend="nvidia")
    arb.start()
    assert arb.proc is not None
    log = ArbiterLog(arb.proc)
    info = client.hello(arb.endpoint, timeout=5.0)
    assert info["backend"] == "nvidia" and info["capabilities"]["lock"], f"arbiter cannot lock: {info}"
    kids = Kids({**arb.env(), "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONUNBUFFERED": "1"})
    findings = Findings(request.node.name, arb, log, kids)
    try:
        yield findings
    finally:
        findings.save()
        kids.cleanup()
        arb.stop()


def start_holder(kids: Kids, *extra: str) -> Child:
    holder = kids.start("holder", "holder", str(GPU), *extra)
    holder.expect("ready", 60)
    return holder


def grant(f: Findings, holder: Child) -> dict[str, Any]:
    holder.send("acquire")
    granted = holder.expect_json("granted", 60)
    f.reports["granted report"] = granted
    f.base = granted["t"]
    f.event("holder asked for the region", granted["t_req"])
    f.event("grant arrived at the holder", granted["t"])
    return granted


def release(f: Findings, holder: Child) -> dict[str, Any]:
    holder.send("release")
    released = holder.expect_json("released", 30)
    f.reports["released report"] = released
    f.event("holder sends release", released["t_rel0"])
    f.event("release returned", released["t_rel1"])
    return released


# -- 1 + 2a: queued work delays the grant; the victim's CUDA blocks until release ------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["session", "foreign"])
def test_grant_waits_for_queued_work_and_victim_blocks_until_release(kind: str, nv: Findings, probe: Probe) -> None:
    """``session``: a KREX sibling (attach(gpu=0)): drained, locked *and* frozen.
    ``foreign``: a CUDA process KREX does not know: locked only (lock_foreign), never frozen, so
    what stops its CUDA calls inside the region is the driver's lock alone.

    Both have ~0.4 s of matmuls queued when the holder asks. The grant must arrive after the
    GPU finished that work (measured by the victim's CUDA events, see procs_cuda), no victim
    CUDA call may complete between grant and release, and the victim resumes after release.
    """
    f = nv
    kids = f.kids
    victim = kids.start(f"{kind}-victim", "victim", *(["--attach", str(GPU)] if kind == "session" else []))
    holder = start_holder(kids, "--max-hold", "60")
    ready = victim.expect("ready", READY_S)
    f.notes.append(f"victim pid {victim.pid}: one 8192² matmul {float(ready[1]) * 1e3:.2f} ms, session {ready[2]}")

    victim.send(f"work {WORK_S}")
    _, t0_s, tq_s, reps = victim.expect("queued", 30)
    t0, tq = float(t0_s), float(tq_s)
    granted = grant(f, holder)
    t_grant = granted["t"]
    f.event(f"victim starts its queued work ({reps} matmuls)", t0)
    f.event("victim finished enqueueing", tq)

    # Watch the held region: the victim's threads (and, if not stopped, the driver's state).
    samples: list[tuple[float, str, str]] = []
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:
        samples.append((time.time(), thread_states(victim.pid), probe.state(victim.pid)))
        time.sleep(0.1)
    released = release(f, holder)
    t_rel0 = released["t_rel0"]
    resumed = until(lambda: any(ta > t_rel0 for _, ta in victim.ticks[""]), 5.0)
    after = probe.state(victim.pid)
    victim.send("report")
    elapsed = float(victim.expect("elapsed", 30)[1])
    done = t0 + elapsed
    f.event(f"victim's queued work finished on the GPU (t0 + {elapsed:.4f} s of its events)", done)
    first_tick = next((ta for _, ta in victim.ticks[""] if ta > tq), None)
    if first_tick is not None:
        f.event("victim's first tick after queueing (its synchronize returned)", first_tick)
    f.notes.append(
        "samples while held (time, thread states, driver state): "
        + "; ".join(f"{f.rel(t)} {th} {st}" for t, th, st in samples)
    )
    f.notes.append(f"victim ticks around the region: {f.ticks(victim, lo=t_grant - 0.5, hi=t_rel0 + 1.0)}")
    f.notes.append(f"after release: driver state {after}, threads {thread_states(victim.pid)}")

    # the queued work was real and the grant came after it
    f.check(
        0.5 * WORK_S <= elapsed <= 5 * WORK_S,
        f"the victim's queued work took {elapsed:.3f} s on the GPU (wanted about {WORK_S} s): test setup",
    )
    f.check(
        t_grant >= done,
        f"the grant arrived {(done - t_grant) * 1e3:.1f} ms BEFORE the victim's queued work "
        f"finished (grant {f.rel(t_grant)}, work done {f.rel(done)})",
    )
    # no victim CUDA call completed inside the region, and it resumed after
    inside = [(tb, ta) for tb, ta in victim.ticks[""] if t_grant + TOL_S < ta < t_rel0]
    f.check(
        not inside,
        f"{len(inside)} victim CUDA calls completed inside the region: "
        + ", ".join(f"[{f.rel(tb)} .. {f.rel(ta)}]" for tb, ta in inside[:10]),
    )
    f.check(resumed is not None, "the victim made no CUDA progress within 5 s of the release")
    # the report and the states
    report_checks(f, granted, "granted report")
    f.check(victim.pid in granted["locked"], f"victim {victim.pid} not in the report's locked {granted['locked']}")
    f.check(victim.pid in granted["drained"], f"victim {victim.pid} not in drained {granted['drained']}")
    f.check(
        granted["degraded"] is False,
        f"region degraded: not_drained {granted['not_drained']}, failures {granted['failures']}",
    )
    f.check(after == "RUNNING", f"after release the victim's driver state is {after}, not RUNNING")
    f.check(not stopped(victim.pid), f"after release the victim is still stopped: {thread_states(victim.pid)}")
    if kind == "session":
        f.check(victim.pid in granted["frozen"], f"session victim not frozen: frozen {granted['frozen']}")
        f.check(all("T" in th for _, th, _ in samples), "the session victim was not stopped throughout the region")
    else:
        f.check(victim.pid not in granted["frozen"], "a foreign (non-session) process was frozen")
        f.check(
            all(st == "LOCKED" for _, _, st in samples),
            "the foreign victim's driver state was not LOCKED throughout the region",
        )
        f.check(not any("T" in th for _, th, _ in samples), "the foreign victim was stopped: lock alone was wanted")
    slack = granted.get("drain_s", 0.0) - elapsed
    if slack > 0.5:
        warnings.warn(
            f"[{kind}] the drain took {granted.get('drain_s'):.3f} s for {elapsed:.3f} s of queued work: "
            "the cooperative drain waited for its timeout (see the report)",
            stacklevel=1,
        )
    f.done()


# -- 2b: a CUDA process that starts mid-region is found and locked ----------------------------


@pytest.mark.timeout(180)
def test_cuda_process_starting_mid_region_is_locked(nv: Findings, probe: Probe) -> None:
    f = nv
    kids = f.kids
    holder = start_holder(kids, "--max-hold", "120")
    granted = grant(f, holder)
    intruder = kids.start("intruder", "victim", "--autostart")
    f.event(f"intruder {intruder.pid} started (import torch, context, then ticks)")

    seen: dict[str, float] = {}
    states: list[tuple[float, str]] = []

    def watch() -> bool:
        now = time.time()
        if "nvml" not in seen and probe.on_gpu(intruder.pid):
            seen["nvml"] = f.event("NVML lists the intruder", now)
        st = probe.state(intruder.pid, timeout=1.0)
        if not states or states[-1][1] != st:
            states.append((now, st))
        if st == "LOCKED":
            seen["locked"] = f.event("the driver reports the intruder LOCKED", now)
            return True
        # give up 3 s after the process is on the GPU (it should be locked after ~poll_interval), or
        # 5 s after its first CUDA op returned if NVML never lists it
        if "ctx" not in seen and (ctx := intruder.find("ctx")) is not None:
            seen["ctx"] = f.event("intruder's context exists (its first CUDA op returned)", float(ctx[1]))
        return (
            intruder.proc.poll() is not None
            or ("nvml" in seen and now - seen["nvml"] > 3.0)
            or ("ctx" in seen and now - seen["ctx"] > 5.0)
        )

    until(watch, READY_S, interval=0.02)
    if "ctx" not in seen and (ctx := intruder.find("ctx")) is not None:
        f.event("intruder's context exists (its first CUDA op returned; after its lock?)", float(ctx[1]))
    held: list[str] = []
    if "locked" in seen:
        end = time.monotonic() + HOLD_S
        while time.monotonic() < end:
            held.append(probe.state(intruder.pid))
            time.sleep(0.1)
    released = release(f, holder)
    t_rel0 = released["t_rel0"]
    resumed = until(lambda: any(ta > t_rel0 for _, ta in intruder.ticks[""]), 10.0)
    after = probe.state(intruder.pid)
    f.notes.append("intruder driver states: " + "; ".join(f"{f.rel(t)} {s}" for t, s in states))
    f.notes.append(f"states while watched LOCKED: {held}; after release: {after}")

    f.check("nvml" in seen, "the intruder never appeared in NVML's process list while the region was held")
    f.check("locked" in seen, "the intruder was never LOCKED while the region was held")
    if "locked" in seen and "nvml" in seen:
        f.check(
            seen["locked"] - seen["nvml"] <= 1.0,
            f"locked {seen['locked'] - seen['nvml']:.3f} s after NVML listed it (poll_interval is 0.1 s)",
        )
    f.check(all(s == "LOCKED" for s in held), f"the intruder did not stay LOCKED: {held}")
    t_lock = seen.get("locked", t_rel0)
    late = [(tb, ta) for tb, ta in intruder.ticks[""] if t_lock + TOL_S < ta < t_rel0]
    f.check(not late, f"{len(late)} intruder CUDA calls completed after it was seen LOCKED, inside the region")
    early = [(tb, ta) for tb, ta in intruder.ticks[""] if granted["t"] < ta < t_lock]
    if early:
        f.notes.append(
            f"{len(early)} intruder ticks inside the region before it was seen LOCKED (or before the "
            f"release, if never): {f.ticks(intruder, lo=granted['t'], hi=t_lock)}"
        )
        if "nvml" in seen:
            f.check(
                early[-1][1] - seen["nvml"] <= 1.0,
                f"the intruder made CUDA progress {early[-1][1] - seen['nvml']:.3f} s after NVML listed it",
            )
    f.check(
        intruder.pid in released["intruders"],
        f"intruder {intruder.pid} not in the report's intruders {released['intruders']}",
    )
    f.check(intruder.pid in released["locked"], f"intruder {intruder.pid} not in locked {released['locked']}")
    f.check(str(intruder.pid) not in released["not_drained"], f"intruder not drained: {released['not_drained']}")
    f.check(resumed is not None, "the intruder made no CUDA progress within 10 s of the release")
    f.check(after == "RUNNING", f"after release the intruder's driver state is {after}")
    report_checks(f, released, "released report")
    f.done()


# -- 3: SIGKILL of the holder / of the arbiter inside a region --------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("who", ["holder", "arbiter"])
def test_sigkill_inside_region_unlocks_and_thaws_within_1s(who: str, nv: Findings, probe: Probe) -> None:
    """A KREX session (locked + frozen) and a foreign CUDA process (locked) are victims; then the
    holder (its session dies: the arbiter undoes) or the arbiter (its guardian undoes) is
    SIGKILLed. Both victims must be thawed and RUNNING in the driver within 1 s, and resume."""
    f = nv
    arb, kids = f.arbiter, f.kids
    session = kids.start("session-victim", "victim", "--attach", str(GPU))
    foreign = kids.start("foreign-victim", "victim")
    holder = start_holder(kids, "--max-hold", "60")
    for v in (session, foreign):
        v.expect("ready", READY_S)
        v.send("loop")
    until(lambda: session.tick_count() > 0 and foreign.tick_count() > 0, 30)
    guardian = arb.guardian_pid()
    f.check(guardian is not None, "the arbiter has no guardian process")
    granted = grant(f, holder)
    report_checks(f, granted, "granted report")
    for v in (session, foreign):
        f.check(v.pid in granted["locked"], f"{v.name} {v.pid} not in the report's locked {granted['locked']}")
    f.check(session.pid in granted["frozen"], f"session victim not frozen: {granted['frozen']}")
    locked_in = until(lambda: probe.state(foreign.pid) == "LOCKED", 2.0, 0.02)
    f.check(locked_in is not None, f"the foreign victim is not LOCKED in the region: {probe.state(foreign.pid)}")
    f.check(stopped(session.pid), f"the session victim is not stopped in the region: {thread_states(session.pid)}")
    time.sleep(0.3)

    target = holder.proc if who == "holder" else arb.proc
    assert target is not None
    trace: list[tuple[float, str]] = []

    def undone() -> bool:
        st = {v.name: (thread_states(v.pid), probe.state(v.pid, timeout=0.5)) for v in (session, foreign)}
        line = ", ".join(f"{k}: threads {th} driver {d}" for k, (th, d) in st.items())
        if not trace or trace[-1][1] != line:
            trace.append((time.time(), line))
        return all(d == "RUNNING" and not any(c in "Tt" for c in th) for th, d in st.values())

    t_kill = f.event(f"SIGKILL to the {who} (pid {target.pid})")
    target.kill()
    took = until(undone, 5.0, 0.002)
    if took is not None:
        f.event(f"both victims thawed and RUNNING ({took * 1e3:.1f} ms after the kill)", t_kill + took)
    resumed = until(lambda: all(any(ta > t_kill for _, ta in v.ticks[""]) for v in (session, foreign)), 5.0)
    f.notes.append(f"states after the kill (time, states): {'; '.join(f'{f.rel(t)} {s}' for t, s in trace)}")
    f.notes.append(f"kill to undone: {'not within 5 s' if took is None else f'{took:.4f} s'}")
    f.check(
        took is not None and took <= RELEASE_S,
        f"victims not thawed and RUNNING within {RELEASE_S} s of the {who}'s SIGKILL "
        f"({'never, within 5 s' if took is None else f'{took:.3f} s'})",
    )
    f.check(resumed is not None, "a victim made no CUDA progress within 5 s of the kill")
    if who == "holder":
        try:
            past = regions(arb.endpoint)
            f.reports["arbiter's last regions"] = past
            last = past[-1] if past else {}
            f.check(
                last.get("released_by") == "holder process exited",
                f"the region was not released for the holder's exit: {last.get('released_by')!r}",
            )
        except Exception as exc:
            f.check(False, f"the arbiter did not answer after the holder's death: {exc}")
    else:
        gone = until(lambda: guardian is None or not psutil.pid_exists(guardian), 5.0)
        f.check(gone is not None, f"the guardian {guardian} did not exit after undoing")
    f.done()


# -- the holder's own CUDA children are not intruders -----------------------------------------


@pytest.mark.timeout(180)
def test_cuda_child_started_by_the_holder_inside_its_region_runs(nv: Findings, probe: Probe) -> None:
    """``krex exclusive -- python bench.py`` or ``!python bench.py`` in a %%krex cell: the
    holder starts its CUDA worker *after* the grant. It belongs to the holder's lineage, so the
    intruder watcher must not lock it (nor anything freeze it): it must run inside the region."""
    f = nv
    kids = f.kids
    run_s = 3.0
    holder = start_holder(kids, "--max-hold", "120", "--spawn-child", str(run_s))
    grant(f, holder)
    child_pid = int(holder.expect("child", 10)[1])
    f.event(f"holder started its CUDA child {child_pid}")
    states: list[tuple[float, str]] = []
    locked_since: list[float] = []

    def finished_or_stuck() -> bool:
        now = time.time()
        st = probe.state(child_pid, timeout=1.0)
        if not states or states[-1][1] != st:
            states.append((now, st))
        if st == "LOCKED" or st.startswith("stopped"):
            locked_since.append(now)
            return now - locked_since[0] > 1.5  # stuck: release, so that it can finish
        return holder.has("child-done") or not alive(child_pid)

    until(finished_or_stuck, READY_S, interval=0.02)
    released = release(f, holder)
    until(lambda: holder.has("child-done") or not alive(child_pid), 30)
    ctx = holder.find("child-ctx")
    if ctx is not None:
        f.event("child's context exists", float(ctx[1]))
    f.notes.append("child driver states: " + "; ".join(f"{f.rel(t)} {s}" for t, s in states))
    t_rel0 = released["t_rel0"]
    ticks = [(tb, ta) for tb, ta in holder.ticks["child-"] if ta < t_rel0]
    f.notes.append(f"child ticks inside the region: {f.ticks(holder, 'child-', hi=t_rel0)}")
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(ticks)]
    f.check(
        not locked_since,
        f"the holder's own child was LOCKED or stopped inside the region "
        f"(first seen {f.rel(locked_since[0]) if locked_since else ''})",
    )
    f.check(
        bool(ticks) and ticks[-1][1] - ticks[0][1] >= run_s - 0.5,
        f"the child ran only {ticks[-1][1] - ticks[0][1] if ticks else 0:.3f} s of its {run_s} s inside the region",
    )
    f.check(not gaps or max(gaps) < 0.5, f"the child stalled {max(gaps) if gaps else 0:.3f} s inside the region")
    for key in ("locked", "intruders", "frozen"):
        f.check(child_pid not in released[key], f"the holder's child is in the report's {key}: {released[key]}")
    f.check(released["degraded"] is False, f"region degraded: {released['not_drained']} {released['failures']}")
    f.done()


# -- processes that end while a region is acquired are gone, not a degraded region ------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("attach", [False, True], ids=["foreign", "sessions"])
def test_processes_killed_as_a_region_is_asked_leave_it_undegraded(attach: bool, nv: Findings, probe: Probe) -> None:
    """Agents' processes end all the time. Several CUDA processes are SIGKILLed at the moment the
    holder asks for its region, three rounds: while the driver tears their contexts down they are
    still listed on the GPU, and a lock of them may be refused. Each must be reported gone (or
    locked, or needing no lock), never as not drained, and no region may read degraded."""
    f = nv
    kids = f.kids
    for round_ in range(3):
        holder = start_holder(kids, "--max-hold", "60")  # a holder takes one region, then exits
        extra = ["--attach", str(GPU)] if attach else ["--autostart"]
        victims = [kids.start(f"victim{round_}.{i}", "victim", *extra) for i in range(4)]
        for v in victims:
            v.expect("ready" if attach else "ctx", READY_S)
        until(lambda vs=victims: all(probe.on_gpu(v.pid) for v in vs), 10.0)  # type: ignore[misc]
        for v in victims:
            os.kill(v.pid, signal.SIGKILL)
        granted = grant(f, holder)
        pids = {str(v.pid) for v in victims}
        f.check(
            granted["degraded"] is False,
            f"round {round_}: degraded: not drained {granted['not_drained']}, failures {granted['failures']}",
        )
        f.check(
            not pids & set(granted["not_drained"]),
            f"round {round_}: a killed process reported not drained: {granted['not_drained']}",
        )
        f.notes.append(
            f"round {round_}: gone {granted['gone']}, no lock needed {granted['no_lock_needed']}, "
            f"locked {granted['locked']}"
        )
        released = release(f, holder)
        f.check(released["degraded"] is False, f"round {round_}: released report degraded: {released['failures']}")
        for v in victims:
            v.proc.wait(timeout=30)
    f.done()
