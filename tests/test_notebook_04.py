"""notebooks/04_agent_study.ipynb runs top to bottom with nbclient on the agent study's JSON files:
the newest run on a GPU that compares region with command with think time and the freeze on (what
a clone shows, though a run of one mode, a run without the freeze or think time, or a fake-backend
run is newer) and an older
one written before the steady-alone figures."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support import ROOT

from .test_notebooks import outputs_text

sys.path.insert(0, str(ROOT / "benchmarks" / "agent"))
import agent_bounds

pytestmark = pytest.mark.timeout(180)
RESULTS = ROOT / "benchmarks" / "results"
STAMP = r"\d{4}-\d{2}-\d{2}T\d{4}"


def stamp(path: Path) -> str:
    found = re.search(STAMP, path.name)
    assert found, path
    return found.group(0)


def run(monkeypatch: pytest.MonkeyPatch, study: Path | None, root: Path = ROOT) -> str:
    """Every code cell's printed output, the notebook run in ``root`` on ``study`` (None: its own
    choice among ``root``'s benchmarks/results)."""
    if study is None:
        monkeypatch.delenv("AGENT_STUDY_JSON", raising=False)
    else:
        monkeypatch.setenv("AGENT_STUDY_JSON", str(study))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(ROOT / "notebooks" / "04_agent_study.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    return "".join(outputs_text(c) for c in nb.cells if c.cell_type == "code")


def check_points(text: str, study: Path) -> None:
    data = json.loads(study.read_text())
    assert study.name in text
    for p in data["points"]:  # what bounds each point, as benchmarks/agent/agent_bounds.py says it
        assert agent_bounds.bounds_line(agent_bounds.bounds(p)) in text, p["mode"]
    for p in data["points"]:
        freeze = "on" if p.get("freeze", True) else "off"
        assert f"{p['mode']:8} {freeze:>6} {p['agents']:6d}" in text, p["mode"]
        assert f"{p['evals_per_min']:10.1f} {p['timed_per_min']:10.1f}" in text, p["mode"]
        # the steady-alone and beyond-the-alone-runs p95, side by side (nan where a run has none)
        steady, beyond = ((p.get(k) or {}).get("p95") for k in ("error_abs_pct_steady", "error_abs_pct_beyond_alone"))
        nan = float("nan")
        assert f"{nan if steady is None else steady:12.2f} {nan if beyond is None else beyond:12.2f}" in text, p["mode"]
    for p in data["points"]:
        steps = (p["regions"] or {}).get("steps_ms_median")
        if steps:
            assert f"{p['mode']} {p['agents']} agents, region steps (median ms): drain {steps['drain']:.2f}" in text
    for r in data.get("ratios_region_over_command") or []:
        freeze = "on" if r.get("freeze", True) else "off"
        head = f"region / command, {r['launch']} {r['agents']} agents think {r['think_mean_s']} s "
        head += f"freeze {freeze}: {r['ratio']}x"
        assert head in text
        if "counts" in r:
            counts = f"{r['counts'][0]} vs {r['counts'][1]} evaluations"
            if r["interval_95"] is None:  # under 10 returns in a window
                assert f"{head} (no interval (under 10 returns" in text and counts in text
            else:
                lo, hi = r["interval_95"]
                assert f"{head} (95 % {lo:.2f}-{hi:.2f}; {counts})" in text
    assert "not steady alone:" in text


def test_the_newest_study_on_a_gpu_before_a_newer_fake_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A clone's results hold both; the notebook shows the GPU's figures, and the fake ones only
    where no GPU run exists."""
    runs = sorted(RESULTS.glob("agent_study-*.json"), key=stamp)
    on_gpu = [r for r in reversed(runs) if not r.name.startswith("agent_study-fake-")]
    ratios = {r: json.loads(r.read_text()).get("ratios_region_over_command") or [] for r in on_gpu}
    asked = [r for r in on_gpu if ratios[r] and all(x.get("freeze", True) and x["think_mean_s"] for x in ratios[r])]
    gpu = next(r for r in asked if any(x["launch"] == "warm" and x["agents"] >= 16 for x in ratios[r]))
    few = next(r for r in asked if all(x["agents"] < 16 for x in ratios[r]))
    no_freeze = next(r for r in on_gpu if ratios[r] and not any(x.get("freeze", True) for x in ratios[r]))
    no_think = next(r for r in on_gpu if ratios[r] and not any(x["think_mean_s"] for x in ratios[r]))
    one_mode = next(r for r in on_gpu if not ratios[r])
    fake = next(r for r in reversed(runs) if r.name.startswith("agent_study-fake-"))
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    # what the notebook imports (the agent study's family), and what that imports
    for shared in (ROOT / "benchmarks").glob("*.py"):
        (tmp_path / "benchmarks" / shared.name).symlink_to(shared)
    (tmp_path / "benchmarks" / "agent").symlink_to(ROOT / "benchmarks" / "agent")
    older, newer = (
        results / re.sub(STAMP, "2020-01-01T0000", gpu.name),
        results / re.sub(STAMP, "2030-01-01T0000", fake.name),
    )
    older.symlink_to(gpu)
    newer.symlink_to(fake)
    # newer GPU runs without the freeze (2026-12-02 T1838) or without think time (T1826) are not the
    # study's headline
    (results / re.sub(STAMP, "2021-01-01T0000", no_freeze.name)).symlink_to(no_freeze)
    (results / re.sub(STAMP, "2021-02-01T0000", no_think.name)).symlink_to(no_think)
    # ... nor is a newer one of 4 agents (warm against cold, 2026-12-02 T2111)
    (results / re.sub(STAMP, "2021-03-01T0000", few.name)).symlink_to(few)
    # a newer GPU run of one mode (the 32-agent region point, 2026-12-02 T1514) has no ratio to show
    (results / re.sub(STAMP, "2025-01-01T0000", one_mode.name)).symlink_to(one_mode)
    text = run(monkeypatch, None, tmp_path)
    check_points(text, older)
    assert "no GPU run at think 8 s since 2026-12-02T1100" in text  # the copies are stamped 2020-2030
    unsteady = sorted({c for p in json.loads(gpu.read_text())["points"] for c in p.get("unsteady_alone", [])})
    assert f"not steady alone: {unsteady or 'none'}" in text
    older.unlink()
    check_points(run(monkeypatch, None, tmp_path), results / re.sub(STAMP, "2021-03-01T0000", few.name))
    (results / re.sub(STAMP, "2021-03-01T0000", few.name)).unlink()
    check_points(run(monkeypatch, None, tmp_path), results / re.sub(STAMP, "2021-02-01T0000", no_think.name))
    (results / re.sub(STAMP, "2021-02-01T0000", no_think.name)).unlink()
    (results / re.sub(STAMP, "2021-01-01T0000", no_freeze.name)).unlink()
    check_points(run(monkeypatch, None, tmp_path), results / re.sub(STAMP, "2025-01-01T0000", one_mode.name))
    for r in results.glob("agent_study-nvidia-*"):
        r.unlink()
    check_points(run(monkeypatch, None, tmp_path), newer)


def test_a_study_written_before_the_steady_alone_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    older = RESULTS / "agent_study-fake-2026-12-01T0652.json"
    assert "error_abs_pct_steady" not in older.read_text()
    text = run(monkeypatch, older)
    check_points(text, older)
    assert "not steady alone: none" in text
    # the sweep below it lists every warm, freezing point and ratio at think 8 s of the GPU runs
    # since 2026-12-02 11:00, whichever run is shown above (read here from the files themselves)
    lines = text.splitlines()
    shown = set()
    for path in RESULTS.glob("agent_study-nvidia-*.json"):
        run_stamp = path.stem.removeprefix("agent_study-nvidia-")
        if run_stamp < "2026-12-02T1100":
            continue
        data = json.loads(path.read_text())
        for p in data["points"]:
            if p["launch"] == "warm" and p.get("freeze", True) and p["think_mean_s"] == 8.0:
                want = (f"{p['agents']:3d} agents  {p['mode']:15s} {p['evals_per_min']:.2f}/min", run_stamp)
                assert any(all(w in line for w in want) for line in lines), want
                shown.add(p["agents"])
        for r in data.get("ratios_region_over_command") or []:
            if r["launch"] == "warm" and r.get("freeze", True) and r["think_mean_s"] == 8.0:
                interval = "no interval" if r["interval_95"] is None else "{:.2f}-{:.2f}".format(*r["interval_95"])
                want = (f"{r['agents']:3d} agents  region/command  {r['ratio']:.2f}x", interval, run_stamp)
                assert any(all(w in line for w in want) for line in lines), want
    assert shown >= {1, 4, 8, 16, 32}


def test_it_reads_as_a_guide() -> None:
    """Not a figure dump: it says what the study asks and how the notebook goes, and every figure
    comes after a text that says what it shows and how to read it."""
    nb = nbformat.read(ROOT / "notebooks" / "04_agent_study.ipynb", as_version=4)
    intro = nb.cells[0].source
    assert "**The question.**" in intro and "**How it is organised.**" in intro
    figures = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "fig = agent_plots." in c.source]
    assert len(figures) >= 5
    for i in figures:
        text = nb.cells[i - 1]
        assert text.cell_type == "markdown" and "**How to read it.**" in text.source, nb.cells[i].source
        assert len(text.source.split()) >= 60, text.source
    assert nb.cells[-1].cell_type == "markdown" and nb.cells[-1].source.startswith("## What to take from it")
