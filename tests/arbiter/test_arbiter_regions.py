"""A region really stops siblings, reserves cores, and undoes everything: real processes, signals."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from krex_lab.procutil import proc_state, tree
from krex_lab.pytest_plugin import ArbiterProc, cpu_gain, wait_for
from tests.support.procs import Procs


def _states(pid: int) -> set[str | None]:
    return {proc_state(p) for p in tree(pid)}


def test_region_freezes_gpu_siblings_and_moves_others(arbiter: ArbiterProc, procs: Procs) -> None:
    same = procs.start("sibling", "0", "--child")
    other = procs.start("sibling", "1")
    wait_for(lambda: len(tree(same.pid)) == 2)
    original = os.sched_getaffinity(other.pid)
    holder = procs.start("holder", "0", wait_line="granted")
    assert cpu_gain(same.pid) == pytest.approx(0.0, abs=0.02)
    assert _states(same.pid) == {"T"}, "the sibling and its child are stopped"
    assert cpu_gain(other.pid) > 0.05, "a session on another GPU keeps running"
    status = arbiter.status()
    gpu0 = status["gpus"][0]
    assert gpu0["holder"]["pid"] == holder.pid and gpu0["gate"] == "closed"
    reserved = set(os.sched_getaffinity(holder.pid))
    assert 0 not in reserved
    assert not reserved & os.sched_getaffinity(other.pid), "moved off the holder's reserved core"
    holder.send_signal(signal.SIGTERM)
    holder.wait()
    wait_for(lambda: _states(same.pid) <= {"R", "S"})
    assert cpu_gain(same.pid) > 0.05
    assert os.sched_getaffinity(other.pid) == original


def test_report_names_what_was_enforced(arbiter: ArbiterProc, procs: Procs) -> None:
    sib = procs.start("sibling", "0", "--sleep")
    quiet = procs.start("sibling", "0", "--sleep", "--no-control")
    holder = procs.start("holder", "0", "--hold", "0.2", wait_line="granted")
    released = procs.report(procs.readline(holder))
    assert set(released["frozen"]) == {sib.pid, quiet.pid}
    assert released["drained"] == [sib.pid]
    assert str(quiet.pid) in released["not_drained"], "a session that cannot be drained is named"
    assert released["degraded"] is True
    assert released["simulated"] is True and released["backend"] == "fake"
    assert released["hold_s"] >= 0.2 and released["released_by"] == "released by holder"


def test_holder_sigkill_releases_within_1s(arbiter: ArbiterProc, procs: Procs) -> None:
    sib = procs.start("sibling", "0")
    holder = procs.start("holder", "0", wait_line="granted")
    assert _states(sib.pid) == {"T"}
    holder.kill()
    took = wait_for(lambda: _states(sib.pid) <= {"R", "S"}, timeout=1.0)
    assert took < 1.0
    assert arbiter.status()["gpus"][0]["holder"] is None


def test_arbiter_sigkill_guardian_undoes_and_new_arbiter_starts(arbiter: ArbiterProc, procs: Procs) -> None:
    sib = procs.start("sibling", "0", "--child")
    other = procs.start("sibling", "1")
    original = os.sched_getaffinity(other.pid)
    procs.start("holder", "0", wait_line="granted")
    assert _states(sib.pid) == {"T"} and os.sched_getaffinity(other.pid) != original
    guardian = arbiter.guardian_pid()
    assert guardian is not None
    assert arbiter.proc is not None
    arbiter.proc.kill()
    took = wait_for(lambda: _states(sib.pid) <= {"R", "S"} and os.sched_getaffinity(other.pid) == original, timeout=1.0)
    assert took < 1.0
    assert cpu_gain(sib.pid) > 0.05
    wait_for(lambda: not psutil.pid_exists(guardian), timeout=5)
    arbiter.proc.wait()
    arbiter.start()  # same runtime dir: takes the lock, replays an empty journal, serves
    assert arbiter.status()["gpus"][0]["holder"] is None


def test_new_arbiter_replays_journal_when_guardian_is_gone(arbiter: ArbiterProc, procs: Procs) -> None:
    sib = procs.start("sibling", "0")
    procs.start("holder", "0", wait_line="granted")
    guardian = arbiter.guardian_pid()
    assert guardian is not None and arbiter.proc is not None
    os.kill(guardian, signal.SIGKILL)  # both die: only the journal remembers
    arbiter.proc.kill()
    arbiter.proc.wait()
    assert _states(sib.pid) == {"T"}
    arbiter.start()
    wait_for(lambda: _states(sib.pid) <= {"R", "S"}, timeout=2.0)


def test_lease_expiry_releases_and_exclusive_reports_it(arbiter: ArbiterProc, procs: Procs) -> None:
    sib = procs.start("sibling", "0")
    holder = procs.start("holder", "0", "--max-hold", "0.3", "--hold", "1.0", wait_line="granted")
    assert _states(sib.pid) == {"T"}
    took = wait_for(lambda: _states(sib.pid) <= {"R", "S"}, timeout=2.0)
    assert took < 0.6, "released at max_hold, not when the holder let go"
    line = procs.readline(holder)
    assert line.startswith("expired"), line
    report = procs.report(line)
    assert report["expired"] is True and "max_hold" in report["error"]


def test_fifo_and_no_overlap_with_eight_requesters(arbiter: ArbiterProc, procs: Procs) -> None:
    holders = [procs.start("holder", "0", "--hold", "0.1", wait_line=None) for _ in range(8)]
    grants = []
    for h in holders:
        granted = procs.report(procs.readline(h))
        released = procs.report(procs.readline(h))
        grants.append((granted["t"], released["t_end"], int(granted["region"][1:])))
    grants.sort()
    assert [g[2] for g in grants] == sorted(g[2] for g in grants), "granted in the order requested"
    for (_, end, _), (start, _, _) in itertools.pairwise(grants):
        assert start >= end, "regions never overlap"


def test_stopped_process_is_left_stopped(arbiter: ArbiterProc, procs: Procs) -> None:
    sib = procs.start("sibling", "0", "--sleep")
    os.kill(sib.pid, signal.SIGSTOP)  # the user's Ctrl-Z
    holder = procs.start("holder", "0", "--hold", "0.1", wait_line="granted")
    released = procs.report(procs.readline(holder))
    assert sib.pid in released["skipped_stopped"] and sib.pid not in released["frozen"]
    # It cannot answer a drain: not waited for (the drain timeout is 1 s), not a degradation.
    assert released["not_drained"] == {} and released["drain_s"] < 0.5, released
    time.sleep(0.1)  # nothing resumes it afterwards either: the wait is the point
    assert proc_state(sib.pid) == "T", "KREX never resumes what it did not stop"


def test_processes_forked_while_freezing_are_caught(arbiter: ArbiterProc, procs: Procs) -> None:
    forker = procs.start("sibling", "0", "--forker")
    wait_for(lambda: len(tree(forker.pid)) > 3)
    procs.start("holder", "0", wait_line="granted")
    wait_for(lambda: _states(forker.pid) <= {"T", "Z"}, timeout=2.0)  # every process of the tree is stopped
    n = len(tree(forker.pid))
    time.sleep(0.2)  # the window in which a tree that still forked would grow
    assert len(tree(forker.pid)) <= n, "a stopped tree does not grow"


def test_session_registering_mid_region_is_frozen(arbiter: ArbiterProc, procs: Procs) -> None:
    procs.start("holder", "0", wait_line="granted")
    # Frozen while it registers: it cannot even print "ready" until the region ends.
    late = procs.start("sibling", "0", wait_line=None)
    wait_for(lambda: arbiter.status()["gpus"][0]["sessions"].__len__() == 2, timeout=10.0)
    wait_for(lambda: proc_state(late.pid) == "T", timeout=2.0)
    assert cpu_gain(late.pid) == pytest.approx(0.0, abs=0.02)


def test_dead_session_reaped_within_200ms(arbiter: ArbiterProc, procs: Procs) -> None:
    import zmq

    from krex_lab import paths, protocol

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(paths.events_endpoint(arbiter.endpoint))
    sub.setsockopt(zmq.SUBSCRIBE, b"krex.session")
    sib = procs.start("sibling", "1", "--sleep")
    # The subscription is live once the sibling's own "joined" event arrives (it registers well after
    # the SUB connects: the sibling's interpreter must start first).
    while True:
        assert sub.poll(5000), "no session event for the sibling joining"
        event = protocol.decode_event(sub.recv_multipart()[1])
        if event["event"] == "joined" and event["pid"] == sib.pid:
            break
    while sub.poll(0):
        sub.recv_multipart()
    t0 = time.monotonic()
    sib.kill()
    while True:
        assert sub.poll(2000), "no session event"
        _, body = sub.recv_multipart()
        event = protocol.decode_event(body)
        if event["event"] == "left" and event["pid"] == sib.pid:
            break
    assert time.monotonic() - t0 < 0.2
    sub.close()


def test_krex_exclusive_cli_propagates_exit_code(arbiter: ArbiterProc) -> None:
    cmd = [
        sys.executable,
        "-m",
        "krex_lab.cli",
        "exclusive",
        "--gpu",
        "1",
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(7)",
    ]
    out = subprocess.run(cmd, env=arbiter.env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 7, out.stderr
    assert "KREX region" in out.stderr and "simulated" in out.stderr
    status = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "status", "--json"],
        env=arbiter.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    import json

    table = json.loads(status.stdout)
    assert table["arbiter"]["simulated"] is True and len(table["gpus"]) == 2
    assert table["arbiter"]["cgroups"] == "disabled by --cgroups off"  # how sessions are frozen: SIGSTOP
    text = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "status"], env=arbiter.env(), capture_output=True, text=True, timeout=30
    ).stdout
    said = [line.strip() for line in text.splitlines() if "freezer:" in line]
    assert said == ["freezer: SIGSTOP (cgroups: disabled by --cgroups off)"], text
    # the fixtures shield KREX sessions only: no node-wide shield, so none lingers after a region
    assert table["arbiter"]["shield"] == "sessions" and table["arbiter"]["shield_linger_s"] == 0.0
