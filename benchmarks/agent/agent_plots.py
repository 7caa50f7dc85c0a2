"""Figures of an ``agent_study`` JSON (used by agent_study.py and notebooks/04_agent_study.ipynb).

* :func:`throughput`: evaluations per minute against agents, one line per mode (warm), one
  panel per think time; cold against warm beside it;
* :func:`errors`: the timing error of every timed candidate against the same candidate timed
  alone, per mode;
* :func:`region_time`: where a region's time goes (wait, acquire, hold), per mode;
* :func:`evaluation_time`: where an evaluation's time goes (the queue for a warm worker,
  compile, check, time), per point;
* :func:`sweep`: several runs at once, evaluations per minute against agents and the region /
  command ratio with its interval (a sweep's points come from runs made one call at a time).

    python benchmarks/agent/agent_plots.py --sweep --since 2026-12-02T1100   # every GPU run since, think 8 s
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from pathlib import Path
from typing import Any

from agent_reference import interval_text

COLOURS = {
    "command": "tab:red",
    "region": "tab:green",
    "none": "tab:gray",
    "command no-freeze": "tab:pink",
    "region no-freeze": "tab:olive",
}


def series(p: dict[str, Any]) -> str:
    """A point's line in the figures: its mode, and whether its regions froze the other sessions
    (``--freeze off``; points of older JSON have no ``freeze`` and froze)."""
    return p["mode"] + (" no-freeze" if p.get("freeze", True) is False else "")


def _series_of(points: list[dict[str, Any]]) -> list[str]:
    present = {series(p) for p in points}
    return [s for s in COLOURS if s in present]


def _label(data: dict[str, Any]) -> str:
    sim = " - SIMULATED GPU phases (fake backend)" if data.get("simulated_gpu_phases") else ""
    return f"{data.get('backend')} backend, {data['machine'].get('date', '')[:16]}{sim}"


def throughput(data: dict[str, Any]) -> Any:
    import matplotlib.pyplot as plt

    points = data["points"]
    thinks = sorted({p["think_mean_s"] for p in points if p["launch"] == "warm"})
    cold = [p for p in points if p["launch"] == "cold"]
    ncols = len(thinks) + (1 if cold else 0)
    fig, axes = plt.subplots(1, max(1, ncols), figsize=(4.6 * max(1, ncols), 3.8), squeeze=False)
    for ax, think in zip(axes[0], thinks):
        for name in _series_of(points):
            ps = sorted(
                (p for p in points if p["launch"] == "warm" and series(p) == name and p["think_mean_s"] == think),
                key=lambda p: p["agents"],
            )
            if ps:
                ax.plot(
                    [p["agents"] for p in ps], [p["evals_per_min"] for p in ps], "o-", color=COLOURS[name], label=name
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("agents")
        ax.set_ylabel("evaluations / min")
        ax.set_title(f"warm, think mean {think:g} s")
        ax.legend()
        ax.grid(alpha=0.3)
    if cold:
        ax = axes[0][-1]
        labels, values, colours = [], [], []
        for p in sorted(
            cold + [q for q in points if q.get("compare_with_cold")], key=lambda p: (p["mode"], p["launch"])
        ):
            labels.append(f"{p['mode']}\n{p['launch']}")
            values.append(p["evals_per_min"])
            colours.append(COLOURS[p["mode"]] if p["launch"] == "warm" else "white")
        ax.bar(range(len(values)), values, color=colours, edgecolor=[COLOURS[lb.split()[0]] for lb in labels])
        ax.set_xticks(range(len(values)), labels, fontsize=8)
        ax.set_ylabel("evaluations / min")
        ax.set_title(f"cold vs warm, {cold[0]['agents']} agents, think {cold[0]['think_mean_s']:g} s")
    fig.suptitle("Evaluations per minute - " + _label(data), fontsize=9)
    fig.tight_layout()
    return fig


def errors(data: dict[str, Any]) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    lines = []
    for name in _series_of(data["points"]):
        errs = [
            r["error_pct"]
            for p in data["points"]
            if series(p) == name
            for r in p["records"]
            if r.get("error_pct") is not None
        ]
        lines.append((name, errs))
    shown = [(m, e) for m, e in lines if e]
    if shown:
        ax.boxplot([e for _, e in shown], showfliers=True, whis=(5, 95))
        ax.set_xticks(range(1, len(shown) + 1), [f"{m}\n(n={len(e)})" for m, e in shown])
    ax.axhline(0, color="k", lw=0.5)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("median time vs alone (%)")
    ax.set_title("Timing error per mode (whiskers p5-p95) - " + _label(data), fontsize=9)
    fig.tight_layout()
    return fig


def region_time(data: dict[str, Any]) -> Any:
    import matplotlib.pyplot as plt

    rows = []
    for p in data["points"]:
        if p["mode"] == "none" or not p.get("regions"):
            continue
        rows.append(p)
    rows.sort(key=lambda p: (p["launch"], p["think_mean_s"], p["agents"], series(p)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2), 4.0))
    x = range(len(rows))
    wait = [p["regions"]["wait_s_mean"] for p in rows]
    acq = [p["regions"]["acquire_s_mean"] for p in rows]
    hold = [p["regions"]["hold_s_mean"] for p in rows]
    ax.bar(x, wait, color="tab:orange", label="wait (queued)")
    ax.bar(x, acq, bottom=wait, color="tab:purple", label="acquire (drain, freeze, isolate)")
    ax.bar(x, hold, bottom=[w + a for w, a in zip(wait, acq)], color="tab:blue", label="hold")
    ax.set_xticks(
        list(x), [f"{series(p)} {p['launch']}\n{p['agents']}a t{p['think_mean_s']:g}" for p in rows], fontsize=7
    )
    ax.set_ylabel("seconds per region (mean)")
    ax.legend(fontsize=8)
    ax.set_title("Where a region's time goes - " + _label(data), fontsize=9)
    fig.tight_layout()
    return fig


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def evaluation_time(data: dict[str, Any]) -> Any:
    """Median seconds per evaluation: sent to started on a worker (the queue for a warm worker,
    or a cold process's start), then its compile, check and time phases (the region's wait and
    hold are inside compile..time in command mode, inside time in region mode)."""
    import matplotlib.pyplot as plt

    rows = sorted(data["points"], key=lambda p: (p["launch"], p["think_mean_s"], p["agents"], series(p)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2), 4.0))
    parts = [
        ("queue", "tab:red", lambda r: r["eval_started"] - r["sent"]),
        ("compile", "tab:gray", lambda r: r.get("compile_s") or 0.0),
        ("check", "tab:olive", lambda r: r.get("check_s") or 0.0),
        ("time", "tab:blue", lambda r: r.get("time_s") or 0.0),
    ]
    bottom = [0.0] * len(rows)
    for name, colour, value in parts:
        heights = [_median([value(r) for r in p["records"] if r.get("eval_started")]) for p in rows]
        ax.bar(range(len(rows)), heights, bottom=bottom, color=colour, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(
        list(range(len(rows))),
        [f"{series(p)} {p['launch']}\n{p['agents']}a t{p['think_mean_s']:g}" for p in rows],
        fontsize=7,
    )
    ax.set_ylabel("seconds per evaluation (median of each part)")
    ax.legend(fontsize=8)
    ax.set_title("Where an evaluation's time goes - " + _label(data), fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {"throughput": throughput, "errors": errors, "regions": region_time, "evaluations": evaluation_time}

RESULTS = Path(__file__).resolve().parents[1] / "results"
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{4}")


def compared_at(x: dict[str, Any], think: float) -> bool:
    """Whether a point or a ratio is one the sweep compares: warm workers, regions that freeze,
    think mean ``think``."""
    return bool(x["launch"] == "warm" and x.get("freeze", True) and x["think_mean_s"] == think)


def sweep_rows(runs: dict[str, dict[str, Any]], think: float) -> list[dict[str, Any]]:
    """The warm, freezing points of every run at think mean ``think``, one row each, by agents:
    what :func:`sweep` draws (run names are their files' stamps)."""
    rows = [
        {"run": name, "mode": p["mode"], "agents": p["agents"], "evals_per_min": p["evals_per_min"]}
        for name, data in runs.items()
        for p in data["points"]
        if compared_at(p, think)
    ]
    ratios = [
        {
            "run": name,
            "mode": "region/command",
            "agents": r["agents"],
            "ratio": r["ratio"],
            "interval_95": r.get("interval_95"),
        }
        for name, data in runs.items()
        for r in data.get("ratios_region_over_command") or []
        if compared_at(r, think)
    ]
    return sorted(rows + ratios, key=lambda r: (r["agents"], r["mode"], r["run"]))


def row_line(r: dict[str, Any]) -> str:
    """One row of :func:`sweep_rows` in a line."""
    figure = (
        f"{r['ratio']:.2f}x ({interval_text(r['interval_95'])})" if "ratio" in r else f"{r['evals_per_min']:.2f}/min"
    )
    return f"{r['agents']:3d} agents  {r['mode']:15s} {figure:22s} {r['run']}"


def sweep(runs: dict[str, dict[str, Any]], think: float = 8.0, bar: float = 3.4) -> Any:
    """Evaluations per minute against agents, every run's point and the median per agent count;
    beside it each run's region / command ratio with its 95 % interval, against ``bar``."""
    import matplotlib.pyplot as plt

    rows = sweep_rows(runs, think)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 3.9))
    for mode in ("command", "region", "none"):
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        left.plot([r["agents"] for r in mine], [r["evals_per_min"] for r in mine], "o", color=COLOURS[mode], alpha=0.5)
        agents = sorted({r["agents"] for r in mine})
        medians = [_median([r["evals_per_min"] for r in mine if r["agents"] == a]) for a in agents]
        left.plot(agents, medians, "-", color=COLOURS[mode], label=f"{mode} (median of runs)")
    left.set_xscale("log", base=2)
    left.set_xlabel("agents")
    left.set_ylabel("evaluations / min")
    left.set_title(f"warm, think mean {think:g} s, freeze on", fontsize=9)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    ratios = [r for r in rows if r["mode"] == "region/command"]
    for i, r in enumerate(ratios):
        x = r["agents"] * (1 + 0.04 * (i % 3 - 1))  # runs at one agent count side by side
        lo, hi = r["interval_95"] or (r["ratio"], r["ratio"])
        right.errorbar(
            [x], [r["ratio"]], yerr=[[r["ratio"] - lo], [hi - r["ratio"]]], fmt="o", color="tab:green", capsize=3
        )
    right.axhline(bar, color="k", ls="--", lw=0.8, label=f"the paper's {bar:g}x")
    right.set_xscale("log", base=2)
    right.set_xlabel("agents")
    right.set_ylabel("region / command (95 % interval)")
    right.set_title("each run's ratio", fontsize=9)
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    drawn = sorted({r["run"] for r in rows})
    backends = sorted({runs[name].get("backend", "?") for name in drawn})
    span = f"{drawn[0]} to {drawn[-1]}" if drawn else "none"
    fig.suptitle(f"Agent study sweep: {len(drawn)} runs, {span} ({', '.join(backends)})", fontsize=9)
    fig.tight_layout()
    return fig


def load_runs(since: str, backend: str = "nvidia", results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every ``agent_study-<backend>-*.json`` of ``results`` stamped ``since`` or later, by stamp."""
    runs = {}
    for path in sorted(results.glob(f"agent_study-{backend}-*.json")):
        found = STAMP.search(path.name)
        if found and found.group(0) >= since:
            runs[path.stem.removeprefix(f"agent_study-{backend}-")] = json.loads(path.read_text())
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description="The agent study's sweep over several runs, as one figure.")
    p.add_argument("--sweep", action="store_true", help="draw the sweep (the only figure drawn from several runs)")
    p.add_argument("--since", default="2026-12-02T1100", help="first run stamp (default: since the workers stay warm)")
    p.add_argument("--backend", default="nvidia")
    p.add_argument("--think", type=float, default=8.0)
    args = p.parse_args()
    if not args.sweep:
        p.error("nothing to draw: say --sweep")
    import matplotlib

    matplotlib.use("Agg")
    runs = load_runs(args.since, args.backend)
    if not runs:
        raise SystemExit(f"no agent_study-{args.backend}-*.json since {args.since} in {RESULTS}")
    for r in sweep_rows(runs, args.think):
        print(row_line(r))
    out = RESULTS / f"agent_sweep-{args.backend}-think{args.think:g}.png"
    sweep(runs, args.think).savefig(out, dpi=110)
    print(f"wrote {out}")


def write_plots(result: dict[str, Any], path: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")

    written = []
    for name, fn in FIGURES.items():
        fig = fn(result)
        out = path.with_name(f"{path.stem}-{name}.png")
        fig.savefig(out, dpi=110)
        written.append(out)
        if os.environ.get("OUT"):
            fig.savefig(Path(os.environ["OUT"], out.name), dpi=110)
        print(f"wrote {out}")
    return written


if __name__ == "__main__":
    main()
