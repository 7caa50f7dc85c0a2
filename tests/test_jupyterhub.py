"""KREX on a real JupyterHub: a root ``jupyterhub`` (dummy authenticator, local process spawner,
configurable-http-proxy) spawns the servers of two real Unix users made with ``useradd``; both
servers use the node's root ``krex arbiter --multi-user`` (fake backend, one GPU).

Everything goes the way a person's browser would: servers spawned through the hub's REST API, a
``krex`` kernel started in each through the single-user server's REST API (through the proxy, with
a token of that user) and driven over its websocket. Shown: alice's ``%%krex_exclusive`` cell stops
bob's kernel (state T) and bob's running cell resumes after; bob cannot end, join or read the
details of alice's region; a quota refuses with a clear message; the admin page ends a region;
nothing is left stopped and no process of either user survives their server's shutdown.

The tests of this module share one hub (module fixture) and run in order; the last one stops the
servers. Skipped, saying why, unless root with useradd, configurable-http-proxy, jupyterhub and a
venv the users can run (built once, see :mod:`tests.hubsupport.venv`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.hubsupport.hub import Hub, free_port
from tests.hubsupport.kernel import KernelWS
from tests.hubsupport.users import HubUser, can_make_users, describe, kernel_process, make_users, processes_of
from tests.hubsupport.venv import VenvUnavailable, user_venv
from tests.support import ROOT

pytestmark = pytest.mark.timeout(300)

#: the arbiter's per-user cap on a lease: alice's 30 s regions pass, bob's 60 s one is refused
MAX_HOLD_QUOTA = 45

ADMIN_REASON = (
    "krex_lab.hub (the JupyterHub admin service and `krex hub-config`) is not installed: "
    "no admin page to end a region through"
)


@dataclass
class Node:
    hub: Hub
    arbiter: ArbiterProc
    alice: HubUser
    bob: HubUser
    admin: str
    base: Path
    tokens: dict[str, str] = field(default_factory=dict)
    kernel_ids: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, KernelWS] = field(default_factory=dict)
    admin_service: bool = False
    #: the output of alice's cell whose region the admin page ended
    admin_ended_cell: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def uids(self) -> set[int]:
        return {self.alice.uid, self.bob.uid}

    def kernel_pid(self, user: HubUser) -> int:
        p = kernel_process(user.uid, self.kernel_ids[user.name])
        assert p is not None, f"no kernel process of {user.name}:\n{describe(processes_of({user.uid}))}"
        return p.pid

    def stopped(self) -> list[psutil.Process]:
        return [p for p in processes_of(self.uids) if _status(p) == psutil.STATUS_STOPPED]


def _status(p: psutil.Process) -> str | None:
    try:
        return str(p.status())
    except psutil.Error:
        return None


def _skip_unless_possible() -> tuple[str, Path]:
    why = can_make_users()
    if why:
        pytest.skip(why)
    chp = shutil.which("configurable-http-proxy")
    if chp is None:
        pytest.skip("configurable-http-proxy is not installed (.ci/run installs it with npm; the install failed)")
    try:
        import jupyterhub
    except ImportError:
        pytest.skip("jupyterhub is not installed in the test environment")
    try:
        venv = user_venv(ROOT, jupyterhub.__version__)
    except VenvUnavailable as exc:
        pytest.skip(f"no venv the test users can run: {exc}")
    return chp, venv


def _as_user(user: HubUser, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": str(user.home), "LC_ALL": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _krex_hub_config(python: str, runtime: Path, admin: str, admin_port: int) -> str:
    """What ``krex hub-config`` generates for this node (the deployment's own file: the admin page
    service, its roles, every server on the node arbiter, the quotas), or "" without krex_lab.hub.
    The arbiter is the test's own (``--no-arbiter-service``: one simulated GPU, stopped by the test)."""
    if importlib.util.find_spec("krex_lab.hub") is None:
        return ""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "krex_lab.cli",
            "hub-config",
            "--python",
            python,
            "--runtime-dir",
            str(runtime),
            "--admin",
            admin,
            "--admin-port",
            str(admin_port),
            "--max-hold",
            str(MAX_HOLD_QUOTA),
            "--backend",
            "fake",
            "--no-arbiter-service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"krex hub-config failed: {r.stdout}{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    chp, venv = _skip_unless_possible()
    with contextlib.ExitStack() as stack:
        base = Path(tempfile.mkdtemp(prefix="krex-hub-"))
        os.chmod(base, 0o755)
        stack.callback(shutil.rmtree, base, True)
        (base / "home").mkdir(mode=0o755)
        (base / "rt").mkdir(mode=0o755)
        (base / "hub").mkdir(mode=0o700)
        alice, bob = stack.enter_context(make_users(base / "home", "khalice", "khbob"))
        r = _as_user(alice, str(venv / "bin" / "python"), "-c", "import krex_lab.serverext, jupyterhub, ipykernel")
        if r.returncode != 0:
            pytest.skip(f"a test user cannot run the venv {venv}: {r.stderr[-800:]}")
        for u in (alice, bob):  # each user's own KREX runtime dir (pool socket, logs): theirs, 0700
            rt = base / "rt" / u.name
            rt.mkdir(mode=0o700)
            os.chown(rt, u.uid, u.gid)
        # The node's root arbiter on a root-owned 0755 runtime dir (as /run/krex would be); it reads
        # its quotas from the hub's config file, as the generated arbiter service would.
        runtime = base / "arbiter"
        runtime.mkdir(mode=0o755)
        admin = f"khadmin{alice.name[-6:]}"
        generated = _krex_hub_config(sys.executable, runtime, admin, free_port())
        rt = str(base / "rt")
        environment = (
            "{"
            f"'KREX_ENDPOINT': {f'ipc://{runtime}/arbiter.sock'!r}, "
            f"'KREX_RUNTIME_DIR': lambda spawner: {rt!r} + '/' + spawner.user.name, "
            f"'KREX_POOL_ENDPOINT': lambda spawner: 'ipc://' + {rt!r} + '/' + spawner.user.name + '/pool.sock'"
            "}"
        )
        hub = Hub(
            base / "hub",
            venv,
            users=[alice.name, bob.name, admin],
            admin=admin,
            chp=chp,
            environment=environment,
            # the pool preloads nothing: a warm import of torch & co. is not what this test is about
            spawner_args=["--KrexExtensionApp.pool_args=--no-preload", "--KrexExtensionApp.watch_interval=0"],
            base_config=generated,
        )
        hub.config_file.write_text(hub.config())
        quotas = ("--config", str(hub.config_file)) if generated else (f"--Quotas.max_hold={MAX_HOLD_QUOTA}",)
        arb = ArbiterProc(runtime, gpus=1, extra=("--multi-user", *quotas))
        arb.start()
        stack.callback(arb.stop)
        assert arb.endpoint == f"ipc://{runtime}/arbiter.sock"
        stack.callback(hub.stop)
        hub.start()
        n = Node(hub, arb, alice, bob, admin, base, admin_service=bool(generated))
        for u in (alice, bob):
            hub.spawn(u.name)
        for u in (alice, bob):
            hub.wait_ready(u.name)
            n.tokens[u.name] = hub.user_token(u.name)
        for u in (alice, bob):
            model = hub.user_api(u.name, n.tokens[u.name], "POST", "/kernels", {"name": "krex"})
            n.kernel_ids[u.name] = model["id"]
        for u in (alice, bob):
            try:
                k = KernelWS(hub.ws_url(u.name, n.kernel_ids[u.name]), n.tokens[u.name], timeout=90)
            except Exception as exc:  # the hub's log holds the user servers' (a kernel restart, say)
                raise AssertionError(f"{u.name}'s kernel did not answer: {exc!r}\n{hub.log_tail(80)}") from exc
            stack.callback(k.close)
            n.kernels[u.name] = k
        try:
            yield n
        finally:
            for p in n.stopped():  # never leave anyone stopped, whatever failed
                with contextlib.suppress(psutil.Error):
                    p.resume()


def _sessions(node: Node) -> list[dict[str, Any]]:
    """The GPU's sessions in full (the test is root: the arbiter's admin view)."""
    return list(node.arbiter.status()["gpus"][0]["sessions"])


def _holder(node: Node) -> dict[str, Any] | None:
    holder: dict[str, Any] | None = node.arbiter.status()["gpus"][0]["holder"]
    return holder


def _last_region(node: Node) -> dict[str, Any]:
    """The newest region's full report (root's view)."""
    from krex_lab import protocol
    from krex_lab.client import Connection

    conn = Connection(node.arbiter.endpoint)
    try:
        regions: list[dict[str, Any]] = conn.call(protocol.Regions(limit=1, ticket=conn.ticket()))
        return regions[-1]
    finally:
        conn.close()


def test_kernels_are_sessions_of_the_node_arbiter(node: Node) -> None:
    """Each user's kernel registered itself with the root arbiter (no embedded one), as that user."""
    alice_pid, bob_pid = node.kernel_pid(node.alice), node.kernel_pid(node.bob)
    wait_for(lambda: {alice_pid, bob_pid} <= {s["pid"] for s in _sessions(node)}, 30, 0.2)
    by_pid = {s["pid"]: s for s in _sessions(node)}
    assert by_pid[alice_pid]["user"] == node.alice.name and by_pid[alice_pid]["uid"] == node.alice.uid
    assert by_pid[bob_pid]["user"] == node.bob.name and by_pid[bob_pid]["gpu"] == 0
    # The server's parent is the hub (root); the kernel is its user's, child of that user's server.
    server = psutil.Process(bob_pid).parent()
    assert server.uids().real == node.bob.uid and "jupyterhub-singleuser" in " ".join(server.cmdline())
    out = node.kernels[node.bob.name].run("import os; print(os.environ['KREX_ENDPOINT'], os.getuid())")
    assert out.stdout.split() == [node.arbiter.endpoint, str(node.bob.uid)]


def test_exclusive_cell_stops_bobs_kernel_and_bob_resumes(node: Node) -> None:
    alice, bob = node.kernels[node.alice.name], node.kernels[node.bob.name]
    bob_pid = node.kernel_pid(node.bob)
    counter = bob.execute(
        "import time\nfor i in range(60):\n    print(f'tick {i} {time.time():.3f}', flush=True)\n    time.sleep(0.1)"
    )
    wait_for(lambda: len(counter.streams) >= 5, 30, 0.05)
    region = alice.execute("%%krex_exclusive --max-hold 30\nimport time\ntime.sleep(3)")
    states: list[str | None] = []

    def stopped() -> bool:
        states.append(_status(psutil.Process(bob_pid)))
        return states[-1] == psutil.STATUS_STOPPED

    wait_for(stopped, 15, 0.02)
    ticks_when_stopped = len(counter.streams)
    time.sleep(1.0)
    assert _status(psutil.Process(bob_pid)) == psutil.STATUS_STOPPED, "bob's kernel stays stopped in the region"
    assert len(counter.streams) == ticks_when_stopped, "a stopped kernel prints nothing"
    holder = _holder(node)
    assert holder is not None and holder["user"] == node.alice.name
    alice.wait(region, 30)
    assert region.status == "ok", region.output
    assert "KREX region" in region.stdout and "frozen" in region.stdout, region.stdout
    report = _last_region(node)
    assert report["region"] == holder["region"] and bob_pid in report["frozen"], report
    wait_for(lambda: _status(psutil.Process(bob_pid)) != psutil.STATUS_STOPPED, 10, 0.05)
    bob.wait(counter, 60)
    assert counter.status == "ok", counter.output
    ticks = [line.split() for line in counter.stdout.splitlines() if line.startswith("tick")]
    assert [int(t[1]) for t in ticks] == list(range(60)), "every tick, in order: the cell resumed where it stopped"
    gaps = [float(b[2]) - float(a[2]) for a, b in itertools.pairwise(ticks)]
    big = max(range(len(gaps)), key=gaps.__getitem__)
    assert gaps[big] >= 2.0, f"bob's counter paused for alice's region: largest gap {gaps[big]:.2f} s"
    assert big < len(gaps) - 5, "and went on ticking after it"
    assert not node.stopped(), describe(node.stopped())


# bob's probes, run in bob's kernel while alice holds a region that freezes nothing (a frozen
# kernel could not probe): release, force-release, join (KREX_REGION), and the status he sees.
BOB_PROBE = r"""
import json, os, subprocess, sys
from krex_lab import client, protocol
from krex_lab.errors import KrexError
out = {}
me = client.current_session()
status = json.loads(subprocess.run([sys.executable, "-m", "krex_lab.cli", "status", "--json"],
                                   capture_output=True, text=True, timeout=60).stdout)
out["status"] = status
rid = status["gpus"][0]["holder"]["region"]
for force in (False, True):
    try:
        out[f"release_force_{force}"] = ["ended", me.call(protocol.Release(region=rid, force=force))]
    except KrexError as exc:
        out[f"release_force_{force}"] = [type(exc).__name__, str(exc)]
JOIN = '''
import json
from krex_lab import client, protocol
from krex_lab.errors import KrexError
s = client.Session(gpu=0, name="bob-join")
mine = [x for x in client.status()["gpus"][0]["sessions"] if x["id"] == s.id]
res = {"within": mine[0]["within"] if mine else None}
conn = s.connection()
rid = conn.send(protocol.Acquire(session=s.id, token=s.token, gpu=0, max_hold=5, freeze=False))
try:
    res["acquire"] = ["granted", conn.wait(rid, timeout=1.5)]
except KrexError as exc:
    res["acquire"] = [type(exc).__name__, str(exc)]
print(json.dumps(res))
'''
r = subprocess.run([sys.executable, "-c", JOIN], env={**os.environ, "KREX_REGION": rid},
                   capture_output=True, text=True, timeout=60)
out["join"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else r.stderr[-2000:]
print("PROBE " + json.dumps(out))
"""


def _alice_holds_until(node: Node, flag: Path) -> Any:
    """alice's region that freezes nothing, held until ``flag`` exists (at most 25 s)."""
    cell = (
        "%%krex_exclusive --no-freeze --max-hold 30\nimport os, time\nt = time.monotonic()\n"
        f"while not os.path.exists({str(flag)!r}) and time.monotonic() - t < 25:\n    time.sleep(0.05)"
    )
    ex = node.kernels[node.alice.name].execute(cell)
    wait_for(lambda: (_holder(node) or {}).get("user") == node.alice.name, 20, 0.05)
    return ex


def test_bob_cannot_end_join_or_read_alices_region(node: Node) -> None:
    flag = node.base / "alice-release"
    region = _alice_holds_until(node, flag)
    try:
        holder = _holder(node)
        assert holder is not None
        rid, alice_session = holder["region"], holder["session"]
        alice_pid = node.kernel_pid(node.alice)
        probe = node.kernels[node.bob.name].run(BOB_PROBE, timeout=90)
        line = next(x for x in probe.stdout.splitlines() if x.startswith("PROBE "))
        out = json.loads(line[len("PROBE ") :])
    finally:
        flag.touch()
    node.kernels[node.alice.name].wait(region, 30)
    assert region.status == "ok", region.output
    # End: neither as a session of his own nor with force (he is not an admin).
    assert out["release_force_False"][0] == "NotHolder", out["release_force_False"]
    assert out["release_force_True"][0] == "PermissionDenied", out["release_force_True"]
    assert "admin" in out["release_force_True"][1]
    # Join: KREX_REGION set to alice's region makes an ordinary session, which queues behind her.
    join = out["join"]
    assert isinstance(join, dict), join
    assert join["within"] == "", "an inherited/false KREX_REGION is not a way into another's region"
    assert join["acquire"][0] != "granted", f"bob's request was granted inside alice's region: {join}"
    # Read: `krex status` as bob shows alice only as a user name and counts.
    g = out["status"]["gpus"][0]
    assert g["other_sessions"].get(node.alice.name, 0) >= 1, g
    assert all(s["uid"] == node.bob.uid for s in g["sessions"]), "his own sessions only"
    assert g["holder"]["user"] == node.alice.name and g["holder"]["region"] == rid
    for secret in ("session", "pid", "frozen", "drained", "name", "uid"):
        assert secret not in g["holder"], f"bob sees {secret!r} of alice's region: {g['holder']}"
    text = json.dumps(out["status"])
    assert alice_session not in text and f" {alice_pid}," not in text.replace("[", " ").replace(":", " ")
    assert _holder(node) is None or _holder(node)["user"] != node.alice.name
    assert not node.stopped(), describe(node.stopped())


def test_quota_refuses_with_a_clear_message(node: Node) -> None:
    ex = node.kernels[node.bob.name].wait(
        node.kernels[node.bob.name].execute("%%krex_exclusive --max-hold 60\nprint('ran')"), 60
    )
    assert ex.status == "error", ex.output
    assert "ran" not in ex.stdout, "the cell does not run without its region"
    assert "KREX: " in ex.output and f"max_hold={MAX_HOLD_QUOTA}" in ex.output, ex.output
    assert "QuotaExceeded" in ex.output, ex.output
    assert "Traceback" not in ex.stdout, "a KREX refusal is one line, not a traceback"
    # Within the quota the same user's region is granted.
    node.kernels[node.bob.name].run("%%krex_exclusive --max-hold 10\nprint('ran')", timeout=60)


def test_admin_page_ends_a_region(node: Node) -> None:
    """The krex-admin service (registered by the generated hub config) ends alice's region for an
    admin's token; bob's token gets 403."""
    if not node.admin_service:
        pytest.xfail(ADMIN_REASON)
    services = node.hub.api("GET", "/services")
    assert "krex-admin" in services, services
    prefix = services["krex-admin"]["prefix"]
    page_url = f"{node.hub.url}{prefix}"
    admin_token = str(node.hub.api("POST", f"/users/{node.admin}/tokens", {"expires_in": 600})["token"])
    code, _ = node.hub.request("GET", page_url, node.tokens[node.bob.name])
    assert code == 403, f"bob got the admin page: {code}"
    flag = node.base / "admin-test-release"
    region = _alice_holds_until(node, flag)
    try:
        holder = _holder(node)
        assert holder is not None
        rid = holder["region"]
        code, page = node.hub.request("GET", page_url, admin_token)
        assert code == 200 and rid in str(page) and node.alice.name in str(page), (code, str(page)[:2000])
        code, body = node.hub.request("POST", f"{page_url}end-region", node.tokens[node.bob.name], form={"region": rid})
        assert code == 403 and (_holder(node) or {}).get("region") == rid, "bob cannot end it through the page"
        code, body = node.hub.request("POST", f"{page_url}end-region", admin_token, form={"region": rid})
        assert code == 200 and "ended region" in str(body), (code, body)
        wait_for(lambda: _holder(node) is None, 10, 0.05)
        report = _last_region(node)
        assert report["region"] == rid and "ended by admin" in report["released_by"], report
    finally:
        flag.touch()
    node.kernels[node.alice.name].wait(region, 30)
    node.admin_ended_cell = region.output
    assert not node.stopped(), describe(node.stopped())


def test_holder_hears_that_an_admin_ended_the_region(node: Node) -> None:
    if node.admin_ended_cell is None:
        pytest.skip("the admin page test did not end a region")
    assert "ended by admin" in node.admin_ended_cell.lower(), node.admin_ended_cell


def test_shutdown_leaves_no_process_and_nothing_stopped(node: Node) -> None:
    seen = {u.name: [p.pid for p in processes_of({u.uid})] for u in (node.alice, node.bob)}
    assert all(len(pids) >= 2 for pids in seen.values()), f"server and kernel of each: {seen}"
    for k in node.kernels.values():
        k.close()
    for u in (node.alice, node.bob):
        node.hub.stop_server(u.name)
    left: list[psutil.Process] = []

    def gone() -> bool:
        left[:] = processes_of(node.uids)
        return not left

    with contextlib.suppress(AssertionError):
        wait_for(gone, 20, 0.2)
    assert not left, f"processes that survived their server's shutdown:\n{describe(left)}"
    assert not node.stopped()
    # their sessions ended with them (the admin page's own session is root's)
    wait_for(lambda: not [s for s in _sessions(node) if s["uid"] in node.uids], 10, 0.1)
    assert _holder(node) is None
