"""A degraded region run from a shell says DEGRADED there, in plain words, not only in ``krex
history``: an arbiter whose isolation has no time at all (``isolate_deadline=0``) cannot move
another session's threads off the reserved cores, and ``krex exclusive`` must say so."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import ArbiterProc

from . import test_kernels

detached = test_kernels.detached  # fixtures

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def arbiter(tmp_path: Path) -> Iterator[ArbiterProc]:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, extra=("--Arbiter.isolate_deadline=0",)).start()
    try:
        yield arb
    finally:
        arb.stop()


def test_a_degraded_region_says_so_on_the_terminal(arbiter: ArbiterProc, detached: object) -> None:
    detached(1)  # another session: its threads are what isolation has no time to move
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--gpu", "0", "--", "true"],
        env=arbiter.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    reports = [line for line in out.stderr.splitlines() if line.startswith("KREX region")]
    assert reports and all("DEGRADED" in line for line in reports), out.stderr
    assert "isolation stopped at its deadline" not in out.stderr, out.stderr
    assert (
        "DEGRADED: not isolated in time: 1 other session process may still run on the reserved cores" in (reports[-1])
    ), out.stderr
