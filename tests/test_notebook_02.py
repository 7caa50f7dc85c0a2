"""notebooks/02_optimize_a_kernel.ipynb runs top to bottom with nbclient on the ``krex`` kernel: fake
backend arbiter, numba's CUDA simulator (the same notebook runs on a GPU in benchmarks/device_run.sh)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT

from . import test_kernels
from .test_notebooks import outputs_text

krex_spec = test_kernels.krex_spec  # fixture

pytestmark = pytest.mark.timeout(180)


def test_optimize_a_kernel(
    arbiter: ArbiterProc, krex_spec: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    nb = nbformat.read(ROOT / "notebooks" / "02_optimize_a_kernel.ipynb", as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "krex"
    NotebookClient(nb, timeout=120, kernel_name="krex", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "numba CUDA simulator" in outputs_text(code[0])
    passed = next(c for c in code if c.source.startswith("check_size"))
    assert "check passed: 2 trial(s)" in outputs_text(passed)
    bug = next(c for c in code if c.source.startswith("def forgets_to_zero"))
    assert "check FAILED" in outputs_text(bug) and "got nan" in outputs_text(bug), outputs_text(bug)
    timed = next(c for c in code if c.source.startswith("inputs, outputs"))
    assert "median" in outputs_text(timed) and "SIMULATED" in outputs_text(timed)
    region = next(c for c in code if c.source.startswith("%%krex_exclusive"))
    text = outputs_text(region)
    assert "(nested: the enclosing region's)" in text and "KREX region" in text and "[simulated GPU]" in text, text
    table = next(c for c in code if "compare(" in c.source)
    assert "NumPy reference (CPU)" in outputs_text(table) and "GB/s" in outputs_text(table)
