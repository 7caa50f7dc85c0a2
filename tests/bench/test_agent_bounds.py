"""What bounds an agent-study point (benchmarks/agent/agent_bounds.py): the window clipping, the two
bounds, the pooled ratio, and the command as a user runs it on a study's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "agent"))

import agent_bounds  # noqa: E402


def _record(done: float, think: float, latency: float, region: tuple[float, float] | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"done": done, "think_s": think, "latency_s": latency, "compile_s": 1.0, "check_s": 2.0}
    if region is not None:
        rec["region"] = {"granted": region[0], "released": region[1], "hold_s": region[1] - region[0]}
        rec["phases"] = {"sampling_s": 0.5}
    return rec


def _point(records: list[dict[str, Any]], agents: int = 2, mode: str = "region") -> dict[str, Any]:
    return {
        "launch": "warm",
        "mode": mode,
        "agents": agents,
        "think_mean_s": 8.0,
        "evals_per_min": 5.0,
        "measure_from": 100.0,
        "until": 160.0,
        "records": records,
    }


def test_regions_share_is_clipped_to_the_window_and_late_returns_do_not_count() -> None:
    point = _point(
        [
            _record(105.0, 4.0, 6.0, region=(90.0, 110.0)),  # 10 s of it inside the window
            _record(158.0, 8.0, 10.0, region=(150.0, 170.0)),  # 10 s inside
            _record(175.0, 100.0, 100.0, region=(171.0, 174.0)),  # after the window: not counted
        ]
    )
    assert agent_bounds.gpu_held_share(point) == 20.0 / 60.0
    b = agent_bounds.bounds(point)
    assert b["returned"] == 2 and b["gpu_held_pct"] == 33.3
    assert b["think_s"] == 6.0 and b["latency_s"] == 8.0 and b["cycle_s"] == 14.0
    assert b["cycle_bound_per_min"] == round(2 * 60 / 14.0, 1)
    assert b["hold_s"] == 20.0 and b["regions_bound_per_min"] == 3.0
    assert b["bound_by"] == "regions"  # 3/min from 20 s holds, against 8.6/min from the cycle
    assert b["phases_s"] == {"compile": 1.0, "check": 2.0, "time": None}
    assert b["time_parts_s"] == {"sampling": 0.5}
    assert "bound by its regions" in agent_bounds.bounds_line(b)


def test_a_point_of_short_regions_is_bound_by_its_agents_cycle() -> None:
    point = _point([_record(120.0 + i, 7.0, 5.0, region=(110.0 + i, 110.5 + i)) for i in range(8)], agents=16)
    b = agent_bounds.bounds(point)
    assert b["bound_by"] == "cycle" and b["cycle_bound_per_min"] == 80.0 and b["regions_bound_per_min"] == 120.0


def test_a_point_without_its_window_counts_every_return_and_has_no_share() -> None:
    point = _point([_record(105.0, 4.0, 6.0), _record(500.0, 4.0, 6.0)], mode="none")
    del point["measure_from"], point["until"]
    b = agent_bounds.bounds(point)
    assert b["returned"] == 2 and b["gpu_held_pct"] is None and b["bound_by"] == "cycle"
    assert "no window recorded" in agent_bounds.bounds_line(b)


def test_pooled_ratio_sums_the_counts_of_the_comparisons_asked_for() -> None:
    def ratio(agents: int, counts: list[int] | None, **kw: Any) -> dict[str, Any]:
        r = {"launch": "warm", "agents": agents, "think_mean_s": 8.0, "freeze": True, "ratio": 0.0, **kw}
        if counts is not None:
            r["counts"] = counts
        return r

    runs = {
        "a": {"ratios_region_over_command": [ratio(16, [50, 14]), ratio(8, [30, 20])]},
        "b": {"ratios_region_over_command": [ratio(16, [150, 55])]},
        "c": {"ratios_region_over_command": [ratio(16, [90, 10], freeze=False)]},  # not asked for
        "d": {"ratios_region_over_command": [ratio(16, None)]},  # written before counts
        "e": {"ratios_region_over_command": [ratio(16, [90, 10], launch="cold")]},
    }
    p = agent_bounds.pooled(runs, 16, 8.0)
    assert p is not None and p["runs"] == ["a", "b"] and p["counts"] == [200, 69] and p["ratio"] == round(200 / 69, 2)
    assert agent_bounds.pooled(runs, 32, 8.0) is None


def test_the_command_prints_a_line_per_point() -> None:
    study = REPO / "benchmarks" / "results" / "agent_study-fake-2026-12-02T1944.json"
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "agent" / "agent_bounds.py"), str(study)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    points = json.loads(study.read_text())["points"]
    lines = [line for line in out.splitlines() if "agents think" in line]
    assert len(lines) == len(points)
    for line, p in zip(lines, points):
        assert f"{p['agents']:2d} agents think {p['think_mean_s']:g} s: {p['evals_per_min']}/min, bound by its" in line
