"""The notebooks run top to bottom with nbclient on the ``krex`` kernel (fake backend, real pool)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT

from . import test_kernels

krex_spec = test_kernels.krex_spec  # fixtures
pool = test_kernels.pool

pytestmark = pytest.mark.timeout(180)


def outputs_text(cell: Any) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            parts.append(o["text"])
        elif o["output_type"] == "execute_result":
            parts.append(o["data"].get("text/plain", ""))
    return "".join(parts)


def test_quickstart(arbiter: ArbiterProc, pool: str, krex_spec: None, tmp_path: Path) -> None:
    nb = nbformat.read(ROOT / "notebooks" / "01_quickstart.ipynb", as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "krex"
    NotebookClient(nb, timeout=90, kernel_name="krex", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    by_source = {c.source.splitlines()[0]: c for c in code}
    assert "SIMULATED GPUs" in outputs_text(code[0]), "the fake backend is announced"
    region = next(c for c in code if c.source.startswith("%%krex_exclusive"))
    summary = outputs_text(region)
    frozen = int(re.search(r"frozen (\d+)", summary).group(1))  # type: ignore[union-attr]
    assert frozen >= 1 and "[simulated GPU]" in summary, summary  # the neighbour (and the pool's workers)
    after = outputs_text(code[code.index(region) + 1])
    assert "state 'T'" in after and "longest pause" in after, after
    worker = next(c for c in code if c.source.startswith("%%krex\nimport os, time"))
    assert outputs_text(worker).count(": step ") == 3
    assert "answer is still 42" in outputs_text(code[code.index(worker) + 1])
    assert "KREX region" in outputs_text(by_source["%%krex --exclusive"])


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_the_notebooks_are_kept_without_outputs() -> None:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        stripped = subprocess.run(
            [sys.executable, str(ROOT / "notebooks" / "strip_outputs.py")],
            input=path.read_text(),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert stripped == path.read_text(), f"{path.name} keeps outputs: run it on a copy"


def test_a_commit_never_takes_a_notebook_run_outputs(tmp_path: Path) -> None:
    """A shipped notebook run and saved, outputs and all, by another editor or by JupyterLab (which
    appends an empty code cell when the last cell is run with Shift+Enter and writes the installed
    kernelspec's display name): git's clean filter (set up by ``make``) shows no change, and a commit
    takes none; an edit of the notebook itself still shows."""
    from jupyter_client.kernelspec import KernelSpecManager

    repo = tmp_path / "clone"
    repo.mkdir()
    for name in ("Makefile", "pyproject.toml", ".gitattributes", ".gitignore", "notebooks", "krex_lab"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, repo / name)
    who = ("-c", "user.name=t", "-c", "user.email=t@t")
    _git(repo, "init", "-q")
    _git(repo, *who, "add", "-A")
    _git(repo, *who, "commit", "-qm", "shipped")
    subprocess.run(["make", "-s", "notebook-filter"], cwd=repo, capture_output=True, timeout=60, check=True)
    specs = KernelSpecManager()
    paths = sorted((repo / "notebooks").glob("*.ipynb"))
    assert len(paths) >= 4
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):  # as a run and a save leave it
            cell.execution_count = n + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"ran {n}\n")]
            cell.metadata["execution"] = {"iopub.status.idle": "2026-12-03T08:00:00Z"}
        nb.cells += [nbformat.v4.new_code_cell(""), nbformat.v4.new_code_cell("\n")]  # Shift+Enter on the last
        spec = nb.metadata["kernelspec"]
        spec["display_name"] = specs.get_kernel_spec(spec["name"]).display_name  # what Jupyter writes
        nb.metadata["language_info"] = {"name": "python", "version": "3.99.0", "file_extension": ".py"}
        nbformat.write(nb, path)
        assert _git(repo, "diff") == "", path.name
    _git(repo, *who, "add", "-A")
    assert _git(repo, "status", "--porcelain") == "" and _git(repo, "diff", "--cached") == ""
    path = repo / "notebooks" / "01_quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source += "\n"  # an edit of the notebook itself still shows
    nbformat.write(nb, path)
    assert _git(repo, "status", "--porcelain").split() == ["M", "notebooks/01_quickstart.ipynb"]
    nb.cells.append(nbformat.v4.new_code_cell("print('mine')"))  # so does a cell of one's own at the end
    nbformat.write(nb, path)
    assert "print('mine')" in _git(repo, "diff")
