"""Figures of an ``agent_study`` JSON (used by agent_study.py and notebooks/04_agent_study.ipynb).

* :func:`throughput`: evaluations per minute against agents, one line per mode (warm), one
  panel per think time; cold against warm beside it;
* :func:`errors`: the timing error of every timed candidate against the same candidate timed
  alone, per mode;
* :func:`region_time`: where a region's time goes (wait, acquire, hold), per mode;
* :func:`evaluation_time`: where an evaluation's time goes (the queue for a warm worker,
  compile, check, time), per point.
"""

from __future__ import annotations

from typing import Any

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
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


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
