"""The GPU dashboard without a browser: the reducer and the widget models follow a scripted
sequence of arbiter events; a dashboard follows a real arbiter (regions, queue, degraded, the
arbiter lost and back); ten dashboards cost the arbiter ten subscribers and no GPU queries."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
import zmq

from krex_lab.dashboard.model import Event, NodeState, reduce, reduce_all
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.support import ROOT
from tests.support.procs import Procs

pytestmark = pytest.mark.timeout(90)

T0 = 1_700_000_000.0
GIB = 2**30


# -- scripted events ------------------------------------------------------------------------
def gpu_row(
    i: int,
    sessions: tuple[dict[str, Any], ...] = (),
    util: float | None = None,
    used: int = 0,
    sm: int | None = None,
    name: str = "",
) -> dict[str, Any]:
    return {
        "index": i,
        "name": name or f"Simulated GPU {i} (fake backend)",
        "uuid": f"FAKE-{i:04d}",
        "memory_total": 80 * GIB,
        "memory_used": used,
        "utilization_gpu": util,
        "sm_clock_mhz": sm,
        "mem_clock_mhz": None,
        "throttle_reasons": [],
        "simulated": not name,
        "gate": "open",
        "holder": None,
        "queue": [],
        "sessions": list(sessions),
    }


def status(pid: int = 100, gpus: list[dict[str, Any]] | None = None, backend: str = "fake") -> dict[str, Any]:
    return {
        "arbiter": {
            "pid": pid,
            "endpoint": "ipc:///run/krex/arbiter.sock",
            "events": "",
            "started": T0,
            "sessions": 0,
            "backend": backend,
            "simulated": backend == "fake",
            "capabilities": {"lock": backend == "nvidia", "reason": "", "driver": "", "extra": {}},
        },
        "gpus": gpus if gpus is not None else [gpu_row(0), gpu_row(1)],
    }


def sess(sid: str, pid: int, name: str, role: str = "kernel", gpu: int = 0, user: str = "alice") -> dict[str, Any]:
    return {
        "id": sid,
        "pid": pid,
        "uid": 1000,
        "user": user,
        "role": role,
        "name": name,
        "gpu": gpu,
        "within": "",
        "since": T0,
    }


def report(
    rid: str,
    sid: str,
    pid: int,
    name: str,
    user: str,
    hold: float | None = None,
    frozen: tuple[int, ...] = (),
    not_drained: dict[str, str] | None = None,
    state: str = "held",
    released_by: str = "",
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "region": rid,
        "gpu": 0,
        "session": sid,
        "holder_pid": pid,
        "user": user,
        "name": name,
        "state": state,
        "max_hold_s": 60.0,
        "wait_s": 0.25,
        "acquire_s": 0.002,
        "drained": list(frozen),
        "frozen": list(frozen),
        "not_drained": not_drained or {},
        "intruders": [],
        "degraded": bool(not_drained),
        "expired": False,
        "released_by": released_by,
        "backend": "fake",
        "simulated": True,
    }
    if hold is not None:
        r["hold_s"] = hold
    return r


def script() -> list[Event]:
    """Sessions join, regions are requested, granted (one degraded), released, a queued session leaves,
    the arbiter is lost and comes back (a new process)."""
    t = T0
    ev: list[Event] = []

    def add(topic: str, data: dict[str, Any], dt: float = 1.0) -> None:
        nonlocal t
        t += dt
        ev.append(Event(topic, data, t))

    add("snapshot", {"hello": {}, "status": status(), "regions": []})  # 0
    add("session", {"event": "joined", **sess("s1", 11, "analysis.ipynb")})  # 1
    add("session", {"event": "joined", **sess("s2", 12, "pool worker", "worker", user="bob")})  # 2
    add("session", {"event": "joined", **sess("s3", 13, "train.ipynb", user="carol")})  # 3
    add("session", {"event": "joined", **sess("s4", 14, "no-control", "client", gpu=1, user="dave")})  # 4
    add("region", {"event": "requested", "region": "r1", "gpu": 0, "session": "s1", "queue": 1})  # 5
    add("gate", {"gpu": 0, "closed": True, "region": "r1", "holder_pid": 11})  # 6
    add("region", {"event": "granted", **report("r1", "s1", 11, "analysis.ipynb", "alice", frozen=(12, 13))})  # 7
    add("region", {"event": "requested", "region": "r2", "gpu": 0, "session": "s2", "queue": 1})  # 8
    add("region", {"event": "requested", "region": "r3", "gpu": 0, "session": "s3", "queue": 2})  # 9
    add("region", {"event": "intruder", "region": "r1", "pids": [99]})  # 10
    add(
        "region",
        {
            "event": "released",
            **report(
                "r1",
                "s1",
                11,
                "analysis.ipynb",
                "alice",
                hold=0.5,
                frozen=(12, 13),
                state="released",
                released_by="released by holder",
            ),
        },
    )  # 11
    bad = {"14": "not KREX-aware (no control channel) and not lockable"}
    add("region", {"event": "granted", **report("r2", "s2", 12, "pool worker", "bob", not_drained=bad)})  # 12
    add(
        "region",
        {
            "event": "released",
            **report(
                "r2",
                "s2",
                12,
                "pool worker",
                "bob",
                hold=2.0,
                not_drained=bad,
                state="released",
                released_by="released by holder",
            ),
        },
    )  # 13
    add("session", {"event": "left", **sess("s3", 13, "train.ipynb", user="carol")})  # 14
    add("lost", {"reason": "arbiter lost: no KREX arbiter answers"})  # 15
    back = status(pid=200, gpus=[gpu_row(0, (sess("s9", 19, "after-restart"),)), gpu_row(1)])
    add("snapshot", {"hello": {}, "status": back, "regions": []})  # 16
    return ev


def test_import_stays_cheap_and_the_name_is_callable() -> None:
    code = (
        "import sys, krex_lab; assert 'ipywidgets' not in sys.modules and 'zmq' not in sys.modules\n"
        "import krex_lab.dashboard.model; assert 'ipywidgets' not in sys.modules\n"
        "assert callable(krex_lab.dashboard) and krex_lab.dashboard.__name__ == 'krex_lab.dashboard'\n"
        "d = krex_lab.dashboard(endpoint='ipc:///nonexistent/arbiter.sock', refresh=0.1)\n"
        "import time; t0 = time.monotonic()\n"
        "while 'ARBITER LOST' not in d.header.value and time.monotonic() - t0 < 10: time.sleep(0.02)\n"
        "assert 'ARBITER LOST' in d.header.value, d.header.value; d.close()"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_reducer_follows_a_scripted_sequence() -> None:
    events = script()
    states = [NodeState()]
    for e in events:
        states.append(reduce(states[-1], e))
    s = states[1:]  # s[i]: after events[i]
    assert s[0].connected and [g.index for g in s[0].gpus] == [0, 1] and s[0].simulated
    assert [x.name for x in s[4].gpu(0).sessions] == ["analysis.ipynb", "pool worker", "train.ipynb"]  # type: ignore[union-attr]
    assert [x.name for x in s[4].gpu(1).sessions] == ["no-control"]  # type: ignore[union-attr]
    assert [(w.region, w.name, w.user) for w in s[5].gpu(0).queue] == [("r1", "analysis.ipynb", "alice")]  # type: ignore[union-attr]
    g = s[7].gpu(0)
    assert g is not None and g.holder is not None and g.gate_closed and g.queue == ()
    assert (g.holder.region, g.holder.user, g.holder.name, g.holder.role, g.holder.pid) == (
        "r1",
        "alice",
        "analysis.ipynb",
        "kernel",
        11,
    )
    assert g.holder.since == events[7].at and g.holder.max_hold_s == 60.0 and g.holder.frozen == (12, 13)
    assert [w.region for w in s[9].gpu(0).queue] == ["r2", "r3"], "the queue in order"  # type: ignore[union-attr]
    assert s[10].gpu(0).holder.intruders == 1  # type: ignore[union-attr]
    g = s[11].gpu(0)
    assert g is not None and g.holder is None and [r.region for r in g.regions] == ["r1"]
    r1 = g.regions[0]
    assert (r1.wait_s, r1.hold_s, r1.drained, r1.frozen, r1.degraded) == (0.25, 0.5, 2, 2, False)
    g = s[12].gpu(0)
    assert g is not None and g.holder is not None and g.holder.region == "r2" and g.holder.degraded
    assert [w.region for w in g.queue] == ["r3"]
    g = s[13].gpu(0)
    assert g is not None and [(r.region, r.degraded, r.not_drained) for r in g.regions] == [
        ("r1", False, 0),
        ("r2", True, 1),
    ]
    g = s[14].gpu(0)
    assert g is not None and g.queue == () and [x.id for x in g.sessions] == ["s1", "s2"], "left: its request too"
    assert not s[15].connected and s[15].lost_since == events[15].at and "no KREX arbiter" in s[15].message
    assert s[15].gpu(0).regions == s[14].gpu(0).regions, "the last state stays visible"  # type: ignore[union-attr]
    back = s[16]
    assert back.connected and back.lost_since is None and back.arbiter_pid == 200
    g = back.gpu(0)
    assert g is not None and [x.name for x in g.sessions] == ["after-restart"] and g.regions == (), (
        "a new arbiter: a new picture"
    )
    # Pure: earlier states are untouched, and replaying gives the same result.
    assert states[8].gpu(0).holder.region == "r1" and states[1].gpus[0].sessions == ()  # type: ignore[union-attr]
    assert reduce_all(NodeState(), events) == back


def test_reducer_is_idempotent_where_a_snapshot_overlaps_events() -> None:
    events = script()
    s = reduce_all(NodeState(), events[:8])
    for e in (events[1], events[5], events[7]):  # a join, a request and a grant seen twice
        s = reduce(s, e)
    g = s.gpu(0)
    assert g is not None and len(g.sessions) == 3 and g.queue == () and g.holder and g.holder.region == "r1"
    s = reduce_all(s, events[8:12])
    s = reduce(s, events[5])  # a stale "requested" of a region already over
    s = reduce(s, events[11])  # its release twice
    g = s.gpu(0)
    assert g is not None and [w.region for w in g.queue] == ["r2", "r3"] and [r.region for r in g.regions] == ["r1"]
    assert reduce(s, Event("no-such-topic", {}, T0)) is s


def test_telemetry_carries_readings_and_memory() -> None:
    gpus = [gpu_row(0, (sess("s1", 11, "nb.ipynb"),), util=73.0, used=20 * GIB, sm=1980, name="NVIDIA H200")]
    tele = {
        **status(gpus=gpus, backend="nvidia"),
        "seq": 7,
        "interval": 1.0,
        "time": T0,
        "processes": [{"gpu": 0, "pid": 11, "used_memory": 2 * GIB}, {"gpu": 0, "pid": 77, "used_memory": GIB}],
        "regions": [report("r5", "s1", 11, "nb.ipynb", "alice", hold=1.0, state="released")],
    }
    s = reduce(NodeState(), Event("telemetry", tele, T0))
    g = s.gpu(0)
    assert s.telemetry_seq == 7 and s.telemetry_interval == 1.0 and not s.simulated and s.lock_capable
    assert g is not None and g.utilization == 73.0 and g.sm_clock_mhz == 1980 and g.memory_used == 20 * GIB
    assert g.sessions[0].memory == 2 * GIB and [r.region for r in g.regions] == ["r5"]

    from krex_lab.dashboard.view import Dashboard

    d = Dashboard(connect=False)
    d.apply(Event("telemetry", tele, T0))
    d.render(now=T0)
    p = d.panels[0]
    assert p.util_bar.value == 73.0 and p.util_text.value == "73%"
    assert p.memory_bar.max == 80 * GIB and p.memory_bar.value == 20 * GIB
    assert "20.0 GiB / 80.0 GiB" in p.memory_text.value
    assert "1980 MHz" in p.clock.value and "nvidia" in p.title.value and "simulated" not in p.title.value.lower()
    assert "2.0 GiB" in p.sessions.value and "drain by driver lock" in d.header.value


def test_widgets_follow_the_scripted_sequence() -> None:
    from krex_lab.dashboard.view import Dashboard

    events = script()
    d = Dashboard(connect=False, refresh=0.5)
    seen: dict[int, dict[str, Any]] = {}
    for i, e in enumerate(events):
        d.apply(e)
        d.render(now=e.at + 0.25)
        p = d.panels.get(0)
        seen[i] = {
            "header": d.header.value,
            "panels": list(d.panels),
            **(
                {}
                if p is None
                else {
                    "title": p.title.value,
                    "holder": p.holder.value,
                    "queue": p.queue.value,
                    "sessions": p.sessions.value,
                    "timeline": p.timeline.value,
                    "classes": list(p._dom_classes),
                    "util": p.util_text.value,
                    "clock": p.clock.value,
                }
            ),
        }
    assert seen[0]["panels"] == [0, 1] and "SIMULATED (fake backend)" in seen[0]["title"]
    assert "SIMULATED GPUs" in seen[0]["header"] and "live" in seen[0]["header"]
    assert seen[0]["util"] == "n/a" and "SM clock n/a" in seen[0]["clock"] and "none held" in seen[0]["holder"]
    assert seen[4]["sessions"].count('class="krex-session"') == 3
    assert "analysis.ipynb" in seen[5]["queue"] and "waiting (1)" in seen[5]["queue"]
    assert "gate closed" in seen[6]["title"]
    held = seen[7]["holder"]
    for text in ("region r1", "alice", "analysis.ipynb", "kernel", "pid 11", "250.0 ms / 60.0 s max_hold"):
        assert text in held, (text, held)
    assert seen[7]["sessions"].count("<td>frozen</td>") == 2 and "<td>holding</td>" in seen[7]["sessions"]
    queue = seen[9]["queue"]
    assert "waiting (2)" in queue and queue.index("pool worker") < queue.index("train.ipynb"), "in order"
    assert "1 intruder(s)" in seen[10]["holder"]
    assert "none held" in seen[11]["holder"] and seen[11]["timeline"].count('class="krex-region"') == 1
    assert "queued 250.0 ms, held 500.0 ms, drained 2, frozen 2" in seen[11]["timeline"]
    assert "DEGRADED" in seen[12]["holder"] and "bob" in seen[12]["holder"]
    timeline = seen[13]["timeline"]
    assert timeline.count('class="krex-region"') == 1 and timeline.count('class="krex-region degraded"') == 1
    assert "<svg" in timeline and "DEGRADED" in timeline
    assert "train.ipynb" not in seen[14]["sessions"] and "nobody" in seen[14]["queue"]
    assert "ARBITER LOST" in seen[15]["header"] and "reconnecting" in seen[15]["header"]
    assert "krex-stale" in seen[15]["classes"] and "krex-region degraded" in seen[15]["timeline"], "last state kept"
    assert "live" in seen[16]["header"] and "arbiter pid 200" in seen[16]["header"]
    assert "krex-stale" not in seen[16]["classes"] and "after-restart" in seen[16]["sessions"]
    assert "LOST" not in d.summary() and "GPU 0: free" in d.summary()

    only = Dashboard(gpus=1, connect=False)
    only.apply(events[0])
    only.render()
    assert list(only.panels) == [1], "gpus= picks the panels"


def test_draws_are_batched_and_throttled(monkeypatch: pytest.MonkeyPatch) -> None:
    import comm
    import ipywidgets

    from krex_lab.dashboard.view import Dashboard

    # Widgets outside a kernel send through the comm package's default comm. Once anything in
    # the process has imported ipykernel's kernel module (a jupyter_server test does), comms are
    # ipykernel's, with no kernel here, and widgets send nothing: this test's comms are its own.
    monkeypatch.setattr(comm, "create_comm", comm.DummyComm)

    sent: collections.Counter[str] = collections.Counter()
    original = ipywidgets.Widget._send

    def count(self: ipywidgets.Widget, msg: dict[str, Any], buffers: Any = None) -> None:
        if msg.get("method") == "update":
            sent[self.model_id] += 1
        original(self, msg, buffers)

    monkeypatch.setattr(ipywidgets.Widget, "_send", count)
    events = script()
    d = Dashboard(connect=False, refresh=0.2)
    d.apply(events[0])
    d.render()
    sent.clear()
    for e in events[1:12]:  # a burst: many changes to every panel
        d.apply(e)
    d.render()
    assert sent and max(sent.values()) == 1, "one message per widget for one draw"
    renders = d.renders
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:  # changes for 0.5 s (the window is the point): draws are counted
        d.apply(events[1])
        d.tick()
        time.sleep(0.005)
    assert 1 <= d.renders - renders <= 3, "at most one draw per refresh period"


# -- a real arbiter ---------------------------------------------------------------------------
@pytest.fixture
def fast_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    """An arbiter (fake backend, 2 GPUs) that publishes telemetry every 0.25 s."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, extra=("--Arbiter.telemetry_interval=0.25",))
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("KREX_ENDPOINT", arb.endpoint)
    arb.start()
    yield arb
    arb.stop()


def test_dashboard_follows_a_real_arbiter(fast_arbiter: ArbiterProc) -> None:
    from krex_lab.client import Exclusive, Session
    from krex_lab.dashboard.view import Dashboard

    arb = fast_arbiter
    procs = Procs(arb.env())
    d = Dashboard(endpoint=arb.endpoint, refresh=0.1, silence=1.0, retry=0.3)
    waiter_session: Session | None = None
    try:
        wait_for(lambda: "live" in d.header.value and list(d.panels) == [0, 1], 10)
        assert d.state.arbiter_pid == arb.proc.pid  # type: ignore[union-attr]
        p0 = d.panels[0]
        sib = procs.start("sibling", "0", "--sleep")
        wait_for(lambda: "test-sibling" in p0.sessions.value and str(sib.pid) in p0.sessions.value, 10)
        holder = procs.start("holder", "0", wait_line="granted")
        wait_for(lambda: "test-holder" in p0.holder.value and "region r1" in p0.holder.value, 10)
        wait_for(lambda: "<td>frozen</td>" in p0.sessions.value, 10)  # the sibling
        assert "SIMULATED (fake backend)" in p0.title.value and "max_hold" in p0.holder.value
        # A waiter for GPU 0 (registered on GPU 1: a newcomer on GPU 0 would be frozen at once).
        waiter_session = Session(gpu=1, name="dash-waiter", endpoint=arb.endpoint)
        waiter = Exclusive(gpu=0, session=waiter_session)
        thread = threading.Thread(target=waiter.acquire, daemon=True)
        thread.start()
        wait_for(lambda: "dash-waiter" in p0.queue.value and "waiting (1)" in p0.queue.value, 10)
        holder.kill()
        thread.join(10)
        wait_for(lambda: "dash-waiter" in p0.holder.value and "nobody" in p0.queue.value, 10)
        wait_for(lambda: p0.timeline.value.count('class="krex-region"') == 1, 10)
        waiter.release()
        wait_for(lambda: "none held" in p0.holder.value and p0.timeline.value.count("krex-region") == 2, 10)
        # Degraded: a session that can neither be asked to drain nor be locked.
        procs.start("sibling", "0", "--sleep", "--no-control")
        short = procs.start("holder", "0", "--hold", "0.2", wait_line="granted")
        assert procs.readline(short).startswith("released")
        wait_for(lambda: 'class="krex-region degraded"' in p0.timeline.value, 10)
        # A session leaves.
        sib.kill()
        wait_for(lambda: str(sib.pid) not in p0.sessions.value, 10)
        # The arbiter goes away, and comes back.
        old_pid = d.state.arbiter_pid
        procs.cleanup()
        arb.stop()
        wait_for(lambda: "ARBITER LOST" in d.header.value and "krex-stale" in p0._dom_classes, 10)
        arb.start()
        wait_for(lambda: "live" in d.header.value and d.state.arbiter_pid == arb.proc.pid, 15)  # type: ignore[union-attr]
        assert d.state.arbiter_pid != old_pid and "krex-stale" not in p0._dom_classes
        assert "none" in p0.sessions.value and "no finished regions" in p0.timeline.value, "the new arbiter's picture"
        assert d.feed is not None and d.feed.connects == 2
    finally:
        if waiter_session is not None:
            waiter_session.close()
        d.close()
        procs.cleanup()
    assert d.feed is not None and not d.feed.running, "close() stops the feed thread"


# -- ten dashboards ---------------------------------------------------------------------------
def _subscribers(pid: int, path: str) -> int:
    """Unix sockets of ``pid`` on ``path``: the listening one plus one accepted per subscriber."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="unix") if c.laddr == path)


def _telemetry_window(sub: zmq.Socket[bytes], n: int) -> tuple[float, float, int]:
    """Times of two telemetry events ``n`` periods apart (``n`` consecutive sequence numbers)."""
    decoder = msgspec.msgpack.Decoder(dict)
    first: dict[str, Any] | None = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert sub.poll(5000), "no telemetry"
        _, body = sub.recv_multipart()
        event = decoder.decode(body)
        if first is None:
            first = event
        elif event["seq"] == first["seq"] + n:
            return first["time"], event["time"], n
        elif event["seq"] > first["seq"] + n:
            first = event  # this subscriber missed one (should not happen): start over
    raise AssertionError("no telemetry window")


def _queries(path: Path, t_from: float, t_to: float) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        t, kind = line.split()
        if t_from < float(t) <= t_to:
            counts[kind] += 1
    return counts


def test_ten_dashboards_cost_ten_subscribers_and_no_gpu_queries(tmp_path: Path) -> None:
    """Every backend query of the arbiter is logged (time, kind); between two telemetry events n periods apart
    there are exactly n inventory queries (and n per GPU process listings), with or without ten dashboards."""
    from krex_lab.dashboard.view import Dashboard

    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    counts = tmp_path / "queries.log"
    endpoint = f"ipc://{runtime / 'arbiter.sock'}"
    events = str(runtime / "arbiter-events.sock")
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": endpoint,
        "KREX_COUNT_FILE": str(counts),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.procs.counting_arbiter",
            "--backend",
            "fake",
            "--fake-gpus",
            "2",
            "--Arbiter.telemetry_interval=0.2",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dashboards: list[Any] = []
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"krex.telemetry")
    try:
        from krex_lab import client

        wait_for(lambda: _answers(client, endpoint), 20, 0.05)
        sub.connect(f"ipc://{events}")
        wait_for(lambda: _subscribers(proc.pid, events) == 2, 10)  # the listener and this probe
        t_a, t_b, n = _telemetry_window(sub, 5)
        alone = _queries(counts, t_a, t_b)
        assert alone == {"inventory": n, "processes": 2 * n}, alone

        dashboards = [Dashboard(endpoint=endpoint, refresh=0.2) for _ in range(10)]
        wait_for(lambda: all(d.state.connected and d.state.telemetry_seq > 0 for d in dashboards), 20)
        assert _subscribers(proc.pid, events) == 2 + 10, "one subscriber per dashboard"
        snapshots = _queries(counts, t_b, time.time())
        assert snapshots["inventory"] >= 10, "each dashboard took one status snapshot on connect"
        while sub.poll(0):  # telemetry queued while the dashboards connected: the window starts now
            sub.recv_multipart()
        t_c, t_d, n = _telemetry_window(sub, 5)
        with_ten = _queries(counts, t_c, t_d)
        assert with_ten == {"inventory": n, "processes": 2 * n}, f"dashboards must not query the GPUs: {with_ten}"
        seqs = [d.state.telemetry_seq for d in dashboards]
        wait_for(lambda: all(d.state.telemetry_seq > s for d, s in zip(dashboards, seqs)), 5)
        assert all(d.renders > 0 and list(d.panels) == [0, 1] for d in dashboards)
    finally:
        for d in dashboards:
            d.close()
        sub.close(linger=0)
        if dashboards:
            wait_for(lambda: _subscribers(proc.pid, events) == 1, 10)  # closed dashboards unsubscribe
        proc.terminate()
        proc.wait(10)


def _answers(client: Any, endpoint: str) -> bool:
    from krex_lab.errors import ArbiterUnavailable

    try:
        client.hello(endpoint, timeout=0.5)
        return True
    except ArbiterUnavailable:
        return False


def test_snapshot_script_writes_the_dashboard_page(tmp_path: Path) -> None:
    """``tests.procs.dashboard_snapshot`` (what makes the GPU machine's picture) on the fake backend."""
    out = tmp_path / "snap"
    # its own temporary directory, short: the script's sockets go in it (a UNIX socket's path
    # takes 107 bytes, and a parallel run's tmp_path alone is near that)
    tmp = Path(tempfile.mkdtemp(prefix="ks-"))
    try:
        run = subprocess.run(
            [sys.executable, "-m", "tests.procs.dashboard_snapshot", "run", str(out), "--timeout", "30"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=80,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert not list(tmp.glob("krex-snap-*")), "its runtime dir is left in /tmp"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    page = (out / "dashboard.html").read_text()
    for text in ("SIMULATED GPUs", "held by", "region-loop-a", "region-loop-b", "idle-neighbour", "<svg"):
        assert text in page, text
    assert "r1" in page and "max_hold" in page, "a held region and a finished one"


def test_withdrawn_request_leaves_the_queue_at_once() -> None:
    events = script()
    before = reduce_all(NodeState(), events[:10])  # r2 and r3 queued behind r1
    assert [w.region for w in before.gpu(0).queue] == ["r2", "r3"]  # type: ignore[union-attr]
    after = reduce(before, Event("region", {"event": "withdrawn", "region": "r2", "gpu": 0}, events[9].at + 1))
    assert [w.region for w in after.gpu(0).queue] == ["r3"]  # type: ignore[union-attr]
    assert after.gpu(0).holder == before.gpu(0).holder  # type: ignore[union-attr]


def test_another_users_region_on_a_private_node_is_drawn_without_its_details() -> None:
    # What a private multi-user arbiter publishes (krex_lab.arbiter.privacy.public_event): the
    # holder and waiters of other users without session or pid, their sessions only as counts.
    from krex_lab.arbiter.privacy import public_event
    from krex_lab.dashboard.view import sessions_html

    holder = {
        "region": "r3",
        "session": "s9",
        "pid": 99,
        "uid": 1001,
        "user": "bob",
        "name": "b.ipynb",
        "state": "held",
        "held_s": 1.5,
        "max_hold_s": 30.0,
    }
    waiter = {"region": "r4", "session": "s8", "pid": 98, "uid": 1001, "user": "bob", "name": "w", "waiting_s": 0.2}
    bob = {**sess("s9", 99, "b.ipynb"), "uid": 1001, "user": "bob"}
    gpus = [{**gpu_row(0, (bob,)), "holder": holder, "queue": [waiter]}]
    anonymous = public_event("telemetry", {**status(gpus=gpus), "seq": 3, "interval": 1.0, "time": T0})
    g = reduce(NodeState(), Event("telemetry", anonymous, T0)).gpu(0)
    assert g is not None and g.holder is not None and g.holder.user == "bob" and g.holder.pid == 0
    assert [w.user for w in g.queue] == ["bob"] and not g.sessions and g.others == (("bob", 1),)
    assert "other users: bob (1)" in sessions_html(g)


def test_another_users_holder_and_waiter_show_by_name_only() -> None:
    """On a private arbiter another user's region carries no session name or pid: the dashboard
    says whose it is, never "(session, pid 0)"."""
    from krex_lab.dashboard.model import GpuState, Holder, Waiter
    from krex_lab.dashboard.view import holder_html, queue_html

    holder = Holder(region="r7", session="", pid=0, user="alice", name="", role="", since=0.0, max_hold_s=20.0)
    waiter = Waiter(region="r8", session="", pid=0, user="carol", name="", since=0.0)
    gpu = GpuState(index=0, name="Fake GPU", holder=holder, queue=(waiter,))
    html = holder_html(gpu, now=1.0)
    assert "held by <b>alice</b>" in html and "pid 0" not in html and "(session" not in html, html
    waiting = queue_html(gpu, now=1.0)
    assert "<li>carol " in waiting and "pid 0" not in waiting, waiting
    mine = Holder(region="r7", session="s1", pid=42, user="bob", name="nb", role="kernel", since=0.0, max_hold_s=20.0)
    assert "nb (kernel, pid 42)" in holder_html(GpuState(index=0, name="Fake GPU", holder=mine), now=1.0)


def test_another_users_session_and_region_events_on_a_private_node() -> None:
    """The events a private arbiter publishes of another user: a session event without id or pid
    (it raised KeyError: 'pid' in the dashboard's handler), then that user's region granted."""
    from krex_lab.arbiter.privacy import public_event
    from krex_lab.dashboard.view import holder_html

    state = reduce(NodeState(), Event("telemetry", status(gpus=[gpu_row(0, ())]), T0))
    joined = {"event": "joined", "id": "s5", "pid": 77, "uid": 1002, "user": "alice", "gpu": 0, "role": "kernel"}
    state = reduce(state, Event("session", public_event("session", joined), T0 + 0.1))
    granted = {"event": "granted", "region": "r5", "gpu": 0, "session": "s5", "holder_pid": 77, "user": "alice"}
    state = reduce(state, Event("region", public_event("region", {**granted, "max_hold_s": 20.0}), T0 + 0.2))
    g = state.gpu(0)
    assert g is not None and g.holder is not None and g.holder.user == "alice" and g.holder.pid == 0
    assert "held by <b>alice</b>" in holder_html(g, now=T0 + 1)
