"""The public client API: attach placement, exclusive as sync/async context manager and decorator,
clear errors without an arbiter, and arbiter configuration from a file."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

import krex_lab
import krex_lab.client
from krex_lab import protocol
from krex_lab.errors import ArbiterUnavailable
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.support import ROOT
from tests.support.procs import Procs


def test_no_arbiter_says_how_to_start_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREX_ENDPOINT", f"ipc://{tmp_path}/nothing.sock")
    with pytest.raises(krex_lab.ArbiterUnavailable, match="krex arbiter"):
        krex_lab.client.Session()


def test_attach_places_on_fewest_sessions(arbiter: ArbiterProc, procs: Procs) -> None:
    procs.start("sibling", "0", "--sleep")
    session = krex_lab.attach()
    assert session.gpu == 1 and session.simulated
    assert krex_lab.attach() is session, "attach is idempotent"


def test_exclusive_async_and_decorator(arbiter: ArbiterProc) -> None:
    async def main() -> dict:
        async with krex_lab.exclusive(gpu=1) as region:
            assert arbiter.status()["gpus"][1]["gate"] == "closed"
        return region.report

    report = asyncio.run(main())
    assert report["released_by"] == "released by holder" and report["gpu"] == 1

    calls = []

    @krex_lab.exclusive(gpu=0)
    def timed(x: int) -> int:
        calls.append(arbiter.status()["gpus"][0]["holder"]["pid"])
        return x * 2

    assert timed(3) == 6 and timed(4) == 8
    assert calls == [os.getpid(), os.getpid()]
    assert arbiter.status()["gpus"][0]["holder"] is None


def test_summary_line_says_simulated(arbiter: ArbiterProc) -> None:
    with krex_lab.exclusive(gpu=0) as region:
        pass
    line = region.report.summary()
    assert line.startswith(f"KREX region {region.id} on GPU 0 [simulated GPU]") and "held" in line


def test_config_file_sets_the_default_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    config = tmp_path / "krex_arbiter_config.json"
    config.write_text(json.dumps({"Arbiter": {"max_hold": 0.3, "fake_gpus": 3}}))
    arb = ArbiterProc(runtime, gpus=3, extra=("--config", str(config)))
    monkeypatch.setenv("KREX_ENDPOINT", arb.endpoint)
    arb.start()
    try:
        assert len(arb.status()["gpus"]) == 3
        code = (
            "import krex_lab, time\nr = krex_lab.exclusive(gpu=2)\n"
            "try:\n    with r: time.sleep(0.8)\nexcept krex_lab.LeaseExpired as e: print('expired', e)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=arb.env(), capture_output=True, text=True, timeout=30, cwd=ROOT
        )
        assert out.stdout.startswith("expired") and "max_hold=0.3" in out.stdout, out.stderr
    finally:
        arb.stop()


def test_queued_request_is_withdrawn_on_interrupt(arbiter: ArbiterProc, procs: Procs) -> None:
    import zmq

    from krex_lab import paths

    events = zmq.Context.instance().socket(zmq.SUB)
    events.connect(paths.events_endpoint(arbiter.endpoint))
    events.setsockopt(zmq.SUBSCRIBE, b"krex.region")
    # Without freezing, so that the waiter (a sibling on GPU 0) can run and be interrupted.
    procs.start("holder", "0", "--no-freeze", wait_line="granted")
    # A shell starts background jobs with SIGINT ignored, and Python keeps it so: restore Ctrl-C.
    code = (
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nimport krex_lab\n"
        "print('waiting', flush=True)\nwith krex_lab.exclusive(gpu=0): pass"
    )
    waiter = subprocess.Popen(
        [sys.executable, "-c", code], env=arbiter.env(), stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert waiter.stdout is not None and waiter.stdout.readline().startswith("waiting")
    wait_for(lambda: arbiter.status()["gpus"][0]["queue"], timeout=10)
    waiter.send_signal(2)  # Ctrl-C while queued
    assert waiter.wait(10) != 0
    wait_for(lambda: not arbiter.status()["gpus"][0]["queue"], timeout=5)  # the dead waiter's request is withdrawn
    seen: list[str] = []
    while "withdrawn" not in seen and events.poll(5000):
        seen.append(msgspec.msgpack.decode(events.recv_multipart()[1])["event"])
    assert "withdrawn" in seen, seen
    events.close()


def test_sessions_started_by_the_holder(arbiter: ArbiterProc, procs: Procs) -> None:
    """A session the holder starts is frozen like any other, unless it is part of the region
    (started under ``krex exclusive``, KREX_REGION): then its own exclusive() nests."""
    spin = "import krex_lab, sys\nkrex_lab.attach(gpu=0)\nprint('ready', flush=True)\nwhile True: pass"
    holder_code = (
        "import subprocess, sys, time, json, krex_lab\n"
        "from krex_lab.procutil import proc_state\n"
        f"child = subprocess.Popen([sys.executable, '-c', {spin!r}], stdout=subprocess.PIPE, text=True)\n"
        "child.stdout.readline()\n"
        "with krex_lab.exclusive(gpu=0) as r:\n"
        "    time.sleep(0.3)\n"  # the child stays stopped while the region lasts
        "    print(json.dumps({'state': proc_state(child.pid), 'frozen': r.report['frozen'], 'child': child.pid}))\n"
        "child.kill()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", holder_code], env=arbiter.env(), capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["state"] == "T" and seen["child"] in seen["frozen"], out.stderr
    nested = "import krex_lab, json\nwith krex_lab.exclusive(gpu=0) as r:\n    print(json.dumps(r.report.to_dict()))"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "krex_lab.cli",
            "exclusive",
            "--gpu",
            "0",
            "--quiet",
            "--",
            sys.executable,
            "-c",
            nested,
        ],
        env=arbiter.env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["nested"] is True and report["state"] == "held"
    assert arbiter.status()["gpus"][0]["holder"] is None


def test_exempt_processes_keep_running(arbiter: ArbiterProc, procs: Procs) -> None:
    """A worker's region leaves the notebook that waits for its output running (exempt=...)."""
    from krex_lab.procutil import proc_state

    waiting = procs.start("sibling", "0")
    other = procs.start("sibling", "0")
    code = (
        "import json, sys, time, krex_lab\n"
        "with krex_lab.exclusive(gpu=0, exempt=[int(sys.argv[1])]) as r:\n"
        "    time.sleep(0.3)\n"  # a region that lasts a while: the exempt process keeps running
        "    print(json.dumps(r.report.to_dict()), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(waiting.pid)],
        env=arbiter.env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["exempted"] == [waiting.pid]
    assert other.pid in report["frozen"] and waiting.pid not in report["frozen"]
    assert proc_state(waiting.pid) in ("R", "S")
    with pytest.raises(krex_lab.InvalidRequest, match="does not exist"):
        krex_lab.attach(gpu=1).call(protocol.Acquire(exempt=[2**22 + 12345]))


def test_stopped_arbiter_leaves_no_socket_behind(arbiter: ArbiterProc) -> None:
    sock = arbiter.runtime / "arbiter.sock"
    assert sock.exists()
    arbiter.stop()
    assert not sock.exists() and not (arbiter.runtime / "arbiter-events.sock").exists()
    with pytest.raises(krex_lab.ArbiterUnavailable, match="socket file does not exist"):
        krex_lab.client.Session()


def test_a_session_waits_out_an_arbiter_that_answers_late(arbiter: ArbiterProc) -> None:
    # Its listener is there and answers 3 s late (another user's flood of connections, a loaded
    # 2-core machine): the session registers once it answers, instead of calling it absent.
    pid = krex_lab.client.hello()["pid"]
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        t0 = time.monotonic()
        session = krex_lab.client.Session()
        waited = time.monotonic() - t0
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    session.close()
    assert waited > 2.5, waited  # it was answered by the arbiter after its stop, not before


def test_a_stale_socket_file_fails_at_once(tmp_path: Path) -> None:
    # An arbiter that died without removing its socket (SIGKILL, an abort) leaves the file: a
    # client learns from the kernel that nobody listens, instead of waiting for a reply.
    import socket

    path = tmp_path / "arbiter.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
    assert path.exists()
    t0 = time.monotonic()
    with pytest.raises(ArbiterUnavailable, match="no KREX arbiter listens"):
        krex_lab.client.status(f"ipc://{path}")
    assert time.monotonic() - t0 < 1.0


@pytest.mark.skipif(os.geteuid() != 0, reason="ending another session's region takes root or the admin group")
def test_a_region_an_admin_ends_raises_in_its_holder(arbiter: ArbiterProc) -> None:
    code = (
        "import krex_lab, time\nr = krex_lab.exclusive(gpu=0)\n"
        "try:\n    with r:\n        print('granted', r.id, flush=True)\n        time.sleep(5)\n"
        "except krex_lab.RegionRevoked as e: print('revoked', e)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], env=arbiter.env(), stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert holder.stdout is not None
        region = holder.stdout.readline().split()[1]
        admin = krex_lab.client.attach(gpu=1)
        report = admin.call(protocol.Release(region=region, force=True))
        assert report["revoked"] is True and report["released_by"] == "ended by admin uid 0"
        out, _ = holder.communicate(timeout=20)
        assert out.startswith("revoked") and "ended by admin uid 0" in out, out
    finally:
        holder.kill()
        holder.wait()


def test_a_degraded_summary_says_why() -> None:
    from krex_lab.client import RegionReport

    report = RegionReport(
        region="r1",
        gpu=0,
        degraded=True,
        failures=["no core to reserve among 1 (others hold the rest)", "thread 7: Invalid argument"],
    )
    assert report.summary().endswith(" - DEGRADED: no core to reserve among 1 (others hold the rest); 1 more")
    assert RegionReport(region="r2", gpu=0, degraded=False).summary().count("DEGRADED") == 0


def test_the_summary_reads_cleanly() -> None:
    """No space before a semicolon, no double space, no brackets in brackets, and "moved" says
    what was moved."""
    from krex_lab.client import RegionReport

    text = RegionReport(
        region="r3",
        gpu=1,
        wait_s=0.001,
        acquire_s=0.002,
        hold_s=1.5,
        drained=[5],
        frozen=[6, 7],
        moved=[8, 9, 10],
        cores=[1],
        degraded=True,
        failures=["no core to reserve among 1 (others hold the rest)"],
    ).summary()
    assert " ;" not in text and "  " not in text, text
    assert "cores [1]; held 1.500 s" in text, text
    assert "moved 3 off the reserved cores" in text, text
    assert "DEGRADED: no core to reserve among 1 (others hold the rest)" in text and "((" not in text, text
    quiet = RegionReport(region="r4", gpu=0, acquire_s=0.001, hold_s=0.5).summary()
    assert "moved" not in quiet and "cores []; held 0.500 s" in quiet, quiet


def test_a_region_on_another_gpu_never_moves_the_session(arbiter: ArbiterProc, procs: Procs) -> None:
    """A kernel placed on GPU 1 that holds GPU 0 for a block stays GPU 1's: listed under it and
    frozen by its regions after the block; attach(gpu=0) registers a second session, not a move."""
    code = (
        "import json, krex_lab\n"
        "first = krex_lab.attach(gpu=1, name='kernel-on-1')\n"
        "with krex_lab.exclusive(gpu=0) as r:\n"
        "    pass\n"
        "second = krex_lab.attach(gpu=0)\n"
        "seen = {'region_gpu': r.gpu, 'first': [first.id, first.gpu], 'again': krex_lab.attach().id}\n"
        "seen.update(second=[second.id, second.gpu], second_again=krex_lab.attach(gpu=0).id)\n"
        "print(json.dumps(seen), flush=True)\n"
        "while True: pass\n"
    )
    kernel = subprocess.Popen(
        [sys.executable, "-c", code], env=arbiter.env(), cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    procs.procs.append(kernel)
    seen = json.loads(procs.readline(kernel))
    assert seen["region_gpu"] == 0 and seen["first"][1] == 1 and seen["again"] == seen["first"][0]
    assert seen["second"][1] == 0 and seen["second_again"] == seen["second"][0] != seen["first"][0]
    gpus = arbiter.status()["gpus"]
    assert [s["id"] for s in gpus[1]["sessions"] if s["pid"] == kernel.pid] == [seen["first"][0]]
    assert [s["id"] for s in gpus[0]["sessions"] if s["pid"] == kernel.pid] == [seen["second"][0]]
    holder = procs.start("holder", "1", "--hold", "0.3", wait_line=None)
    granted = procs.readline(holder)
    assert granted.startswith("granted") and kernel.pid in Procs.report(granted)["frozen"], granted


def test_hello_gives_the_fields_its_type_names(arbiter: ArbiterProc) -> None:
    """``hello()``'s dict is typed by ``InfoDict``: the same keys as the ``Info`` reply, one for one."""
    info = krex_lab.client.hello(arbiter.endpoint)
    assert set(protocol.InfoDict.__required_keys__) == set(protocol.Info.__struct_fields__) == set(info)
    assert msgspec.convert(info, protocol.Info).pid == info["pid"]
