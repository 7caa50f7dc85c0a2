"""The Makefile's entry points as the README gives them: ``make lab ARGS=...`` passes its options
on to ``krex lab`` (a dry run: nothing is installed or started)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_lab_passes_its_args_to_krex_lab() -> None:
    def dry(*args: str) -> list[str]:
        out = subprocess.run(["make", "-n", "lab", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines() if line.split()[:1] and line.split()[0].endswith("/krex")]

    assert [line.split()[1:] for line in dry()] == [["lab"]]
    (line,) = dry("ARGS=--port 9999 --no-browser --fake-gpus 3")
    assert line.split()[1:] == ["lab", "--port", "9999", "--no-browser", "--fake-gpus", "3"], line
