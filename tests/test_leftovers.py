"""What the suite leaves: nothing in the checkout, no process, nothing of its own in /tmp (pytest's
rotated root holds its caches). The checks themselves run at every run's end (tests/support/leftovers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
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
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent  # a worker's root is a folder of the run's, which set these (make test: two workers)
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


def _inner_run(repo: Path, test: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A pytest run with the suite's leftovers plugin, of one test file, in a git checkout of its own."""
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "test_inner.py").write_text(test)
    subprocess.run(["git", "-C", str(repo), "add", "test_inner.py"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"], check=True
    )
    base = {
        k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "RAY_TMPDIR")
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.leftovers",
            f"--basetemp={repo.parent / 'inner-temp'}",
            "test_inner.py",
        ],
        cwd=repo,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_file_left_in_the_checkout_fails_the_run(tmp_path: Path) -> None:
    r = _inner_run(tmp_path / "repo", "def test_writes():\n    open('stray.json', 'w').write('[]')\n")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout and "the run changed the checkout" in r.stdout and "?? stray.json" in r.stdout


def test_a_clean_run_passes(tmp_path: Path) -> None:
    r = _inner_run(tmp_path / "repo", "def test_nothing():\n    pass\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "left behind" not in r.stdout


def test_a_process_that_outlives_the_run_fails_it_and_is_killed(tmp_path: Path) -> None:
    # a shell that starts a sleep and ends: the sleep is nobody's child any more
    test = "import subprocess\ndef test_orphan():\n    subprocess.run(['sh', '-c', 'sleep 61.5 &'], check=True)\n"
    r = _inner_run(tmp_path / "repo", test)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "outlive it" in r.stdout and "sleep 61.5" in r.stdout, r.stdout
    alive = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "61.5"]]
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive


def test_torch_and_ray_write_under_the_runs_temp(tmp_path: Path) -> None:
    """torch's inductor cache defaults to /tmp/torchinductor_USER, Ray's sessions to /tmp/ray."""
    test = (
        "import os\n"
        "def test_env():\n"
        "    for v in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR', 'RAY_TMPDIR'):\n"
        "        assert os.environ[v].startswith(os.environ['INNER_BASE'] + '/'), v\n"
    )
    r = _inner_run(tmp_path / "repo", test, env={"INNER_BASE": str(tmp_path / "inner-temp")})
    assert r.returncode == 0, r.stdout + r.stderr
