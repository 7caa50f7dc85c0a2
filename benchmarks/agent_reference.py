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
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path
from typing import Any

import agent_kernels as ak
from common import percentile

KEPT = ("status", "median_ms", "p95_ms", "rel_stdev", "samples", "error", "pid", "sm_mhz")


def sizes(args: argparse.Namespace) -> tuple[str, str]:
    """The check and timing sizes of every evaluation (kernels/ presets)."""
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


def score(rec: dict[str, Any], ref: dict[str, dict[str, Any]]) -> None:
    """Set ``ref_median_ms`` and ``error_pct`` of a timed evaluation record."""
    r = ref.get(rec["candidate"], {})
    if rec.get("median_ms") is not None and r.get("median_ms"):
        rec["ref_median_ms"] = r["median_ms"]
        rec["error_pct"] = 100.0 * (rec["median_ms"] / r["median_ms"] - 1.0)


def error_stats(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and p95 of |error| over timed records, and their count."""
    errs = [abs(r["error_pct"]) for r in timed if r.get("error_pct") is not None]
    return {
        "median": round(statistics.median(errs), 3) if errs else None,
        "p95": round(percentile(errs, 0.95), 3) if errs else None,
        "n": len(errs),
    }


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
        for rec in p["records"]:
            rec.pop("ref_median_ms", None)
            rec.pop("error_pct", None)
            score(rec, both)
        p["error_abs_pct"] = error_stats([r for r in p["records"] if not r["late"] and r.get("median_ms") is not None])
