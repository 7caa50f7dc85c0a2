"""What one point of an agent study measured (``agent_study.py``): its summary from the agents'
records, and the regions that overlapped on one GPU (none may: a region is the GPU alone)."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import agent_kernels as ak
import agent_reference
from common import percentile


def overlaps(intervals: list[tuple[float, float]]) -> int:
    """How many consecutive pairs (by start) overlap."""
    xs = sorted(intervals)
    return sum(1 for a, b in itertools.pairwise(xs) if b[0] < a[1])


def history_overlaps(endpoint: str, since: float, until: float) -> tuple[int, int]:
    """(regions, overlapping pairs) per GPU in the arbiter's own history for [since, until]."""
    from krex_lab import client, protocol

    conn = client.Connection(endpoint)
    try:
        rows = conn.call(protocol.History(limit=100000, since=since)).get("rows", [])
    finally:
        conn.close()
    rows = [r for r in rows if r.get("granted_at") and r["granted_at"] <= until and r.get("outcome") == "completed"]
    bad = 0
    for g in {r["gpu"] for r in rows}:
        bad += overlaps([(r["granted_at"], r["released_at"]) for r in rows if r["gpu"] == g])
    return len(rows), bad


def summarise(
    point: dict[str, Any],
    start_at: float,
    measure_from: float,
    until: float,
    codes: list[int],
    starts: list[tuple[int, int]],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    in_window = [r for r in records if measure_from <= r["done"] <= until]
    timed = [r for r in in_window if r.get("median_ms") is not None]
    regions = [r["region"] for r in records if r.get("region")]
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for reg in regions:
        by_gpu.setdefault(reg["gpu"], []).append((reg["granted"], reg["released"]))
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    done_keys = [(r["agent"], r["seq"]) for r in records]
    window = until - measure_from
    queued = [r["eval_started"] - r["sent"] for r in records if r.get("eval_started")]
    out = {
        **point,
        "start_at": start_at,
        "measure_from": measure_from,
        "until": until,
        "agent_exit_codes": codes,
        "evaluations_started": len(starts),
        "evaluations_returned": len(records),
        "returned_exactly_once": sorted(done_keys) == sorted(starts) and len(set(done_keys)) == len(done_keys),
        "evaluations_in_window": len(in_window),
        "evals_per_min": round(len(in_window) * 60.0 / window, 2),
        "timed_in_window": len(timed),
        "timed_per_min": round(len(timed) * 60.0 / window, 2),
        "statuses": statuses,
        "wrong_on_purpose_passed": sum(1 for r in records if r["wrong_on_purpose"] and r["status"] == "ok"),
        # sent -> started where it runs: the wait for a warm worker (or a cold process's start)
        "queue_s_median": round(statistics.median(queued), 3) if queued else None,
        "correct_failed": sum(1 for r in records if not r["wrong_on_purpose"] and r["status"] != "ok"),
        **agent_reference.point_errors(records),
        "region_overlaps": sum(overlaps(v) for v in by_gpu.values()),
        "regions": {
            "n": len(regions),
            "wait_s_mean": statistics.fmean(x["wait_s"] for x in regions),
            "acquire_s_mean": statistics.fmean(x["acquire_s"] for x in regions),
            "hold_s_mean": statistics.fmean(x["hold_s"] for x in regions),
            "wait_s_p95": percentile([x["wait_s"] for x in regions], 0.95),
            "degraded": sum(1 for x in regions if x["degraded"]),
            # where the acquire and the release went, step by step (medians, ms)
            "steps_ms_median": {
                k: round(statistics.median(v) * 1e3, 3)
                for k in ak.STEPS
                if (v := [x["steps"][k] for x in regions if k in x["steps"]])
            },
        }
        if regions
        else None,
        "records": records,
    }
    return out
