"""Debian's chromium driven by Playwright, for the browser tests (never a browser of Playwright's own)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: what works here as root, in a container, with no network
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def find_chromium() -> str | None:
    for candidate in (
        os.environ.get("KREX_CHROMIUM"),
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture
def chromium() -> str:
    """Debian's chromium, and Playwright to drive it; skips (saying why) before any server starts."""
    path = find_chromium()
    if path is None:
        pytest.skip(
            "no Chromium found (/usr/bin/chromium; `apt-get install chromium`, as .ci/run does, or set KREX_CHROMIUM)"
        )
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    return path


@contextlib.contextmanager
def chromium_page(chromium: str, viewport: dict[str, int], failure_shot: Path) -> Iterator[Any]:
    """A page of a headless chromium on a fresh profile; a screenshot at ``failure_shot`` if the
    block fails; the browser closed and its profile removed afterwards."""
    from playwright import sync_api

    profile = tempfile.mkdtemp(prefix="krex-chromium-")
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                profile, executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, viewport=viewport
            )
            page: Any = None
            try:
                page = browser.pages[0] if browser.pages else browser.new_page()
                page.set_default_timeout(30_000)
                yield page
            except BaseException:
                if page is not None:
                    with contextlib.suppress(Exception):
                        page.screenshot(path=str(failure_shot))
                raise
            finally:
                browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def pick_krex_kernel(page: Any) -> None:
    """Answer a "Select Kernel" dialog, should Lab show one, with the notebook's kernel."""
    dialog = page.locator(".jp-Dialog:has-text('Select Kernel')")
    if dialog.count():
        with contextlib.suppress(Exception):
            dialog.locator("select").select_option(label="Python 3 (KREX)", timeout=2000)
            dialog.get_by_role("button", name="Select", exact=True).click(timeout=2000)


def ms_left(deadline: float) -> float:
    """Milliseconds left until ``deadline`` (monotonic; Playwright's unit), at least one second."""
    return max(1000.0, (deadline - time.monotonic()) * 1000)
