"""KREX on a real JupyterHub, set up as docs/jupyterhub.md sets it up and nothing else: the venv's
``krex hub-config`` writes the config (students allowed by their Unix group, one admin, a
``max_hold`` quota, the fake backend with one GPU), and the venv's ``jupyterhub`` runs it as
generated, started by absolute path from a plain ``PATH`` (:mod:`tests.hubsupport.hub`). The hub
starts the node arbiter and the admin page itself (its managed services), authenticates with PAM,
spawns with the local process spawner behind configurable-http-proxy. Two students and an admin
are real Unix users made with ``useradd``.

Everything goes the way people would: each student logs in through the login form (an HTTP POST
to ``/hub/login``), which spawns their server; a ``krex`` kernel is started in it through its REST
API with a token the student made, and driven over its websocket. Shown: a non-admin student gets
in and their server starts (the venv on its PATH, the KREX kernel the only one offered); alice's
``%%krex_exclusive`` cell stops bob's kernel (state T) and bob's running cell resumes after; bob
cannot end, join or read the details of alice's region, and his status table renders her region;
a ``max_hold`` quota caps a lease, and an edited quota applies on SIGHUP without a restart; the
admin page reads the region history and ends a region; nothing is left stopped and no process of
either student survives their server's shutdown.

The tests of this module share one hub (module fixture) and run in order; the last one stops the
servers. Skipped, saying why, unless root with useradd and PAM, configurable-http-proxy and a venv
the users can run (built once, see :mod:`tests.hubsupport.venv`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab.pytest_plugin import wait_for
from tests.hubsupport.hub import Hub, NodeArbiter, start_documented_hub
from tests.hubsupport.kernel import KernelWS
from tests.hubsupport.users import HubUser, can_make_users, describe, kernel_process, make_users, processes_of
from tests.hubsupport.venv import VenvUnavailable, user_venv
from tests.support import ROOT, frozen

pytestmark = pytest.mark.timeout(300)

#: the students' longest lease (s): alice's 30 s regions pass, bob's 60 s one is capped to it
MAX_HOLD_QUOTA = 45


@dataclass
class Node:
    hub: Hub
    arbiter: NodeArbiter
    alice: HubUser
    bob: HubUser
    admin: HubUser
    base: Path
    venv: Path
    tokens: dict[str, str] = field(default_factory=dict)
    kernel_ids: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, KernelWS] = field(default_factory=dict)
    #: where each student's login sent them (the spawn, then their server)
    landed: dict[str, str] = field(default_factory=dict)
    #: the output of alice's cell whose region the admin page ended
    admin_ended_cell: str | None = None

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


def _skip_unless_possible() -> Path:
    """The deployment's venv (JupyterHub the version of the test's own), or a skip saying why not."""
    why = can_make_users()
    if why:
        pytest.skip(why)
    if shutil.which("configurable-http-proxy", path="/usr/local/bin:/usr/bin:/bin") is None:
        pytest.skip("configurable-http-proxy is not installed (`npm install -g configurable-http-proxy`)")
    try:
        import jupyterhub
    except ImportError:
        pytest.skip("jupyterhub is not installed in the test environment")
    try:
        return user_venv(ROOT, jupyterhub.__version__)
    except VenvUnavailable as exc:
        pytest.skip(f"no venv the test users can run: {exc}")


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


def student_logs_in(hub: Hub, user: HubUser) -> tuple[str, str]:
    """The student's browser: the login form, then wherever the hub sends them (it spawns their
    server); returns the page they land on and a token they made with their login cookie."""
    browser = hub.browser()
    where = browser.login(user.name, user.password)
    _, landed, _, _ = browser.open("GET", where if where.startswith("/") else "/hub/")
    return landed, browser.token(user.name)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    venv = _skip_unless_possible()
    with contextlib.ExitStack() as stack:
        base = Path(tempfile.mkdtemp(prefix="krex-hub-"))
        os.chmod(base, 0o755)
        stack.callback(shutil.rmtree, base, True)
        (base / "home").mkdir(mode=0o755)
        group = f"khstu{os.urandom(3).hex()}"
        alice, bob, admin = stack.enter_context(
            make_users(base / "home", "khalice", "khbob", "khadmin", group=group, members=2)
        )
        r = _as_user(alice, str(venv / "bin" / "python"), "-c", "import krex_lab.serverext, jupyterhub, ipykernel")
        if r.returncode != 0:
            pytest.skip(f"a test user cannot run the venv {venv}: {r.stderr[-800:]}")
        hub, arbiter = start_documented_hub(
            stack, base, venv, admin.name, admin.password, "--allow-group", group, "--max-hold", str(MAX_HOLD_QUOTA)
        )
        n = Node(hub, arbiter, alice, bob, admin, base, venv)
        for u in (alice, bob):
            try:
                n.landed[u.name], n.tokens[u.name] = student_logs_in(hub, u)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- hub log ---\n{hub.log_tail(60)}") from None
        for u in (alice, bob):
            hub.wait_ready(u.name)
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


def test_students_log_in_through_the_form_and_their_servers_start(node: Node) -> None:
    """The documented path: non-admin students, allowed by their Unix group (JupyterHub 5 let only
    admins in without an allow rule), land on their own server, which runs the venv's
    jupyterhub-singleuser with the venv on its PATH (it was "not found" from a plain PATH)."""
    for u in (node.alice, node.bob):
        landed = node.landed[u.name]
        assert f"/user/{u.name}/" in landed or f"/hub/spawn-pending/{u.name}" in landed, f"{u.name}: {landed}"
        model = node.hub.api("GET", f"/users/{u.name}")
        assert model["admin"] is False and model["servers"][""]["ready"], model
    # the config file is the generated one, byte for byte (no test settings appended)
    text = node.hub.config_file.read_text()
    assert text.startswith("# jupyterhub_config.py with KREX wired in: generated by `krex hub-config`")
    assert "get_config()" in text and text.count("c = get_config()") == 1
    server = psutil.Process(node.kernel_pid(node.bob)).parent()
    assert server.cmdline()[1:2] == [str(node.venv / "bin" / "jupyterhub-singleuser")] or any(
        a == str(node.venv / "bin" / "jupyterhub-singleuser") for a in server.cmdline()
    ), server.cmdline()
    out = node.kernels[node.bob.name].run("import shutil; print(shutil.which('krex'), shutil.which('jupyter'))")
    assert out.stdout.split() == [str(node.venv / "bin" / "krex"), str(node.venv / "bin" / "jupyter")], out.stdout


def test_the_krex_kernel_is_the_only_one_offered(node: Node) -> None:
    """The launcher offered "Python 3 (ipykernel)" first: its kernels are not KREX sessions."""
    specs = node.hub.user_api(node.alice.name, node.tokens[node.alice.name], "GET", "/kernelspecs")
    assert specs["default"] == "krex" and sorted(specs["kernelspecs"]) == ["krex"], specs
    assert specs["kernelspecs"]["krex"]["spec"]["display_name"] == "Python 3 (KREX)"


def test_exclusive_cell_stops_bobs_kernel_and_bob_resumes(node: Node) -> None:
    alice, bob = node.kernels[node.alice.name], node.kernels[node.bob.name]
    bob_pid = node.kernel_pid(node.bob)
    counter = bob.execute(
        "import time\nfor i in range(60):\n    print(f'tick {i} {time.time():.3f}', flush=True)\n    time.sleep(0.1)"
    )
    wait_for(lambda: len(counter.streams) >= 5, 30, 0.05)
    region = alice.execute("%%krex_exclusive --max-hold 30\nimport time\ntime.sleep(3)")
    states: list[str | None] = []

    # Stopped: by SIGSTOP, or in a frozen cgroup (the root node arbiter's freezer where the
    # machine gives cgroup v2: a frozen task reads as sleeping).
    def stopped() -> bool:
        states.append(_status(psutil.Process(bob_pid)))
        return frozen(bob_pid)

    wait_for(stopped, 15, 0.02)
    ticks_when_stopped = len(counter.streams)
    time.sleep(1.0)
    assert frozen(bob_pid), "bob's kernel stays stopped in the region"
    assert len(counter.streams) == ticks_when_stopped, "a stopped kernel prints nothing"
    holder = _holder(node)
    assert holder is not None and holder["user"] == node.alice.name
    alice.wait(region, 30)
    assert region.status == "ok", region.output
    assert "KREX region" in region.stdout and "frozen" in region.stdout, region.stdout
    report = _last_region(node)
    assert report["region"] == holder["region"] and bob_pid in report["frozen"], report
    wait_for(lambda: not frozen(bob_pid), 10, 0.05)
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


def test_bobs_status_shows_alices_region_by_her_name(node: Node) -> None:
    """While alice holds the GPU, bob's ``%krex_status`` and ``krex status`` in his terminal render
    her region as hers, without its name or pid (they raised KeyError 'name'), and her sessions as
    a count."""
    flag = node.base / "alice-release-status"
    region = _alice_holds_until(node, flag)
    try:
        rid = (_holder(node) or {}).get("region")
        magic = node.kernels[node.bob.name].run("%krex_status", timeout=60)
        shell = node.kernels[node.bob.name].run(
            "import subprocess\nr = subprocess.run(['krex', 'status'], capture_output=True, text=True, timeout=60)\n"
            "print(r.returncode, r.stdout, r.stderr)",
            timeout=90,
        )
    finally:
        flag.touch()
    node.kernels[node.alice.name].wait(region, 30)
    alice_pid = node.kernel_pid(node.alice)
    for out in (magic.stdout, shell.stdout):
        assert f"holder: user {node.alice.name} region {rid} held" in out, out
        assert f"other users' sessions: {node.alice.name} (" in out, out  # her kernel and pool workers
        assert str(alice_pid) not in out and "KeyError" not in out, out
    assert shell.stdout.startswith("0 "), shell.stdout


def test_a_max_hold_quota_caps_the_lease(node: Node) -> None:
    """bob asks for 60 s over his 45 s quota: the region is granted for 45 s, and its report says
    why (every region over the quota used to fail, the arbiter's 60 s default included)."""
    ex = node.kernels[node.bob.name].run("%%krex_exclusive --max-hold 60\nprint('ran')", timeout=60)
    assert "ran" in ex.stdout, ex.output
    assert f"lease capped at {MAX_HOLD_QUOTA} s by this user's max_hold quota (asked 60 s)" in ex.stdout, ex.stdout
    report = _last_region(node)
    assert report["max_hold_s"] == MAX_HOLD_QUOTA and report["max_hold_asked_s"] == 60, report
    # a plain region (the arbiter's default lease, 60 s) is granted too
    plain = node.kernels[node.bob.name].run("%%krex_exclusive\nprint('plain ran')", timeout=60)
    assert "plain ran" in plain.stdout and "lease capped" in plain.stdout, plain.stdout


def test_an_edited_quota_applies_on_sighup_without_a_restart(node: Node) -> None:
    """The admin raises bob's max_hold in the hub's config file and sends the arbiter SIGHUP: the
    next region gets the new limit; no server, kernel or session was restarted."""
    config = node.hub.config_file
    text = config.read_text()
    assert "c.Quotas.users = {}" in text, "the generated quota section"
    bob_kernel = node.kernel_pid(node.bob)
    before = node.arbiter.status()["arbiter"]
    raised = f"c.Quotas.users = {{{node.bob.name!r}: {{'max_hold': 50}}}}"
    config.write_text(text.replace("c.Quotas.users = {}", raised))
    try:
        # as the docs say: the arbiter's pid is the first line of its lock file
        pid = int((node.arbiter.runtime / "arbiter.lock").read_text().split()[0])
        assert pid == before["pid"]
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: "reloaded" in node.arbiter.status()["arbiter"].get("quotas", ""), 15, 0.1)
        after = node.arbiter.status()["arbiter"]
        assert after["pid"] == before["pid"] and after["started"] == before["started"], "the same arbiter"
        assert "users" in after["quotas"], after["quotas"]
        ex = node.kernels[node.bob.name].run("%%krex_exclusive --max-hold 60\nprint('ran')", timeout=60)
        assert "lease capped at 50 s" in ex.stdout, ex.stdout
        assert node.kernel_pid(node.bob) == bob_kernel, "bob's kernel was not restarted"
        status = node.kernels[node.bob.name].run("%krex_status", timeout=60).stdout
        assert "quotas: reloaded from" in status, status
    finally:
        config.write_text(text)
        os.kill(before["pid"], signal.SIGHUP)


def test_admin_page_ends_a_region(node: Node) -> None:
    """The krex-admin service (a managed service of the generated config) reads the region history
    (it never did: a single-use ticket used twice) and ends alice's region for the admin; bob gets 403."""
    services = node.hub.api("GET", "/services")
    assert "krex-admin" in services, services
    prefix = services["krex-admin"]["prefix"]
    page_url = f"{node.hub.url}{prefix}"
    admin_token = node.hub.token
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
        assert "region history (SQLite)" in str(page), "the page reads the arbiter's region history"
        assert f"max_hold={MAX_HOLD_QUOTA} s" in str(page), "the quota table shows the limits"
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
