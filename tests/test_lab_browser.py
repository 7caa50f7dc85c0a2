"""What a new user does first in ``krex lab``, in a real browser: File > New > Notebook starts the
KREX kernel (the lab's default) without asking, and a shipped notebook is not marked modified by
opening it and starting its kernel."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.test_dashboard_browser import Lab
from tests.support import ROOT, artifacts_dir
from tests.support.browser import chromium_page, ms_left

pytestmark = pytest.mark.timeout(150)

ARTIFACTS = artifacts_dir()
BUDGET_S = 90.0


@pytest.fixture
def lab(chromium: str, tmp_path: Path) -> Iterator[Lab]:
    server = Lab(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def checkout_lab(chromium: str, tmp_path: Path) -> Iterator[Lab]:
    """The lab in the checkout's ``notebooks/``, as ``make lab`` serves it; nothing is saved there,
    and the test checks that git finds the folder as it was."""
    before = _git_status()
    checkpoints = ROOT / "notebooks" / ".ipynb_checkpoints"
    had_checkpoints = checkpoints.exists()
    server = Lab(tmp_path, root=ROOT / "notebooks")
    try:
        yield server
    finally:
        server.stop()
        if not had_checkpoints:
            shutil.rmtree(checkpoints, ignore_errors=True)
    assert _git_status() == before


def _git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--", "notebooks"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def _sessions(lab: Lab) -> list[dict[str, Any]]:
    code, sessions = lab.get_json("/api/sessions")
    return list(sessions) if code == 200 else []


def _dismiss_news(page: Any) -> None:
    for name in ("No", "Dismiss"):
        loc = page.get_by_role("button", name=name, exact=True)
        if loc.count():
            loc.first.click(timeout=1000)


def test_file_new_notebook_starts_the_krex_kernel(chromium: str, lab: Lab) -> None:
    deadline = time.monotonic() + BUDGET_S
    lab.wait_ready(deadline)
    with chromium_page(chromium, {"width": 1400, "height": 900}, ARTIFACTS / "new-notebook-failure.png") as page:
        page.goto(f"{lab.url}/lab?token={lab.token}")
        page.wait_for_selector(".lm-MenuBar-item:has-text('File')", timeout=ms_left(deadline))
        page.click(".lm-MenuBar-item:has-text('File')")
        page.locator(".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('New'))").first.click()
        page.locator(".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('Notebook'))").first.click()
        page.wait_for_selector(".jp-NotebookPanel", timeout=ms_left(deadline))
        asked = False
        while True:
            if page.locator(".jp-Dialog:has-text('Select Kernel')").count():
                asked = True
                break
            new = [s for s in _sessions(lab) if s.get("path", "").endswith("Untitled.ipynb")]
            if new and new[0]["kernel"]["name"]:
                break
            assert time.monotonic() < deadline, "no kernel started and no dialog shown"
            time.sleep(0.2)
        assert not asked, "File > New > Notebook asked which kernel to start"
        assert new[0]["kernel"]["name"] == "krex", new
        # The kernel's websocket is open: jupyter_server's ping settings raise no warning of tornado's
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=ms_left(deadline))
    assert "websocket_ping_timeout" not in lab.log_path.read_text(errors="replace"), lab.log()


def test_a_shipped_notebook_is_not_modified_by_opening_it(chromium: str, checkout_lab: Lab) -> None:
    lab = checkout_lab
    deadline = time.monotonic() + BUDGET_S
    lab.wait_ready(deadline)
    name = "01_quickstart.ipynb"
    with chromium_page(chromium, {"width": 1400, "height": 900}, ARTIFACTS / "shipped-dirty-failure.png") as page:
        page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=ms_left(deadline))
        while not lab.kernel_idle(name):
            assert time.monotonic() < deadline, "the notebook's krex kernel did not start"
            time.sleep(0.2)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=ms_left(deadline))
        _dismiss_news(page)
        time.sleep(2)  # what the kernel's info and the view change arrive by now
        tab = page.locator(f".lm-DockPanel-tabBar .lm-TabBar-tab:has-text('{name}')").first
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), "opened, not changed, yet marked modified"
