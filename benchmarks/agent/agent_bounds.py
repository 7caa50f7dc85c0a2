"""What bounds an agent-study point's throughput, read from its JSON ("which phase holds
it back, measured"). Used by notebooks/04_agent_study.ipynb.

For each point, over the evaluations that returned inside its measured window:

* **regions' share of the GPU**: each region's hold clipped to the window, summed, over the
  window. Regions are one at a time on a GPU, so a point whose regions hold it nearly all the
  time (command mode) is bound by them: at most 60 / mean hold evaluations a minute;
* **the agents' cycle**: mean think time + mean evaluation latency (sent to done). Each agent does
  one evaluation a cycle, so ``agents * 60 / cycle`` is what the point can reach; where that is
  what it reads, the cycle is what bounds it, and the phases say where an evaluation's time goes;
* **phases**, mean seconds per evaluation: compile, check and time, and time's parts (setup,
  warm-up, the region's wait, sampling, ...).

Over several runs, the **pooled** region / command ratio at an agent count: the evaluations
counted in every run's windows, summed (a run's two modes have equal windows, so longer runs
weigh more, as their counts do).

    python benchmarks/agent/agent_bounds.py benchmarks/results/agent_study-nvidia-2026-12-02T2104.json
    python benchmarks/agent/agent_bounds.py --pooled --since 2026-12-02T1100
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from agent_plots import compared_at, load_runs
from agent_reference import in_window

PHASES = ("compile_s", "check_s", "time_s")


def gpu_held_share(point: dict[str, Any]) -> float | None:
    """The share of the measured window the point's regions held the GPU (None: no window)."""
    lo, hi = point.get("measure_from"), point.get("until")
    if lo is None or hi is None or hi <= lo:
        return None
    held = 0.0
    for r in point["records"]:
        region = r.get("region") or {}
        start, end = region.get("granted"), region.get("released")
        if start is not None and end is not None:
            held += max(0.0, min(end, hi) - max(start, lo))
    return held / (hi - lo)


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 3) if xs else None


def bounds(point: dict[str, Any]) -> dict[str, Any]:
    """A point's throughput against what bounds it (see the module docstring)."""
    recs = in_window(point)
    think = _mean([r["think_s"] for r in recs if isinstance(r.get("think_s"), (int, float))])
    latency = _mean([r["latency_s"] for r in recs if isinstance(r.get("latency_s"), (int, float))])
    cycle = (think or 0.0) + latency if latency is not None else None
    holds = [r["region"]["hold_s"] for r in recs if (r.get("region") or {}).get("hold_s") is not None]
    share = gpu_held_share(point)
    regions_bound = round(60 / statistics.fmean(holds), 1) if holds else None
    cycle_bound = round(point["agents"] * 60 / cycle, 1) if cycle else None
    parts = sorted({k for r in recs for k in (r.get("phases") or {})})
    return {
        "launch": point["launch"],
        "mode": point["mode"],
        "agents": point["agents"],
        "think_mean_s": point["think_mean_s"],
        "evals_per_min": point["evals_per_min"],
        "returned": len(recs),
        "gpu_held_pct": round(100 * share, 1) if share is not None else None,
        "hold_s": _mean(holds),
        "regions_bound_per_min": regions_bound,
        "think_s": think,
        "latency_s": latency,
        "cycle_s": round(cycle, 3) if cycle else None,
        "cycle_bound_per_min": cycle_bound,
        # the lower of the two bounds: what the point runs into first
        "bound_by": _lower(regions_bound, cycle_bound),
        "phases_s": {
            k.removesuffix("_s"): _mean([r[k] for r in recs if isinstance(r.get(k), (int, float))]) for k in PHASES
        },
        "time_parts_s": {
            k.removesuffix("_s"): _mean([r["phases"][k] for r in recs if k in (r.get("phases") or {})]) for k in parts
        },
    }


def _lower(regions: float | None, cycle: float | None) -> str:
    if regions is None or cycle is None:
        return "cycle" if cycle is not None else ""
    return "regions" if regions < cycle else "cycle"


def bounds_line(b: dict[str, Any]) -> str:
    """One point's :func:`bounds` in a line."""
    held = (
        "no window recorded"
        if b["gpu_held_pct"] is None
        else f"regions hold the GPU {b['gpu_held_pct']}% of the window"
    )
    if b["regions_bound_per_min"] is not None:
        held += f" (mean hold {b['hold_s']} s: at most {b['regions_bound_per_min']}/min)"
    cycle = (
        f"cycle {b['think_s']} s think + {b['latency_s']} s evaluation = {b['cycle_s']} s: at most "
        f"{b['cycle_bound_per_min']}/min"
        if b["cycle_s"]
        else "no evaluation returned"
    )
    phases = ", ".join(f"{k} {v}" for k, v in b["phases_s"].items() if v is not None)
    parts = ", ".join(f"{k} {v}" for k, v in b["time_parts_s"].items() if v is not None)
    return (
        f"{b['launch']} {b['mode']:7s} {b['agents']:2d} agents think {b['think_mean_s']:g} s: "
        f"{b['evals_per_min']}/min, bound by its {b['bound_by'] or '?'}; {held}; {cycle}; mean s: {phases}"
        + (f" (time: {parts})" if parts else "")
    )


def pooled(runs: dict[str, dict[str, Any]], agents: int, think: float) -> dict[str, Any] | None:
    """The region / command ratio of every run's warm, freezing comparison at ``agents`` and think
    mean ``think``, pooled (summed counts); None when no run has one with counts."""
    used = [
        (name, r)
        for name, data in runs.items()
        for r in data.get("ratios_region_over_command") or []
        if compared_at(r, think) and r["agents"] == agents and r.get("counts")
    ]
    if not used:
        return None
    region = sum(r["counts"][0] for _, r in used)
    command = sum(r["counts"][1] for _, r in used)
    return {
        "agents": agents,
        "think_mean_s": think,
        "runs": [name for name, _ in used],
        "ratios": [r["ratio"] for _, r in used],
        "counts": [region, command],
        "ratio": round(region / command, 2) if command else None,
    }


def pooled_line(p: dict[str, Any]) -> str:
    return (
        f"pooled region / command, warm {p['agents']} agents think {p['think_mean_s']:g} s, {len(p['runs'])} runs "
        f"({', '.join(p['runs'])}; each {', '.join(f'{x:g}x' for x in p['ratios'])}): {p['ratio']}x "
        f"({p['counts'][0]} vs {p['counts'][1]} evaluations)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", nargs="*", type=Path, help="agent_study JSON files")
    ap.add_argument("--pooled", action="store_true", help="the pooled ratio over the runs since --since")
    ap.add_argument("--since", default="2026-12-02T1100")
    ap.add_argument("--backend", default="nvidia")
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--think", type=float, default=8.0)
    args = ap.parse_args()
    if not args.study and not args.pooled:
        ap.error("name a study JSON, or say --pooled")
    for path in args.study:
        data = json.loads(path.read_text())
        print(path.name)
        for point in data["points"]:
            print("  " + bounds_line(bounds(point)))
    if args.pooled:
        p = pooled(load_runs(args.since, args.backend), args.agents, args.think)
        print(pooled_line(p) if p else f"no run since {args.since} compares the modes at {args.agents} agents")


if __name__ == "__main__":
    main()
