"""The agent study's reference: every correct candidate timed alone, before and after the points.

A candidate's error is its median in a point against its median alone. One pass before the
points was the first design; on the H200 (2026-12-01, T2254/T2257) every mode, command mode
included, then read 3-5 % off, the same candidates by the same amount: the GPU had drifted
between the pass and the points, and that drift was all the figure showed. A second pass after
the points brackets them: the error is taken against the mean of the two medians, and the
distance between the passes (``reference_drift_pct``) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import agent_kernels as ak
from common import percentile

HERE = Path(__file__).resolve().parent


def sizes(args: argparse.Namespace) -> tuple[str, str]:
    """The check and timing sizes of every evaluation (kernels/ presets)."""
    fake = args.backend == "fake"
    return (args.check_size or ("test1" if fake else "0.05ms"), args.time_size or ("test1" if fake else "0.1ms"))


def reference_pass(
    world: Any, cands: list[ak.Candidate], workdir: Path, bench: dict[str, Any], label: str = "before"
) -> dict[str, dict[str, Any]]:
    """Every correct candidate evaluated alone, in one process (``world``: agent_study.World)."""
    args = world.args
    check_size, time_size = sizes(args)
    jobs = []
    for i, c in enumerate(x for x in cands if not x.wrong):
        path = ak.write_source(c, workdir, f"reference_{label}_{i:03d}")
        jobs.append(
            {
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
        )
    r = subprocess.run(
        [sys.executable, str(HERE / "agent_kernels.py"), "reference"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=world.env,
        timeout=900,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("AGENT-RESULT ")]
    if not lines:
        raise SystemExit(f"agent_study: the reference pass ({label}) failed ({r.returncode}):\n{r.stderr[-3000:]}")
    out = {}
    for rec in json.loads(lines[-1][len("AGENT-RESULT ") :]):
        c = ak.Candidate(**rec["candidate"])
        out[c.id] = {k: rec.get(k) for k in ("status", "median_ms", "p95_ms", "rel_stdev", "samples", "error")}
    return out


def score(rec: dict[str, Any], ref: dict[str, dict[str, Any]]) -> None:
    """Set ``ref_median_ms`` and ``error_pct`` of a timed evaluation record."""
    r = ref.get(rec["candidate"], {})
    if rec.get("median_ms") is not None and r.get("median_ms"):
        rec["ref_median_ms"] = r["median_ms"]
        rec["error_pct"] = 100.0 * (rec["median_ms"] / r["median_ms"] - 1.0)


def error_stats(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and p95 of |error| over timed records (in the window), and their count."""
    errs = [abs(r["error_pct"]) for r in timed if r.get("error_pct") is not None]
    return {
        "median": round(statistics.median(errs), 3) if errs else None,
        "p95": round(percentile(errs, 0.95), 3) if errs else None,
        "n": len(errs),
    }


def bracket(result: dict[str, Any], after: dict[str, dict[str, Any]]) -> None:
    """Score every point again against the mean of the passes before and after; keep the
    before-only figures as ``error_abs_pct_vs_before`` and add ``reference_drift_pct``."""
    before = result["reference"]
    both: dict[str, dict[str, Any]] = {}
    drift = []
    for cid, b in before.items():
        a = after.get(cid, {})
        if b.get("median_ms") and a.get("median_ms"):
            both[cid] = {"median_ms": (b["median_ms"] + a["median_ms"]) / 2}
            drift.append({"error_pct": 100.0 * (a["median_ms"] / b["median_ms"] - 1.0)})
    result["reference_after"] = after
    result["reference_drift_pct"] = error_stats(drift)
    for p in result["points"]:
        p["error_abs_pct_vs_before"] = p["error_abs_pct"]
        for rec in p["records"]:
            rec.pop("ref_median_ms", None)
            rec.pop("error_pct", None)
            score(rec, both)
        p["error_abs_pct"] = error_stats([r for r in p["records"] if not r["late"] and r.get("median_ms") is not None])
