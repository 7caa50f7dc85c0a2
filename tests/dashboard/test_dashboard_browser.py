"""A real browser: ``krex lab`` (fake backend) opened in headless Chromium runs
``notebooks/03_dashboard.ipynb``; the rendered panels must show the sessions and a region, and
keep changing while a later cell keeps the kernel busy. Screenshots go to ``tests.support.artifacts_dir()``.

Uses Debian's ``chromium`` (``.ci/run`` installs it) driven by Playwright with ``executable_path``;
Playwright's own browsers are never downloaded. Skipped, saying why, without Chromium or Playwright.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import ROOT, artifacts_dir
from tests.support.browser import chromium_page
from tests.support.browser import ms_left as _left
from tests.support.browser import pick_krex_kernel as _pick_krex_kernel

pytestmark = pytest.mark.timeout(150)

ARTIFACTS = artifacts_dir()
NOTEBOOK = ROOT / "notebooks" / "03_dashboard.ipynb"
#: the whole test (server, browser, notebook) stays within this
BUDGET_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Lab:
    """``krex lab`` as ``make lab`` starts it (``python -m krex_lab.cli lab``: the source tree's kernelspec and
    server extension, an embedded arbiter), on a free port with a token, in a scratch directory."""

    def __init__(self, tmp: Path, root: Path | None = None) -> None:
        self.root = root or tmp / "notebooks"
        if root is None:
            self.root.mkdir()
            shutil.copy(NOTEBOOK, self.root)  # the lab saves outputs into its copy, never into the repo's
        self.runtime = tempfile.mkdtemp(prefix="krex-b-")  # short: ipc socket paths are limited
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "lab.log"
        env = {
            **os.environ,
            "KREX_RUNTIME_DIR": self.runtime,
            "JUPYTER_CONFIG_DIR": str(tmp / "cfg"),
            "JUPYTER_RUNTIME_DIR": str(tmp / "jrt"),
            "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        for var in ("KREX_ENDPOINT", "KREX_POOL_ENDPOINT", "KREX_GPU", "JUPYTER_PATH"):
            env.pop(var, None)
        cmd = [
            sys.executable,
            "-m",
            "krex_lab.cli",
            "lab",
            "--backend=fake",
            "--fake-gpus=2",
            "--no-pool",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=self.root, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def get(self, path: str) -> int:
        return self.get_json(path)[0]

    def get_json(self, path: str) -> tuple[int, Any]:
        req = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                return r.status, json.loads(r.read() or b"null")
        except Exception:
            return 0, None

    def kernel_idle(self, notebook: str) -> bool:
        """The notebook's session has a ``krex`` kernel that is up and idle (the server's view)."""
        code, sessions = self.get_json("/api/sessions")
        return code == 200 and any(
            s.get("path", "").endswith(notebook)
            and s["kernel"]["name"] == "krex"
            and s["kernel"].get("execution_state") == "idle"
            for s in sessions
        )

    def wait_ready(self, deadline: float) -> None:
        while self.get("/krex/api/status") != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"krex lab did not come up:\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])

    def stop(self) -> None:
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # The kernel (its own session) and the notebook's loops end with the server; make sure of it.
        psutil.wait_procs(family, timeout=5)
        for p in family:
            with contextlib.suppress(psutil.Error):
                for q in [*p.children(recursive=True), p]:
                    q.send_signal(signal.SIGCONT)
                    q.kill()
        self._log.close()
        shutil.rmtree(self.runtime, ignore_errors=True)


@pytest.fixture
def lab(chromium: str, tmp_path: Path) -> Iterator[Lab]:
    server = Lab(tmp_path)
    try:
        yield server
    finally:
        server.stop()


PANELS_JS = """() => {
  const panels = [...document.querySelectorAll('.krex-gpu')];
  const text = panels.map(p => p.innerText).join('\\n');
  const cell = [...document.querySelectorAll('.jp-CodeCell')].find(c => c.innerText.includes('time.sleep(15)'));
  const prompt = cell ? cell.querySelector('.jp-InputPrompt').innerText.trim() : '';
  return {panels: panels.length, text: text, regions: document.querySelectorAll('.krex-gpu g.krex-region').length,
          busy: prompt.includes('*'), header: (document.querySelector('.krex-dash') || {innerText: ''}).innerText};
}"""


def test_dashboard_notebook_in_chromium(chromium: str, lab: Lab) -> None:
    t0 = time.monotonic()
    deadline = t0 + BUDGET_S
    (ARTIFACTS / "dashboard-failure.png").unlink(missing_ok=True)
    lab.wait_ready(min(deadline, t0 + 45))
    try:
        with chromium_page(chromium, {"width": 1500, "height": 1100}, ARTIFACTS / "dashboard-failure.png") as page:
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?token={lab.token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=_left(deadline))
            # The notebook's own kernel (krex) must be up before Run All, or Lab asks which kernel to start.
            while not lab.kernel_idle(NOTEBOOK.name):
                assert time.monotonic() < deadline, "the notebook's krex kernel did not start"
                _pick_krex_kernel(page)
                time.sleep(0.2)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=_left(deadline))
            with contextlib.suppress(Exception):  # the "official Jupyter news?" toast, when it shows
                page.get_by_role("button", name="No", exact=True).click(timeout=1000)
            page.click(".lm-MenuBar-item:has-text('Run')")
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            _pick_krex_kernel(page)
            # The panels show the sessions, a held region, and finished regions on the timeline.
            names = ["region-loop-a", "region-loop-b", "idle-neighbour"]
            state = _wait(
                page,
                deadline,
                lambda s: (
                    s["panels"] >= 2
                    and all(n in s["text"] for n in names)
                    and "held by" in s["text"]
                    and s["regions"] >= 1
                ),
            )
            assert "SIMULATED (fake backend)" in state["text"] and "live" in state["header"], state["header"]
            # ... and keep changing while a later cell keeps the kernel busy.
            first = state["regions"]
            state = _wait(page, deadline, lambda s: s["regions"] > first or not s["busy"])
            assert state["busy"] and state["regions"] > first, (
                f"the dashboard stood still while a cell ran ({first} -> {state['regions']} regions)"
            )
            # The picture: a held region with a waiter, when the loops line up like that (else a held one).
            _wait(
                page,
                min(deadline, time.monotonic() + 10),
                soft=True,
                done=lambda s: "held by" in s["text"] and "waiting (1)" in s["text"],
            )
            with contextlib.suppress(Exception):
                page.get_by_role("button", name="No", exact=True).click(timeout=500)
            dash = page.locator(".krex-dash").first
            dash.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"))
            dash.screenshot(path=str(ARTIFACTS / "dashboard-panels.png"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- krex lab log ---\n{lab.log()}") from None
    assert time.monotonic() - t0 < BUDGET_S + 5


def _wait(page: Any, deadline: float, done: Any, soft: bool = False) -> dict[str, Any]:
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = page.evaluate(PANELS_JS)
        if done(state):
            return state
        time.sleep(0.2)
    if soft:
        return state
    raise AssertionError(
        f"the dashboard did not show it in time; it shows:\n{state.get('header')}\n{state.get('text')}"
    )
