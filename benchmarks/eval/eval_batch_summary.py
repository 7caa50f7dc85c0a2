"""eval_batch.py's summary of a run: the wall ratio (with and without the pool's start), runtime
deviations against KernelBench's way, regions and their degraded reasons, admission by GPU memory,
and each evaluation's timing figures, as the JSON's ``summary`` has them."""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import percentile


def runtime_of(rec: dict[str, Any] | None) -> float | None:
    """A correct result's runtime (µs), else None."""
    if not rec or not rec.get("correctness") or float(rec.get("runtime") or -1) <= 0:
        return None
    return float(rec["runtime"])


def deviations(base: dict[str, Any], other: dict[str, Any], long_us: float) -> dict[str, Any]:
    """|other/base - 1| in percent over the pairs both timed whose base runtime is over ``long_us``."""
    devs = {}
    for pid, b in base.items():
        rb, ro = runtime_of(b), runtime_of(other.get(pid))
        if rb is not None and ro is not None and rb > long_us:
            devs[pid] = (ro / rb - 1.0) * 100.0
    mags = [abs(x) for x in devs.values()]
    return {
        "n": len(devs),
        "median_abs_pct": statistics.median(mags) if mags else None,
        "p95_abs_pct": percentile(mags, 0.95) if mags else None,
        "max_abs_pct": max(mags) if mags else None,
        "per_pair_pct": devs,
    }


def regions_of(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    parts = [part for recs in results.values() for r in recs for part in (r.get("regions") or [])]
    regions = [p["region"] for p in parts if p.get("region")]
    degraded = [r for r in regions if r.get("degraded")]
    reasons: dict[str, int] = {}
    for r in degraded:
        whys = [f"not drained: {w}" for w in (r.get("not_drained") or {}).values()] + list(r.get("failures") or [])
        for why in whys or ["degraded, no reason given"]:
            key = re.sub(r"\b\d{2,}\b", "N", str(why))[:160]  # pids and figures apart: one key per reason
            reasons[key] = reasons.get(key, 0) + 1
    return {
        "timed_parts": len(parts),
        "in_regions": len(regions),
        "degraded": len(degraded),
        "degraded_evaluations": sum(
            1
            for recs in results.values()
            for r in recs
            if any((p.get("region") or {}).get("degraded") for p in r.get("regions") or [])
        ),
        "degraded_reasons": reasons,
        "cached_reference_parts": sum(1 for p in parts if p.get("cached")),
    }


def timing_of(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The judge's calibrated round trip in every evaluation (it stays near a quiet GPU's when
    the calibration is in the region) and how many verdicts used the outside figure."""
    metas = [r.get("metadata") or {} for recs in results.values() for r in recs]
    trips = [float(x) for m in metas for x in (m.get("timing_roundtrip_us") or [])]
    return {
        "roundtrip_us": {
            "n": len(trips),
            "median": statistics.median(trips) if trips else None,
            "max": max(trips) if trips else None,
        },
        "outside_figure_used": sum(1 for m in metas if "timing_bound" in m),
    }


def per_evaluation(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each pair's verdict, phases, admission and every timing_* figure the judge reported."""
    out: dict[str, Any] = {}
    for pid, recs in results.items():
        if not recs:
            continue
        r = recs[0]
        meta = r.get("metadata") or {}
        out[pid] = {
            "verdict": r.get("verdict"),
            "wall_s": r.get("wall_s"),
            "phases": r.get("phases"),
            "admission": meta.get("admission"),
            "memory": meta.get("memory"),
            **{k: v for k, v in meta.items() if k.startswith("timing_") or k in ("spare_wait_s",)},
        }
    return out


def summarise(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    base, krex = result["baseline"], result["krex"]
    firsts = {pid: recs[0] for pid, recs in krex["results"].items() if recs}
    long_us = args.long_ms * 1000.0
    summary: dict[str, Any] = {
        "pairs": len(result["pairs"]),
        "problems": len({p.split("/")[0] for p in result["pairs"]}),
        "kinds": {k: sum(1 for p in result["pairs"] if p.endswith("/" + k)) for k in args.kinds},
        "baseline_wall_s": base["wall_s"],
        "krex_wall_s": krex["wall_s"],
        "wall_ratio": base["wall_s"] / krex["wall_s"] if krex["wall_s"] > 0 else None,
        # the pool's start counted in: (a) waited for every worker, or began on the first (overlapped)
        "wall_ratio_with_pool_start": base["wall_s"]
        / (krex["wall_from_pool_start_s"] if krex.get("overlap_pool_start") else krex["wall_s"] + krex["pool_ready_s"]),
        "overlap_pool_start": bool(krex.get("overlap_pool_start")),
        "pool_ready_s": krex.get("pool_all_ready_s") or krex["pool_ready_s"],
        "pool_first_worker_s": krex.get("pool_first_worker_s"),
        "foreign_processes": krex.get("foreign_processes", []),
        "verdicts": dict(Counter(str(recs[0].get("verdict")) for recs in krex["results"].values() if recs)),
        "requeued_for_memory": sum(
            1
            for recs in krex["results"].values()
            if recs and ((recs[0].get("metadata") or {}).get("admission") or {}).get("attempts", 1) > 1
        ),
        "evaluations": per_evaluation(krex["results"]),
        "krex_results_per_pair": {pid: len(recs) for pid, recs in krex["results"].items()},
        "baseline_results_per_pair": {pid: r.get("results", 0) for pid, r in base["evals"].items()},
        "correct": {
            "baseline": sum(1 for r in base["evals"].values() if r.get("correctness")),
            "krex": sum(1 for r in firsts.values() if r.get("correctness")),
        },
        "verdicts_differ": sorted(
            pid
            for pid, r in base["evals"].items()
            if bool(r.get("correctness")) != bool(firsts.get(pid, {}).get("correctness"))
        ),
        "long_ms": args.long_ms,
        "deviation_krex_vs_baseline": deviations(base["evals"], firsts, long_us),
        "regions": regions_of(krex["results"]),
        "timing": timing_of(krex["results"]),
    }
    summary["exactly_one_result_each"] = all(n == 1 for n in summary["krex_results_per_pair"].values()) and all(
        n == 1 for n in summary["baseline_results_per_pair"].values()
    )
    if result.get("alone"):
        summary["deviation_alone_vs_baseline"] = deviations(base["evals"], result["alone"]["evals"], long_us)
    return summary


def report(s: dict[str, Any]) -> None:
    def dev(d: dict[str, Any]) -> str:
        if not d or not d["n"]:
            return "no pair to compare"
        pcts = f"median {d['median_abs_pct']:.2f}% p95 {d['p95_abs_pct']:.2f}% max {d['max_abs_pct']:.2f}%"
        return f"|dev| {pcts} (n={d['n']})"

    ratio = f"{s['wall_ratio']:.2f}x" if s["wall_ratio"] else "n/a"
    print(f"pairs {s['pairs']} over {s['problems']} problems, kinds {s['kinds']}")
    print(f"wall: (b) KernelBench way {s['baseline_wall_s']:.1f} s, (a) KREX {s['krex_wall_s']:.1f} s: {ratio}")
    print(
        f"      with the pool's start counted in (a): {s['wall_ratio_with_pool_start']:.2f}x "
        f"(pool ready in {s['pool_ready_s']:.1f} s, first worker in {s['pool_first_worker_s'] or 0:.1f} s)"
    )
    print(f"(a) verdicts {s['verdicts']}; requeued for memory: {s['requeued_for_memory']}")
    print(f"runtime > {s['long_ms']} ms, (a) vs (b): {dev(s['deviation_krex_vs_baseline'])}")
    if "deviation_alone_vs_baseline" in s:
        print(f"runtime > {s['long_ms']} ms, (b') alone vs (b): {dev(s['deviation_alone_vs_baseline'])}")
    print(
        f"correct: (b) {s['correct']['baseline']}, (a) {s['correct']['krex']}; verdicts differ: {s['verdicts_differ']}"
    )
    print(f"regions: {s['regions']}; one result per pair each way: {s['exactly_one_result_each']}")
    if "timing" in s:
        print(f"judge's round trip (us) and outside figures used: {s['timing']}")
