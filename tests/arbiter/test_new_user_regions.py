"""What a new user hits: reports that state only what was measured, and nested ``exclusive()``
in one process. Real arbiter processes, real session processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import krex_lab
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.support import ROOT
from tests.support.procs import Procs

#: a session on GPU 0 that leaves when it is asked to drain: its process exits ("exit"), or it
#: ends its session and lingers, as `krex exclusive` does on its way out ("unregister")
LEAVING = """
import os, sys, time
import krex_lab
from krex_lab import protocol
s = krex_lab.attach(gpu=0, name="leaving")
def leave():
    if sys.argv[1] == "exit":
        os._exit(0)
    s.call(protocol.Unregister(), timeout=2.0)
    time.sleep(60)
s.drain_hooks.append(leave)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

#: a session on GPU 0 whose drain never answers (its synchronisation hangs)
SILENT = """
import time
import krex_lab
s = krex_lab.attach(gpu=0, name="silent")
s.drain_hooks.append(lambda: time.sleep(60))
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

#: holds GPU 0 until a line arrives on its stdin
HOLDER = """
import sys
import krex_lab
with krex_lab.exclusive(gpu=0):
    print("granted", flush=True)
    sys.stdin.readline()
"""

#: takes GPU 0, but is slow between registering and queueing, longer than the arbiter's intruder
#: grace: it is stopped as an intruder before it can queue. "acquire": inside exclusive() (here:
#: its framework sync); "attach": between attach() and exclusive(), as `krex exclusive` does
SLOW_ATTACHER = """
import json, sys, threading, time
import krex_lab
from krex_lab import devsync
if sys.argv[1] == "attach":
    krex_lab.attach(gpu=0)
    time.sleep(0.8)
else:
    real = devsync.synchronize_frameworks
    def slow():
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.8)
        return real()
    devsync.synchronize_frameworks = slow
region = krex_lab.exclusive(gpu=0)
t0 = time.monotonic()
region.acquire()
took = time.monotonic() - t0
out = {"report": region.report.to_dict(), "took": took, "summary": region.report.summary()}
print("granted", json.dumps(out), flush=True)
region.release()
"""


@pytest.fixture
def scripts(arbiter: ArbiterProc) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        try:
            os.kill(proc.pid, 18)  # SIGCONT: none stays stopped
        except ProcessLookupError:
            pass
        proc.kill()
        proc.wait()


def _start(arbiter: ArbiterProc, started: list[subprocess.Popen[str]], code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=arbiter.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(proc)
    return proc


@pytest.mark.parametrize("how", ["exit", "unregister"])
def test_session_leaving_during_drain_is_gone_not_degraded(
    arbiter: ArbiterProc, scripts: list[subprocess.Popen[str]], how: str
) -> None:
    leaving = _start(arbiter, scripts, LEAVING, how)
    assert Procs.readline(leaving).startswith("ready")
    with krex_lab.exclusive(gpu=0) as region:
        report = dict(region.report)
    assert report["not_drained"] == {}, "a session that left is not 'not drained'"
    assert report["degraded"] is False
    assert report["gone"] == [leaving.pid]
    assert leaving.pid not in report["drained"]
    assert report["drain_s"] < 0.9, "the drain ended when the session left, not at its timeout"
    if how == "unregister":
        assert leaving.pid not in report["frozen"], "a process that is no session any more is not frozen"
        assert proc_state(leaving.pid) != "T"
    assert "NOT drained" not in region.report.summary() and "DEGRADED" not in region.report.summary()


def test_session_that_does_not_answer_is_named_with_the_measured_wait(
    arbiter: ArbiterProc, scripts: list[subprocess.Popen[str]]
) -> None:
    silent = _start(arbiter, scripts, SILENT)
    assert Procs.readline(silent).startswith("ready")
    with krex_lab.exclusive(gpu=0) as region:
        report = dict(region.report)
    assert report["degraded"] is True and report.get("gone", []) == []
    why = report["not_drained"][str(silent.pid)]
    waited = float(re.search(r"did not answer drain within ([0-9.]+) s", why).group(1))  # type: ignore[union-attr]
    assert waited == pytest.approx(report["drain_s"], abs=0.05)


@pytest.mark.parametrize("slow_in", ["acquire", "attach"])
def test_waited_is_the_callers_wait_when_stopped_before_it_could_queue(
    arbiter: ArbiterProc, scripts: list[subprocess.Popen[str]], slow_in: str
) -> None:
    holder = _start(arbiter, scripts, HOLDER)
    assert Procs.readline(holder).startswith("granted")
    slow = _start(arbiter, scripts, SLOW_ATTACHER, slow_in)
    wait_for(lambda: proc_state(slow.pid) == "T", timeout=20.0)  # stopped as an intruder, not yet queued
    time.sleep(0.5)
    assert holder.stdin is not None
    holder.stdin.write("release\n")
    holder.stdin.flush()
    out = json.loads(Procs.readline(slow).split(" ", 1)[1])
    report, took = out["report"], out["took"]
    assert report["wait_s"] < 0.5, "in the queue it hardly waited: the region was free by then"
    assert report["stopped_before_request_s"] > 0.3, "the arbiter says it stopped this session before it queued"
    assert report["caller_wait_s"] == pytest.approx(took, abs=0.05)
    summary = out["summary"]
    waited = float(re.search(r"waited ([0-9.]+) ms", summary).group(1))  # type: ignore[union-attr]
    assert waited / 1e3 == pytest.approx(took, abs=0.05), summary
    stopped = float(re.search(r"stopped ([0-9.]+) ms by another region before it queued", summary).group(1))  # type: ignore[union-attr]
    assert stopped / 1e3 == pytest.approx(report["stopped_before_request_s"], abs=0.001)
    if slow_in == "acquire":  # the stop fell inside the caller's acquire: its wait includes it
        assert took > report["stopped_before_request_s"] + 0.3


def test_nested_exclusive_in_one_process(arbiter: ArbiterProc) -> None:
    def holder(gpu: int) -> int | None:
        h = arbiter.status()["gpus"][gpu]["holder"]
        return h["pid"] if h else None

    with krex_lab.exclusive(gpu=0) as outer:
        assert not outer.report.get("nested")
        with krex_lab.exclusive(gpu=0) as inner:
            assert inner.report["nested"] is True and inner.id == outer.id
            assert inner.report["caller_wait_s"] < 0.1 and "KREX region" in inner.report.summary()
            with krex_lab.exclusive(gpu=1) as other:  # another GPU: a region of its own
                assert not other.report.get("nested") and other.id != outer.id
                assert holder(1) == os.getpid()
            assert holder(1) is None
        assert holder(0) == os.getpid(), "the inner region ends with the outer one"
        assert inner.report["nested"] is True
    assert holder(0) is None
    assert outer.report["released_by"] == "released by holder"
    with krex_lab.exclusive(gpu=0) as again:  # a fresh region afterwards, not a nested one
        assert not again.report.get("nested") and again.id != outer.id

    async def main() -> tuple[bool, str, str]:
        async with krex_lab.exclusive(gpu=1) as a:
            async with krex_lab.exclusive(gpu=1) as b:
                nested = bool(b.report.get("nested"))
            assert holder(1) == os.getpid()
        assert a.id is not None and b.id is not None
        return nested, a.id, b.id

    nested, a_id, b_id = asyncio.run(main())
    assert nested and a_id == b_id
    assert holder(1) is None


def test_the_arbiter_logs_a_degraded_region_with_its_reasons(
    arbiter: ArbiterProc, scripts: list[subprocess.Popen[str]]
) -> None:
    silent = _start(arbiter, scripts, SILENT)
    assert Procs.readline(silent).startswith("ready")
    with krex_lab.exclusive(gpu=0) as region:
        pass
    assert region.report["degraded"] is True  # (read by name: this test ran against the dict report too)
    said = (
        f"WARNING region {region.id} of {region.report['user']} on GPU 0 was DEGRADED: process {silent.pid} not drained"
    )

    def logged() -> bool:
        return any(said in line and "did not answer drain" in line for line in arbiter.output().splitlines())

    wait_for(logged, timeout=5)
