"""KREX on a real JupyterHub, the way a person uses it: headless Chromium logs in as alice through
the hub's login page, the hub spawns her server (JupyterLab, the default URL ``krex hub-config``
sets), a notebook on the ``krex`` kernel ("Python 3 (KREX)") runs a ``%%krex_exclusive`` timing
loop, whose one-line region report must appear in the cell's output, and then
``krex_lab.dashboard()``, whose GPU panel must render (the node arbiter's simulated GPU, alice's
session, her region on the timeline). Screenshots go to ``jupyterhub-alice-*.png`` in ``tests.support.artifacts_dir()``.

The hub is the one :mod:`tests.test_jupyterhub` runs (its helpers, :mod:`tests.hubsupport`): the
venv's root ``jupyterhub`` started as the docs start it, on the config ``krex hub-config`` generates
(unmodified: PAM checks her password, the local process spawner, configurable-http-proxy, the node
arbiter as the hub's managed service, fake backend with one GPU), and ``useradd`` users. Chromium
is Debian's, driven by Playwright as in :mod:`tests.dashboard.test_dashboard_browser`; Playwright's own
browsers are never downloaded.

Skipped, saying why, unless root with useradd, configurable-http-proxy, jupyterhub, a venv the
user can run, Chromium and Playwright. Everything (browser, server, hub, arbiter, user) is torn
down at the end, and no process of alice may survive her server's shutdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab.pytest_plugin import wait_for
from tests.hubsupport.hub import Hub, NodeArbiter, start_documented_hub
from tests.hubsupport.users import HubUser, describe, kernel_process, make_users, processes_of
from tests.support import artifacts_dir
from tests.support.browser import chromium_page
from tests.support.browser import ms_left as _left
from tests.support.browser import pick_krex_kernel as _pick_krex_kernel
from tests.test_jupyterhub import _as_user, _skip_unless_possible

pytestmark = pytest.mark.timeout(240)

ARTIFACTS = artifacts_dir()
SHOT_REGION = ARTIFACTS / "jupyterhub-alice-region.png"
SHOT_DASHBOARD = ARTIFACTS / "jupyterhub-alice-dashboard.png"
SHOT_HELD = ARTIFACTS / "jupyterhub-alice-dashboard-held.png"
SHOT_FAILURE = ARTIFACTS / "jupyterhub-alice-failure.png"
#: from the login page to the rendered dashboard
BUDGET_S = 120.0
NOTEBOOK = "krex-region.ipynb"

REGION_CELL = """%%krex_exclusive --max-hold 20
import time
t0 = time.perf_counter()
total = 0
for i in range(200_000):
    total += i * i
print(f"timing loop: {(time.perf_counter() - t0) * 1e3:.1f} ms")"""

DASHBOARD_CELL = """import krex_lab
dash = krex_lab.dashboard()
dash"""

#: what the browser test saw that the later tests of this module judge (they run in order)
SEEN: dict[str, Any] = {}

#: "KREX region r… on GPU 0 [simulated GPU]: waited …" (krex_lab.client.RegionReport.summary)
REPORT_RE = re.compile(r"KREX region (\S+) on GPU 0 \[simulated GPU\]:.*")


@dataclass
class AliceHub:
    hub: Hub
    arbiter: NodeArbiter
    alice: HubUser
    password: str
    #: where the test drops the files alice's cells wait for (root's, 0755: she can see them)
    flags: Path


#: waits (outside any region) until the test has looked at the idle dashboard
WAIT_CELL = """import os, time
t = time.monotonic()
while not os.path.exists({go!r}) and time.monotonic() - t < 60:
    time.sleep(0.1)"""

#: a region held until the test has seen it on the dashboard (at most 15 s)
HOLD_CELL = """%%krex_exclusive --max-hold 20
t = time.monotonic()
while not os.path.exists({done!r}) and time.monotonic() - t < 15:
    time.sleep(0.1)
print("held region ends")"""


def _notebook(flags: Path) -> dict[str, Any]:
    def cell(source: str) -> dict[str, Any]:
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}

    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "krex", "display_name": "Python 3 (KREX)", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [
            cell(REGION_CELL),
            cell(DASHBOARD_CELL),
            cell(WAIT_CELL.format(go=str(flags / "go"))),
            cell(HOLD_CELL.format(done=str(flags / "done"))),
        ],
    }


@contextlib.contextmanager
def alice_hub() -> Iterator[AliceHub]:
    """The hub of :mod:`tests.test_jupyterhub` (the generated config as generated, started as the
    docs start it), allowing one student by name (``--allow-user``): alice, who has a password and
    no server yet (her browser's login spawns it). Undone in reverse at exit: her server (through
    the API), the hub with its arbiter, the users and every process of hers."""
    venv = _skip_unless_possible()
    with contextlib.ExitStack() as stack:
        base = Path(tempfile.mkdtemp(prefix="krex-hubb-"))
        os.chmod(base, 0o755)
        stack.callback(shutil.rmtree, base, True)
        for sub, mode in (("home", 0o755), ("flags", 0o755)):
            (base / sub).mkdir(mode=mode)
        alice, admin = stack.enter_context(make_users(base / "home", "kbalice", "kbadmin"))
        r = _as_user(alice, str(venv / "bin" / "python"), "-c", "import krex_lab.serverext, jupyterhub, ipykernel")
        if r.returncode != 0:
            pytest.skip(f"the test user cannot run the venv {venv}: {r.stderr[-800:]}")
        hub, arbiter = start_documented_hub(stack, base, venv, admin.name, admin.password, "--allow-user", alice.name)
        stack.callback(_stop_server, hub, alice.name)
        yield AliceHub(hub, arbiter, alice, alice.password, base / "flags")


def _stop_server(hub: Hub, user: str) -> None:
    with contextlib.suppress(Exception):
        hub.stop_server(user)


def test_alice_logs_in_runs_a_region_and_sees_the_dashboard(chromium: str) -> None:
    for shot in (SHOT_REGION, SHOT_DASHBOARD, SHOT_HELD, SHOT_FAILURE):
        shot.unlink(missing_ok=True)
    with alice_hub() as node:
        hub, alice = node.hub, node.alice
        t0 = time.monotonic()
        deadline = t0 + BUDGET_S
        try:
            with chromium_page(chromium, {"width": 1400, "height": 1000}, SHOT_FAILURE) as page:
                state = _run_in_browser(page, node, deadline)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n(screenshot: {SHOT_FAILURE})\n--- hub log ---\n{hub.log_tail()}") from None
        elapsed = time.monotonic() - t0
        # Her server, stopped through the API, leaves no process of hers behind.
        hub.stop_server(alice.name)
        left: list[psutil.Process] = []

        def gone() -> bool:
            left[:] = processes_of({alice.uid})
            return not left

        with contextlib.suppress(AssertionError):
            wait_for(gone, 20, 0.2)
        assert not left, f"processes of alice that survived her server's shutdown:\n{describe(left)}"
    assert elapsed < BUDGET_S + 5, f"{elapsed:.0f} s from the login page to the dashboard"
    SEEN["done"] = True
    assert state["report"] and state["panels"] >= 1


def _run_in_browser(page: Any, node: AliceHub, deadline: float) -> dict[str, Any]:
    hub, alice = node.hub, node.alice
    # -- the hub's login page: a wrong password is refused, hers lets her in -------------------
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", alice.name)
    page.fill("#password_input", "not-" + node.password)
    page.click("#login_submit")
    page.wait_for_selector(".login_error", timeout=_left(deadline))
    assert "/hub/login" in page.url, f"a wrong password got past the login page: {page.url}"
    page.fill("#username_input", alice.name)
    page.fill("#password_input", node.password)
    page.click("#login_submit")
    # The hub spawns her server (spawn-pending page) and sends her to it: /user/<alice>/lab.
    page.wait_for_url(re.compile(rf"/user/{re.escape(alice.name)}/lab"), timeout=_left(deadline))
    page.wait_for_selector(".jp-LabShell", timeout=_left(deadline))
    server = hub.api("GET", f"/users/{alice.name}")["servers"].get("")
    assert server and server.get("ready"), f"the hub does not list her server as ready: {server}"
    # -- a notebook on the krex kernel, saved through her server's contents API ----------------
    token = hub.user_token(alice.name)
    hub.user_api(
        alice.name, token, "PUT", f"/contents/{NOTEBOOK}", {"type": "notebook", "content": _notebook(node.flags)}
    )
    page.goto(f"{hub.url}/user/{alice.name}/lab/tree/{NOTEBOOK}")
    page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=_left(deadline))
    while not _kernel_idle(hub, alice.name, token):
        assert time.monotonic() < deadline, "the notebook's krex kernel did not start"
        _pick_krex_kernel(page)
        time.sleep(0.3)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=_left(deadline))
    _dismiss_news(page)
    page.click(".lm-MenuBar-item:has-text('Run')")
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    _pick_krex_kernel(page)
    # -- the region's report line -----------------------------------------------------------
    state = _wait(page, deadline, lambda s: bool(s["region_out"]) and "KREX region" in s["region_out"])
    match = REPORT_RE.search(state["region_out"])
    page.locator(".jp-CodeCell").first.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOT_REGION))
    out = f"(screenshot: {SHOT_REGION}):\n{state['region_out']}"
    assert match, f"no 'KREX region … on GPU 0 [simulated GPU]' line in the cell's output {out}"
    assert "timing loop:" in state["region_out"], f"the timed loop did not print {out}"
    assert "Error" not in state["region_out"], f"the region cell failed {out}"
    region = match.group(1)
    # -- the dashboard: the GPU panel with her session and her region -----------------------
    state = _wait(page, deadline, lambda s: s["panels"] >= 1 and "GPU 0" in s["text"] and region in s["regions"])
    # her own kernel's row in the sessions table (see test_her_dashboard_shows_her_own_kernel)
    state = _wait(page, min(deadline, time.monotonic() + 5), lambda s: alice.name in s["table"], soft=True)
    SEEN["table"] = state["table"]
    SEEN["kernel_pid"] = _kernel_pid(hub, alice, token)
    _dismiss_news(page)
    dash = page.locator(".krex-dash").first
    with contextlib.suppress(Exception):
        dash.scroll_into_view_if_needed(timeout=2000)
    page.screenshot(path=str(SHOT_DASHBOARD))
    where = f"(screenshot: {SHOT_DASHBOARD}); it shows:\n{state['header']}\n{state['text']}"
    assert state["panels"] >= 1, f"the dashboard rendered no GPU panel {where}"
    assert "live" in state["header"] and "SIMULATED" in state["text"], f"not the live simulated GPU {where}"
    assert region in state["regions"], f"her region {region} is not on the timeline {state['regions']} {where}"
    assert "held by" not in state["text"], f"the region is still shown held after its cell ended {where}"
    # -- a region held while she watches: the panel says who holds it ----------------------------
    (node.flags / "go").touch()
    held = _wait(page, min(deadline, time.monotonic() + 12), lambda s: "held by" in s["text"], soft=True)
    page.screenshot(path=str(SHOT_HELD))
    (node.flags / "done").touch()
    where = f"(screenshot: {SHOT_HELD}); it shows:\n{held['text']}"
    assert f"held by {alice.name}" in held["text"], f"the dashboard did not show her held region {where}"
    SEEN["held"] = next(line for line in held["text"].splitlines() if "held by" in line)
    # ... and, once its cell ends, that it is over: on the timeline, no longer held
    _wait(page, deadline, lambda s: "held region ends" in s["last_out"] and len(s["regions"]) >= 2)
    _wait(page, min(deadline, time.monotonic() + 5), lambda s: "held by" not in s["text"])
    state["report"] = match.group(0)
    return state


STATE_JS = """() => {
  const cells = [...document.querySelectorAll('.jp-CodeCell')];
  const region = cells.find(c => c.innerText.includes('krex_exclusive'));
  const out = region ? region.querySelector('.jp-OutputArea') : null;
  const panels = [...document.querySelectorAll('.krex-gpu')];
  return {
    region_out: out ? out.innerText : '',
    panels: panels.length,
    text: panels.map(p => p.innerText).join('\\n'),
    table: [...document.querySelectorAll('.krex-gpu tr.krex-session')].map(r => r.innerText).join('\\n'),
    last_out: cells.length ? (cells[cells.length - 1].querySelector('.jp-OutputArea') || {innerText: ''}).innerText
                           : '',
    regions: [...document.querySelectorAll('.krex-gpu g.krex-region')].map(g => g.getAttribute('data-region')),
    header: (document.querySelector('.krex-dash') || {innerText: ''}).innerText,
  };
}"""


def _wait(page: Any, deadline: float, done: Any, soft: bool = False) -> dict[str, Any]:
    while True:
        state: dict[str, Any] = page.evaluate(STATE_JS)
        if done(state) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if done(state):
        return state
    if soft:
        return state
    raise AssertionError(f"the notebook did not show it in time; it shows:\n{json.dumps(state, indent=1)}")


def _kernel_pid(hub: Hub, user: HubUser, token: str) -> int | None:
    """The pid of the notebook's kernel (an ipykernel process of hers)."""
    for s in hub.user_api(user.name, token, "GET", "/sessions"):
        if s.get("path", "").endswith(NOTEBOOK):
            p = kernel_process(user.uid, s["kernel"]["id"])
            return None if p is None else p.pid
    return None


def _kernel_idle(hub: Hub, user: str, token: str) -> bool:
    """The notebook's session has a ``krex`` kernel that is up and idle (her server's view)."""
    try:
        sessions = hub.user_api(user, token, "GET", "/sessions")
    except AssertionError:
        return False
    return any(
        s.get("path", "").endswith(NOTEBOOK)
        and s["kernel"]["name"] == "krex"
        and s["kernel"].get("execution_state") == "idle"
        for s in sessions
    )


def _dismiss_news(page: Any) -> None:
    """The "official Jupyter news?" toast, when it shows."""
    with contextlib.suppress(Exception):
        page.get_by_role("button", name="No", exact=True).click(timeout=500)


def test_her_dashboard_shows_her_own_kernel(chromium: str) -> None:
    """What a user may see of her own work on the node arbiter (krex_lab.arbiter.privacy keeps it in
    full): her kernel's row in the sessions table, and her held region with her kernel's pid."""
    if not SEEN.get("done"):
        pytest.skip("the browser test did not get as far as the dashboard")
    pid = SEEN["kernel_pid"]
    assert pid is not None, "her notebook's kernel process was not found"
    where = f"(screenshots: {SHOT_DASHBOARD}, {SHOT_HELD})"
    assert str(pid) in SEEN["table"], f"her kernel (pid {pid}) is not in the table: {SEEN['table']!r} {where}"
