"""The checkout as the README promises it: ``make lab ARGS=...`` passes its options on to
``krex lab`` (a dry run: nothing is installed or started), and a user's own notebooks in the lab's
folder stay out of ``git status``."""

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


def test_a_users_notebooks_stay_out_of_git_status() -> None:
    """A notebook the user makes in the lab (Untitled.ipynb in the repository's root, which ``make
    lab`` serves, or in ``notebooks/``; a copy saved with its outputs under a name like a shipped
    one's) is ignored; the shipped ones are not."""

    def ignored(path: str) -> bool:  # by the rules alone (a tracked file is never ignored)
        out = subprocess.run(
            ["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True, timeout=30
        )
        return out.returncode == 0

    listed = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    shipped = listed.stdout.split()
    assert shipped and not any(ignored(n) for n in shipped), shipped
    assert ignored("notebooks/Untitled.ipynb") and ignored("notebooks/Untitled1.ipynb")
    assert ignored("notebooks/quickstart with outputs.ipynb")
    assert ignored("Untitled.ipynb") and ignored("docs/Untitled2.ipynb")
    assert ignored("notebooks/01_quickstart_mine.ipynb") and ignored("notebooks/01_quickstart-Copy1.ipynb")
