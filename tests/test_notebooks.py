"""The notebooks run top to bottom with nbclient on the ``krex`` kernel (fake backend, real pool)."""

from __future__ import annotations

import re
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
