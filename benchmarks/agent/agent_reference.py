"""The agent study's reference: every correct candidate timed alone, before and after the points.

A candidate's error is its median in a point against its median alone. Two things made a single
alone run a poor reference on the H200:

* the GPU drifts (2026-12-01, T2254/T2257: every mode, command mode included, read 3-5 % off, the
  same candidates by the same amount): so a pass runs before the points and another after them;
* a candidate's median depends on the process that times it (2026-12-02, T0326: the tiled
  matmul read 0.2585 ms in the reference process and 0.244-0.247 ms on every warm worker, in
  every mode, one agent alone included): so the passes run where the agents' evaluations run,
  on the warm workers of the pool (``krex_lab.submit``), each candidate ``repeats`` times in a
  shuffled order, one evaluation at a time (nothing else runs).

The reference median is the median of every alone run of both passes. ``reference_drift_pct``
is how far the passes lie apart; ``reference_spread_pct`` how far one alone run lies from the
reference: the floor under any error the study can show.

A point's errors (:func:`point_errors`) count candidates of at least ``MIN_MS`` alone (the study's
bar is for candidates of 0.1 ms and more), and are given twice: over all of them, and over the
*steady* ones, whose alone runs lie within ``STEADY_PCT`` of each other. Some candidates are not
steady alone: on the H200 the tiled numba matmul read 0.2451-0.2578 ms in four alone runs on warm
workers, at one SM clock (2026-12-02, T1131); a median of such runs lies between its modes, and
every evaluation, in any mode, reads 2-4 % off it. ``probes/candidate_modes.py`` looks into why.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
import agent_kernels as ak
from common import percentile

KEPT = ("status", "median_ms", "p95_ms", "rel_stdev", "samples", "error", "pid", "sm_mhz")
#: the error is judged on candidates of at least this median alone (ms)
MIN_MS = 0.1
#: a candidate whose alone runs lie further apart than this (%) is not steady alone
STEADY_PCT = 1.0
#: returns in a window below which a rate gets no interval (:func:`log_rate_se`)
MIN_RETURNS = 10


def sizes(args: argparse.Namespace) -> tuple[str, str]:
    """The check and timing sizes of every evaluation (krex_lab.kernels presets)."""
    fake = args.backend == "fake"
    return (args.check_size or ("test1" if fake else "0.05ms"), args.time_size or ("test1" if fake else "0.1ms"))


def reference_pass(
    world: Any,
    cands: list[ak.Candidate],
    workdir: Path,
    bench: dict[str, Any],
    label: str = "before",
    repeats: int = 1,
) -> dict[str, dict[str, Any]]:
    """Every correct candidate evaluated alone ``repeats`` times on the pool's warm workers
    (``world``: agent_study.World, its pool started). Per candidate: the median of its runs'
    medians, and every run."""
    import krex_lab

    args = world.args
    check_size, time_size = sizes(args)
    correct = [c for c in cands if not c.wrong]
    order = [c for _ in range(repeats) for c in correct]
    random.Random(f"{args.seed}-{label}").shuffle(order)
    runs: dict[str, list[dict[str, Any]]] = {c.id: [] for c in correct}
    for i, c in enumerate(order):
        path = ak.write_source(c, workdir, f"reference_{label}_{i:03d}")
        job = {
            "candidate": ak.candidate_dict(c),
            "path": str(path),
            "mode": "region",
            "gpu": 0,
            "check_size": check_size,
            "time_size": time_size,
            "bench": bench,
            "sim_compile_s": 0.0,
            "max_hold": args.max_hold,
        }
        try:
            rec = krex_lab.submit(ak.evaluate, job, gpu=0).result(timeout=600)
        except Exception as exc:  # the pool failed, not the candidate
            raise SystemExit(f"agent_study: the reference pass ({label}) failed on {c.id}: {exc}") from exc
        runs[c.id].append({k: rec.get(k) for k in KEPT})
    out = {}
    for cid, rs in runs.items():
        medians = [r["median_ms"] for r in rs if r.get("median_ms")]
        out[cid] = {
            "status": "ok" if medians else (rs[0].get("status") if rs else "missing"),
            "median_ms": statistics.median(medians) if medians else None,
            "runs": rs,
        }
    return out


def alone_medians(r: dict[str, Any]) -> list[float]:
    """The medians of a candidate's alone runs (a reference entry), those that timed."""
    return [run["median_ms"] for run in r.get("runs", []) if run.get("median_ms")]


def alone_range_pct(r: dict[str, Any]) -> float | None:
    """How far a candidate's alone runs lie apart (max / min - 1, %); None with fewer than two."""
    medians = alone_medians(r)
    return round(100.0 * (max(medians) / min(medians) - 1.0), 3) if len(medians) > 1 else None


def beyond_alone_pct(median_ms: float, r: dict[str, Any]) -> float | None:
    """How far a timing lies outside the range of its candidate's alone runs (%, signed: above the
    slowest positive, below the fastest negative, 0 inside; None without alone runs).

    Some candidates read one of two times alone, by where their inputs were allocated (the tiled
    numba matmul: 0.244 or 0.260 ms, ``probes/candidate_modes.py``, H200 2026-12-02); one timing is one
    allocation's. Against the median of a few alone runs such a candidate misses by 4-6% with
    nobody else on the GPU; against their range it misses only by what sharing added. With one
    alone run this is the error itself."""
    medians = alone_medians(r)
    if not medians:
        return None
    lo, hi = min(medians), max(medians)
    if median_ms > hi:
        return 100.0 * (median_ms / hi - 1.0)
    return 100.0 * (median_ms / lo - 1.0) if median_ms < lo else 0.0


def score(rec: dict[str, Any], ref: dict[str, dict[str, Any]]) -> None:
    """Set ``ref_median_ms``, ``error_pct``, ``beyond_alone_pct`` and ``alone_range_pct`` of a
    timed evaluation record."""
    r = ref.get(rec["candidate"], {})
    if rec.get("median_ms") is not None and r.get("median_ms"):
        rec["ref_median_ms"] = r["median_ms"]
        rec["error_pct"] = 100.0 * (rec["median_ms"] / r["median_ms"] - 1.0)
        rec["beyond_alone_pct"] = beyond_alone_pct(rec["median_ms"], r)
        rec["alone_range_pct"] = alone_range_pct(r)


def score_all(records: list[dict[str, Any]], ref: dict[str, dict[str, Any]]) -> None:
    """:func:`score` every record against ``ref``, dropping what an earlier scoring set."""
    for rec in records:
        for key in ("ref_median_ms", "error_pct", "beyond_alone_pct", "alone_range_pct"):
            rec.pop(key, None)
        score(rec, ref)


def point_errors(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A point's timing errors (its warm-up's evaluations too, not those that came back late):
    ``error_abs_pct`` over candidates of at least ``MIN_MS`` alone, ``error_abs_pct_steady``
    over those of them steady alone, and the candidates that were not (``unsteady_alone``);
    ``error_abs_pct_beyond_alone``: over all of them again, each timing's distance outside its
    candidate's alone runs (:func:`beyond_alone_pct`)."""
    judged = [r for r in records if not r["late"] and r.get("error_pct") is not None and r["ref_median_ms"] >= MIN_MS]
    steady = [r for r in judged if r.get("alone_range_pct") is not None and r["alone_range_pct"] <= STEADY_PCT]
    unsteady = sorted({r["candidate"] for r in judged if (r.get("alone_range_pct") or 0.0) > STEADY_PCT})
    return {
        "error_abs_pct": error_stats(judged),
        "error_abs_pct_steady": error_stats(steady),
        "error_abs_pct_beyond_alone": error_stats(judged, "beyond_alone_pct"),
        "unsteady_alone": unsteady,
    }


def ratios(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Region over command evaluations a minute, for each region point and its command twin (same
    launch, agents, think time and freeze), with the counts in the two windows and a 95 %
    interval for the ratio (:func:`log_rate_se`): a 45 s window holds 14-19 command-mode
    evaluations on the H200, and one run's ratio is known to no better than about ±25 %. The
    interval is the noise of counting within the run; runs on other machines, with other
    candidates drawn, differ by more (command mode held 2.84 s at 11:31 and 2.31 s at 18:17)."""
    out = []
    key = ("launch", "agents", "think_mean_s", "freeze")
    for p in points:
        if p["mode"] != "region":
            continue
        for q in points:
            if q["mode"] == "command" and all(q.get(k, True) == p.get(k, True) for k in key) and q["evals_per_min"]:
                ratio = p["evals_per_min"] / q["evals_per_min"]
                se_region, se_command = log_rate_se(p), log_rate_se(q)
                spread = (
                    None
                    if se_region is None or se_command is None
                    else math.exp(1.96 * math.hypot(se_region, se_command))
                )
                out.append(
                    {
                        **{k: p.get(k, True) for k in key},
                        "ratio": round(ratio, 2),
                        "counts": [p["evaluations_in_window"], q["evaluations_in_window"]],
                        "interval_95": None if spread is None else [round(ratio / spread, 2), round(ratio * spread, 2)],
                    }
                )
    return out


def ratio_line(r: dict[str, Any]) -> str:
    """One ratio of :func:`ratios` in a line (also one of a run written before they had counts)."""
    freeze = "on" if r.get("freeze", True) else "off"
    head = f"region / command, {r['launch']} {r['agents']} agents think {r['think_mean_s']} s "
    head += f"freeze {freeze}: {r['ratio']}x"
    if "counts" not in r:
        return f"{head} (no interval: a run written before 2026-12-02 19:00; --rescore gives one where it can)"
    return f"{head} ({interval_text(r['interval_95'])}; {r['counts'][0]} vs {r['counts'][1]} evaluations)"


def interval_text(lo_hi: list[float] | None) -> str:
    return (
        f"no interval (under {MIN_RETURNS} returns in a window, or no window recorded)"
        if lo_hi is None
        else f"95 % {lo_hi[0]:.2f}-{lo_hi[1]:.2f}"
    )


def in_window(point: dict[str, Any]) -> list[dict[str, Any]]:
    """The evaluations that returned inside the point's measured window (every one that returned,
    for a point written before windows were recorded)."""
    lo, hi = point.get("measure_from"), point.get("until")
    done = [r for r in point["records"] if r.get("done") is not None]
    return done if lo is None or hi is None else [r for r in done if lo <= r["done"] <= hi]


def log_rate_se(point: dict[str, Any]) -> float | None:
    """Standard error of the log of a point's evaluation rate, from the gaps between the
    evaluations that returned in its window: their coefficient of variation over the root of
    their number. Gaps as regular as a saturated GPU's queue give a narrow interval, gaps as
    random as a Poisson process's (variation 1) the interval of a count. A normal approximation:
    None under ``MIN_RETURNS`` returns (a handful of gaps says little about their spread), and
    for a run written before windows were recorded (no ``measure_from``)."""
    if "measure_from" not in point:
        return None
    done = sorted(r["done"] for r in in_window(point))
    gaps = [b - a for a, b in itertools.pairwise(done)]
    if len(done) < MIN_RETURNS or statistics.fmean(gaps) <= 0:
        return None
    return statistics.stdev(gaps) / statistics.fmean(gaps) / math.sqrt(len(gaps))


def error_stats(timed: list[dict[str, Any]], key: str = "error_pct") -> dict[str, Any]:
    """Median and p95 of |``key``| over timed records, and their count."""
    errs = [abs(r[key]) for r in timed if r.get(key) is not None]
    return {
        "median": round(statistics.median(errs), 3) if errs else None,
        "p95": round(percentile(errs, 0.95), 3) if errs else None,
        "n": len(errs),
    }


def error_text(s: dict[str, Any]) -> str:
    """A point's timing errors in one phrase (candidates of 0.1 ms and more; the steady ones apart)."""
    err, steady = s["error_abs_pct"], s["error_abs_pct_steady"]
    beyond = s.get("error_abs_pct_beyond_alone") or {}
    return (
        f"|error| median {err['median']} % p95 {err['p95']} % (n={err['n']}; "
        f"steady alone p95 {steady['p95']} %, n={steady['n']}; beyond the alone runs p95 {beyond.get('p95')} %)"
    )


def error_line(s: dict[str, Any], label: str) -> str:
    """``label``: a point's errors, and the candidates that were not steady alone."""
    return f"    {label}: {error_text(s)}; not steady alone: {', '.join(s['unsteady_alone']) or 'none'}"


def spread(ref: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """|error| of every alone run against its candidate's reference median: the study's floor."""
    rows = []
    for r in ref.values():
        for run in r.get("runs", []):
            if run.get("median_ms") and r.get("median_ms"):
                rows.append({"error_pct": 100.0 * (run["median_ms"] / r["median_ms"] - 1.0)})
    return error_stats(rows)


def bracket(result: dict[str, Any], after: dict[str, dict[str, Any]]) -> None:
    """Score every point again against the median of every alone run before and after; keep the
    before-only figures as ``error_abs_pct_vs_before``; add ``reference_drift_pct`` (after
    against before) and ``reference_spread_pct`` (each alone run against the reference)."""
    before = result["reference"]
    both: dict[str, dict[str, Any]] = {}
    drift = []
    for cid, b in before.items():
        a = after.get(cid, {})
        runs = b.get("runs", []) + a.get("runs", [])
        medians = [r["median_ms"] for r in runs if r.get("median_ms")]
        if medians:
            both[cid] = {"median_ms": statistics.median(medians), "runs": runs}
        if b.get("median_ms") and a.get("median_ms"):
            drift.append({"error_pct": 100.0 * (a["median_ms"] / b["median_ms"] - 1.0)})
    result["reference_after"] = after
    result["reference_combined"] = both
    result["reference_drift_pct"] = error_stats(drift)
    result["reference_spread_pct"] = spread(both)
    for p in result["points"]:
        p["error_abs_pct_vs_before"] = p["error_abs_pct"]
        score_all(p["records"], both)
        p.update(point_errors(p["records"]))


def rescore(data: dict[str, Any]) -> None:
    """Score a study's points again under this module's rules (a run made before they changed);
    the figures it was written with stay, as ``error_abs_pct_as_run``."""
    for p in data["points"]:
        p.setdefault("error_abs_pct_as_run", p["error_abs_pct"])
        if data.get("reference_combined"):  # bracketed: the before-only figures too, as bracket() keeps them
            score_all(p["records"], data["reference"])
            p["error_abs_pct_vs_before"] = point_errors(p["records"])["error_abs_pct"]
        score_all(p["records"], data.get("reference_combined") or data["reference"])
        p.update(point_errors(p["records"]))
    data["ratios_region_over_command"] = ratios(data["points"])
    data["rescored"] = {
        "by": "benchmarks/agent/agent_reference.py --rescore",
        "min_ms": MIN_MS,
        "steady_pct": STEADY_PCT,
    }


def main() -> None:
    p = argparse.ArgumentParser(description="Score agent-study JSON files again under the current rules, in place.")
    p.add_argument("--rescore", nargs="+", type=Path, required=True, metavar="JSON")
    for path in p.parse_args().rescore:
        text = path.read_text()
        data = json.loads(text)
        rescore(data)
        # written as it was indented, or compact (a diff then shows only what changed)
        indent = re.match(r"\{\n( +)", text)
        path.write_text(json.dumps(data, indent=len(indent.group(1)) if indent else None))
        print(path.name)
        for s in data["points"]:
            print(error_line(s, f"{s['launch']:4s} {s['mode']:7s} agents {s['agents']:2d}"))


if __name__ == "__main__":
    main()
