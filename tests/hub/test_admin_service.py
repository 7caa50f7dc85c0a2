"""The admin page behind a real JupyterHub (the config of ``krex hub-config``, the service started
by the hub as a managed service, authenticated by the hub's own tokens): a KREX admin sees the
page and ends another session's region; an ordinary user gets 403; nobody gets in anonymously.

Only the proxy is replaced (:mod:`tests.hub.memproxy`: configurable-http-proxy is a node package)
and the authenticator is JupyterHub's DummyAuthenticator (no login happens: tokens are given in
the config). Needs root (the service runs as root to see the arbiter's full view) and jupyterhub.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("jupyterhub")
pytest.importorskip("matplotlib")

import requests

from krex_lab import protocol
from krex_lab.hub.config import HubConfig, render
from krex_lab.pytest_plugin import ArbiterProc, subprocess_pythonpath

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the admin service runs as root")

ADMIN_TOKEN = "krex-test-admin-token-0123456789"
USER_TOKEN = "krex-test-user-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Hub:
    def __init__(self, tmp: Path, arbiter: ArbiterProc) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.hub_port = free_port()
        self.service_port = free_port()
        self.service = f"http://127.0.0.1:{self.service_port}/services/krex-admin/"
        cfg = HubConfig(
            python=sys.executable,
            runtime_dir=str(arbiter.runtime),
            admin_port=self.service_port,
            admins=["alice"],
            arbiter_service=False,
            backend="fake",
            allow_users=["bob"],
        )
        text = (
            render(cfg)
            + f"""
# -- test only: ports, state in tmp, no proxy process, no login (tokens) ----------------------
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"
c.JupyterHub.proxy_class = "tests.hub.memproxy.MemoryProxy"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{"bob"}}
c.JupyterHub.api_tokens = {{"{ADMIN_TOKEN}": "alice", "{USER_TOKEN}": "bob"}}
"""
        )
        self.config = tmp / "jupyterhub_config.py"
        self.config.write_text(text)
        self.log = tmp / "hub.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": subprocess_pythonpath()}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(self.config), "--no-ssl"],
                cwd=self.tmp,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the hub exited:\n{self.log.read_text()[-5000:]}"
            try:
                requests.get(self.service + "api/status", timeout=1, allow_redirects=False)
                return
            except requests.ConnectionError:
                time.sleep(0.2)
        raise AssertionError(f"the admin service did not answer:\n{self.log.read_text()[-5000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        # The hub leads its own process group: whatever it started and left behind goes with it. Its
        # managed services run in sessions of their own: find them by the config file they were given.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        for p in psutil.process_iter(["cmdline"]):
            if str(self.config) in (p.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):
                    p.kill()
                    p.wait(5)

    def get(self, path: str = "", token: str | None = None, **kw: Any) -> requests.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.get(self.service + path, headers=headers, timeout=30, allow_redirects=False, **kw)

    def post(self, path: str, data: dict[str, str], token: str | None = None) -> requests.Response:
        headers = {"Authorization": f"token {token}", "Accept": "application/json"} if token else {}
        return requests.post(self.service + path, data=data, headers=headers, timeout=30, allow_redirects=False)


@pytest.fixture
def arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o755)
    arb = ArbiterProc(runtime, gpus=2).start()
    monkeypatch.setenv("KREX_ENDPOINT", arb.endpoint)
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(runtime))
    yield arb
    arb.stop()


@pytest.fixture
def hub(tmp_path: Path, arbiter: ArbiterProc) -> Iterator[Hub]:
    h = Hub(tmp_path, arbiter)
    h.start()
    yield h
    h.stop()


def test_admin_sees_the_page_others_do_not(hub: Hub) -> None:
    page = hub.get(token=ADMIN_TOKEN)
    assert page.status_code == 200, page.text[-2000:]
    body = page.text
    assert 'id="gpus"' in body and "SIMULATED GPUs" in body
    assert '<div class="chart" id="utilisation"><svg' in body and '<div class="chart" id="gantt"><svg' in body
    assert hub.get("api/status", token=ADMIN_TOKEN).json()["status"]["gpus"][1]["index"] == 1

    assert hub.get(token=USER_TOKEN).status_code == 403
    assert hub.get("api/status", token=USER_TOKEN).status_code == 403
    anonymous = hub.get()
    assert anonymous.status_code == 302 and "/hub/" in anonymous.headers["Location"], "sent to the hub's login"
    assert hub.get(token="not-a-token").status_code in (302, 403)


def test_admin_ends_another_sessions_region(hub: Hub, arbiter: ArbiterProc) -> None:
    from krex_lab.client import Session

    holder = Session(gpu=0, name="holder", endpoint=arbiter.endpoint)
    waiter = Session(gpu=0, name="waiter", endpoint=arbiter.endpoint)
    try:
        granted = holder.call(protocol.Acquire(gpu=0, max_hold=120, freeze=False, isolate=False), timeout=10)
        conn = waiter.connection()
        waiter_request = protocol.Acquire(session=waiter.id, token=waiter.token, gpu=0, freeze=False, isolate=False)
        pending = conn.send(waiter_request)
        time.sleep(0.3)
        gpu0 = arbiter.status()["gpus"][0]
        assert gpu0["holder"]["region"] == granted.region and len(gpu0["queue"]) == 1
        queued_region = gpu0["queue"][0]["region"]

        page = hub.get(token=ADMIN_TOKEN).text
        assert f'data-region="{granted.region}"' in page and f'data-session="{waiter.id}"' in page
        assert "holder" in page and "waiter" in page

        refused = hub.post("end-region", {"region": granted.region}, token=USER_TOKEN)
        assert refused.status_code == 403
        assert arbiter.status()["gpus"][0]["holder"]["region"] == granted.region, "a refused post changes nothing"

        ended = hub.post("end-region", {"region": granted.region}, token=ADMIN_TOKEN)
        assert ended.status_code == 200, ended.text
        assert "ended region" in ended.json()["message"] and "ended by admin uid 0" in ended.json()["message"]
        # the waiter is granted next; then its own queue entry is gone
        result = conn.wait(pending, timeout=10)
        assert result["region"] == queued_region
        # The page ended it without a session of its own: none to drain or freeze in the next
        # region (a session without a control channel made every region on its GPU degraded).
        names = [s["name"] for g in arbiter.status()["gpus"] for s in g.get("sessions", [])]
        assert "krex-admin service" not in names, names
        assert result["report"]["degraded"] is False, result["report"]["not_drained"]

        page = hub.get(token=ADMIN_TOKEN).text
        assert 'id="gantt"' in page and granted.region in page  # in the region history table
    finally:
        waiter.close()
        holder.close()


def test_admin_withdraws_a_sessions_queue(hub: Hub, arbiter: ArbiterProc) -> None:
    from krex_lab.client import Session

    holder = Session(gpu=1, name="holder", endpoint=arbiter.endpoint)
    waiter = Session(gpu=1, name="waiter", endpoint=arbiter.endpoint)
    try:
        holder.call(protocol.Acquire(gpu=1, max_hold=120, freeze=False, isolate=False), timeout=10)
        conn = waiter.connection()
        pending = conn.send(protocol.Acquire(session=waiter.id, token=waiter.token, gpu=1, freeze=False, isolate=False))
        time.sleep(0.3)
        assert len(arbiter.status()["gpus"][1]["queue"]) == 1
        assert hub.post("end-queue", {"session": waiter.id}, token=USER_TOKEN).status_code == 403
        done = hub.post("end-queue", {"session": waiter.id}, token=ADMIN_TOKEN)
        assert done.status_code == 200 and "withdrew 1 queued" in done.json()["message"], done.text
        assert arbiter.status()["gpus"][1]["queue"] == []
        with pytest.raises(Exception):  # noqa: B017 - the withdrawn request is answered with an error
            conn.wait(pending, timeout=5)
    finally:
        waiter.close()
        holder.close()


def test_the_page_reads_the_region_history(arbiter: ArbiterProc) -> None:
    """Each history request takes an identity ticket of its own (a ticket is single-use: the page
    used to send its second request with the first one's and fell back to the in-memory list)."""
    from krex_lab.client import Session
    from krex_lab.hub.admin_page import Arbiter
    from krex_lab.pytest_plugin import wait_for

    s = Session(gpu=0, name="history", endpoint=arbiter.endpoint)
    try:
        granted = s.call(protocol.Acquire(gpu=0, max_hold=5, freeze=False, isolate=False))
        s.call(protocol.Release(region=granted.region))
    finally:
        s.close()
    page = Arbiter(arbiter.endpoint)
    seen: list[Any] = []

    def recorded() -> bool:
        seen[:] = [page.history()]
        return seen[0] is not None and granted.region in [r.region for r in seen[0].recent]

    wait_for(recorded, 10, 0.1)
    assert seen[0].usage.users, seen


def test_the_quota_table_shows_each_users_limits() -> None:
    """Every limit the user has, max_hold included (it appeared nowhere)."""
    import pwd
    import types

    from tornado.template import Loader

    from krex_lab.arbiter.quotas import Quotas
    from krex_lab.hub.admin_page import TEMPLATES, QuotaLimits, quota_use
    from krex_lab.node_status import GpuRow, NodeStatus, SessionRow, holder_row, queue_row

    nobody = pwd.getpwnam("nobody")
    session = SessionRow(id="s1", pid=1, uid=nobody.pw_uid, user="nobody", role="kernel", name="k", gpu=0)
    table = NodeStatus(gpus=[GpuRow(index=0, sessions=[session])])
    rows = quota_use(table, Quotas(max_hold=20.0, queued_per_user=3))
    assert rows[0].limits == QuotaLimits(sessions_per_user=128, queued_per_user=3, max_hold=20.0)
    html = (
        Loader(str(TEMPLATES))
        .load("admin.html")
        .generate(
            user={"name": "admin"},
            table=NodeStatus(),
            regions=[],
            history_source="",
            usage=None,
            quotas=rows,
            charts={"utilisation": "", "gantt": ""},
            error="",
            message="",
            base="/services/krex-admin/",
            esc=str,
            holder_row=holder_row,
            queue_row=queue_row,
            _tt_modules=types.SimpleNamespace(xsrf_form_html=lambda: ""),
        )
        .decode()
    )
    assert "max_hold=20 s" in html and "queued_per_user=3" in html and "sessions_per_user=128" in html, html
