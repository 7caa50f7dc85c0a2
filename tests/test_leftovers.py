"""What the suite writes outside its tests' own temporary directories: nothing in the checkout,
nothing of its own in /tmp (pytest's rotated root holds it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, artifacts_dir


def test_screenshots_go_outside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KREX_TEST_ARTIFACTS", raising=False)
    assert ROOT not in artifacts_dir().parents
    monkeypatch.setenv("KREX_TEST_ARTIFACTS", str(tmp_path / "shots"))
    assert artifacts_dir() == tmp_path / "shots" and (tmp_path / "shots").is_dir()


def test_the_browser_tests_name_no_folder_in_the_checkout() -> None:
    needle = '"test-' + 'artifacts"'  # not written whole: this file would match itself
    for path in (ROOT / "tests").rglob("*.py"):
        assert needle not in path.read_text(errors="replace"), path


def test_torchs_caches_go_to_the_tests_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp()
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert base in Path(os.environ[var]).parents, var
    # and a worker started from here inherits them (pools are started by the tests' fixtures)
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert base in Path(out.stdout.strip()).parents
