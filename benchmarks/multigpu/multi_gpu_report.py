"""What ``multi_gpu.py`` makes of its measurements: statistics, inflation against alone, the targets
and the printed tables."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "regions"))  # fidelity's harness and roles
from fidelity import stats
from fidelity_roles import CLASSES

TIMED = [c for c in CLASSES if c[0] in ("0.1ms", "1ms")]
T_START = time.monotonic()


class Terminated(Exception):
    """SIGTERM (device_run.sh's timeout): stop, clean up, and still write what was measured."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated("SIGTERM: the run was stopped from outside (a timeout?)")


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T_START:6.1f} s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# orchestrator (no CUDA context of its own)
# ---------------------------------------------------------------------------------------------


TARGETS = {"0.1ms": 3.90, "1ms": 1.58}  # p95 inflation inside a region, % (the NVIDIA issue's)


def measured(reply: dict[str, Any]) -> dict[str, Any]:
    """A victim's measure reply -> per class and method: stats (samples kept apart under ``_samples``)."""
    res = reply["results"]
    return {
        "t0": reply["t0"],
        "t1": reply["t1"],
        "in_region": reply.get("in_region", False),
        "results": {
            cls: {
                m: {**stats(r["samples_ms"]), **{k: v for k, v in r.items() if k != "samples_ms"}}
                for m, r in per.items()
            }
            for cls, per in res.items()
        },
        "_samples": {cls: {m: r["samples_ms"] for m, r in per.items()} for cls, per in res.items()},
    }


def add_inflation(entry: dict[str, Any], base: dict[str, Any]) -> None:
    for cls, per in entry["results"].items():
        for m, st in per.items():
            ref = base["results"].get(cls, {}).get(m)
            if ref:
                st["p95_inflation_pct"] = round((st["p95_ms"] / ref["p95_ms"] - 1) * 100, 3)
                st["median_inflation_pct"] = round((st["median_ms"] / ref["median_ms"] - 1) * 100, 3)


def within_targets(entry: dict[str, Any]) -> dict[str, bool]:
    return {
        f"{cls}/{m}": st.get("p95_inflation_pct", float("inf")) <= TARGETS[cls]
        for cls, per in entry["results"].items()
        for m, st in per.items()
        if cls in TARGETS
    }


def coverage(interval: tuple[float, float], holds: list[tuple[float, float]]) -> float:
    """Fraction of ``interval`` covered by the (disjoint) ``holds``."""
    a, b = interval
    covered = sum(max(0.0, min(b, h1) - max(a, h0)) for h0, h1 in holds)
    return covered / (b - a) if b > a else 0.0


def _cell(st: dict[str, Any] | None, with_infl: bool) -> str:
    if not st:
        return f"{'-':^26}"
    infl = f"({st['p95_inflation_pct']:+.2f}%)" if with_infl and "p95_inflation_pct" in st else ""
    return f"{st['median_ms']:.4f}/{st['p95_ms']:.4f} {infl:>9}".rjust(26)


def _rows(prefix: str, columns: list[tuple[dict[str, Any], bool]]) -> None:
    """A line per timed class and method, a cell per column (results by class; with inflation or not)."""
    for cls, _ in TIMED:
        for m in ("launch", "graph"):
            cells = " | ".join(_cell(res.get(cls, {}).get(m), infl) for res, infl in columns)
            print(f"{prefix}{cls:>6} {m:>6} | {cells}")


def print_table(doc: dict[str, Any]) -> None:
    sim = "  [SIMULATED]" if doc.get("simulated") else ""
    print(
        f"\n== multi_gpu{sim}: median/p95 per kernel in ms, (p95 inflation vs alone); targets "
        f"{', '.join(f'{c} <= {t}%' for c, t in TARGETS.items())}"
    )
    a = doc.get("A")
    if a:
        print(
            f"A  placement via {a['method']}"
            + (" (FALLBACK: not the kernel provisioner)" if a["method"] == "attach" else "")
            + ":"
        )
        for k in a["placed"]:
            print(
                f"   pid {k['pid']}: GPU {k['gpu']}  KREX_GPU={k.get('krex_gpu', '-')}  "
                f"CUDA_VISIBLE_DEVICES={k.get('cuda_visible_devices', '-')}  {'ok' if k['env_ok'] else 'MISMATCH'}"
            )
    b = doc.get("B")
    if b:
        v1 = doc["victims"]["gpu1"]["pid"]
        print(f"B  {len(b['regions'])} regions on GPU 0 ({b['hold_s']} s each), GPU-1 victim pid {v1}:")
        for r in b["regions"]:
            print(
                f"   {r['region']}: locked {len(r['locked'])} frozen {len(r['frozen'])} moved {r['moved']} "
                f"cores {r['cores']} acquire {r.get('acquire_s', 0) * 1e3:.1f} ms; victim1 in moved "
                f"{v1 in r['moved']}, in frozen/locked {v1 in r['frozen'] + r['locked']}"
            )
        during = b["gpu1_victim_during"]
        print(f"   GPU-1 victim (measured with {during['region_coverage']:.0%} of its time under GPU-0 regions):")
        print(f"   {'class':>6} {'method':>6} | {'alone':^26} | {'during GPU-0 regions':^26} | {'alone after':^26}")
        after = doc.get("alone_after", {}).get("gpu1", {}).get("results", {})
        _rows("   ", [(doc["alone"]["gpu1"]["results"], False), (during["results"], True), (after, True)])
    c = doc.get("C")
    if c and c.get("regions"):
        r0, r1 = c["regions"]["gpu0"], c["regions"]["gpu1"]
        print(
            f"C  regions at once: GPU0 {r0['region']} cores {r0['cores']} frozen {len(r0['frozen'])} locked "
            f"{len(r0['locked'])}; GPU1 {r1['region']} cores {r1['cores']} frozen {len(r1['frozen'])} locked "
            f"{len(r1['locked'])}; holds overlapped {c['overlap_s']:.2f} s; {c['cpu_busy_loops']} CPU busy loops"
        )
        for g in (0, 1):
            key = f"gpu{g}"
            after = doc.get("alone_after", {}).get(key, {}).get("results", {})
            print(
                f"   GPU {g} victim: {'class':>6} {'method':>6} | {'alone':^26} | {'contended':^26} | "
                f"{'inside region':^26} | {'alone after':^26}"
            )
            contended = c["contended"].get(key, {}).get("results", {})
            inside = c["krex"].get(key, {}).get("results", {})
            columns = [(doc["alone"][key]["results"], False), (contended, True), (inside, True), (after, True)]
            _rows(f"   {'':13} ", columns)
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in doc.get("checks", {}).items()))
    if "error" in doc:
        print(f"stopped early: {doc['error']}")
    print("PASSED" if doc.get("passed") else "NOT PASSED")
