"""notebooks/04_agent_study.ipynb runs top to bottom with nbclient on the agent study's JSON files:
the newest one (what a clone shows) and an older one written before the steady-alone figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support import ROOT

from .test_notebooks import outputs_text

pytestmark = pytest.mark.timeout(180)
RESULTS = ROOT / "benchmarks" / "results"


def stamp(path: Path) -> str:
    found = re.search(r"\d{4}-\d{2}-\d{2}T\d{4}", path.name)
    assert found, path
    return found.group(0)


def run(monkeypatch: pytest.MonkeyPatch, study: Path | None) -> str:
    """Every code cell's printed output, the notebook run on ``study`` (None: its own choice)."""
    if study is None:
        monkeypatch.delenv("AGENT_STUDY_JSON", raising=False)
    else:
        monkeypatch.setenv("AGENT_STUDY_JSON", str(study))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(ROOT / "notebooks" / "04_agent_study.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return "".join(outputs_text(c) for c in nb.cells if c.cell_type == "code")


def check_points(text: str, study: Path) -> None:
    data = json.loads(study.read_text())
    assert study.name in text
    for p in data["points"]:
        assert f"{p['evals_per_min']:10.1f} {p['timed_per_min']:10.1f}" in text, p["mode"]
    assert "region / command:" in text and "not steady alone:" in text


def test_the_newest_study_by_its_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    newest = max(RESULTS.glob("agent_study-*.json"), key=stamp)
    text = run(monkeypatch, None)
    check_points(text, newest)
    unsteady = sorted({c for p in json.loads(newest.read_text())["points"] for c in p.get("unsteady_alone", [])})
    assert f"not steady alone: {unsteady or 'none'}" in text


def test_a_study_written_before_the_steady_alone_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    older = RESULTS / "agent_study-fake-2026-12-01T0652.json"
    assert "error_abs_pct_steady" not in older.read_text()
    text = run(monkeypatch, older)
    check_points(text, older)
    assert "not steady alone: none" in text
