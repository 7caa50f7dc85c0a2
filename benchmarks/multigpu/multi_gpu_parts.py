"""Parts B and C of ``multi_gpu.py``, each a function of its run (a ``MultiGpu``: its processes,
its victims, its document and checks).

B. A region on GPU 0 touches only GPU 0, while GPU 1's victim times its kernels.
C. Two regions at once, one on each GPU, under contention on both.
"""

from __future__ import annotations

import time
from typing import Any

from fidelity_roles import MSG
from multi_gpu_report import add_inflation, coverage, measured, say, within_targets

#: what each part keeps of a region's report
REPORT = (
    "locked",
    "frozen",
    "moved",
    "drained",
    "cores",
    "not_drained",
    "degraded",
    "failures",
    "acquire_s",
    "hold_s",
    "lock_capable",
)


def part_b(run: Any) -> dict[str, Any]:
    say("B: regions on GPU 0 while GPU 1 works ...")
    run.start_hogs(0, True, run.cpu_hogs[0])
    run.start_hogs(1, False, 1)  # a GPU-1 process besides the victim: must keep running
    time.sleep(2.0)  # let time-slicing and clocks settle
    gpu0, gpu1 = run.pids_of(0), run.pids_of(1)
    holder = run.spawn("holder0", 0, "holder")
    ready = holder.read(60, MSG)
    holder.send({"cmd": "run", "hold_s": run.args.hold, "gap_s": 0.05, "watch": {**gpu0, **gpu1}})
    first = holder.read(60, MSG)
    if "granted" not in first:
        raise RuntimeError(f"holder: {first}")
    say(f"B: GPU-0 holder (pid {ready['pid']}) holds regions of {run.args.hold} s; GPU 1 victim measures ...")
    during = measured(run.one(1, {"cmd": "measure"}))
    holder.send({"cmd": "stop"})
    regions: list[dict[str, Any]] = []
    while True:
        msg = holder.read(120, MSG)
        if "done" in msg:
            break
        if "region" in msg and "report" in msg:
            regions.append(msg)
    holder.kill()
    run.children.remove(holder)
    add_inflation(during, run.doc["alone"]["gpu1"])
    during["region_coverage"] = round(
        coverage((during["t0"], during["t1"]), [(r["t_granted"], r["t_release_sent"]) for r in regions]), 3
    )
    rows = []
    for r in regions:
        rep = r["report"]
        cores = set(rep["cores"])
        rows.append(
            {
                "region": r["region"],
                "t_granted": r["t_granted"],
                "t_release_sent": r["t_release_sent"],
                **{k: rep[k] for k in REPORT if k in rep},
                "cpu_gain_s": r["cpu_gain_s"],
                "states": r["states"],
                "cpus_of": r["cpus_of"],
                "gpu1_off_reserved_cores": all(not cores & set(r["cpus_of"][n]) for n in gpu1),
            }
        )
    lockable = bool(regions and regions[0]["report"].get("lock_capable"))
    hold = run.args.hold
    run.checks.update(
        {
            "B_regions_taken": len(rows) >= 1,
            "B_gpu0_others_frozen": all(set(gpu0.values()) <= set(r["frozen"]) for r in rows),
            "B_gpu0_gpu_processes_locked": (not lockable)
            or all({gpu0["gpu0-hog"], gpu0["victim0"]} <= set(r["locked"]) for r in rows),
            "B_gpu0_frozen_gain_no_cpu": all(r["cpu_gain_s"][n] <= 0.01 + 0.02 * hold for r in rows for n in gpu0),
            "B_gpu1_not_frozen_or_locked": all(
                not set(gpu1.values()) & set(r["frozen"] + r["locked"] + r["drained"]) for r in rows
            ),
            "B_gpu1_moved": all(set(gpu1.values()) <= set(r["moved"]) for r in rows),
            "B_gpu1_kept_running": all(
                r["cpu_gain_s"]["gpu1-cpu-hog-0"] >= 0.25 * hold and r["states"]["victim1"] != "T" for r in rows
            ),
            "B_gpu1_off_reserved_cores": all(r["gpu1_off_reserved_cores"] for r in rows),
            "B_not_degraded": all(not r["degraded"] for r in rows),
            "B_measured_inside_regions": during["region_coverage"] >= 0.8,
        }
    )
    fid = within_targets(during)
    during["within_targets"] = fid
    if not run.simulated:
        run.checks["B_gpu1_within_alone"] = all(fid.values())
    say(
        f"B: {len(rows)} GPU-0 regions, coverage {during['region_coverage']:.0%}; GPU-1 victim moved, not "
        f"frozen: {run.checks['B_gpu1_moved'] and run.checks['B_gpu1_not_frozen_or_locked']}"
    )
    return {
        "hold_s": hold,
        "gap_s": 0.05,
        "pids": {"gpu0": gpu0, "gpu1": gpu1, "holder": ready["pid"]},
        "lock_capable": lockable,
        "regions": rows,
        "gpu1_victim_during": during,
    }


def part_c(run: Any) -> dict[str, Any]:
    say("C: regions on GPU 0 and GPU 1 at the same time, under contention on both ...")
    if not run.hogs[0]:
        run.start_hogs(0, True, run.cpu_hogs[0])
    have1 = sum(1 for n in run.hogs[1] if "cpu-hog" in n)
    run.start_hogs(1, True, max(0, run.cpu_hogs[1] - have1))
    time.sleep(2.0)
    gpu0, gpu1 = run.pids_of(0), run.pids_of(1)
    out: dict[str, Any] = {
        "pids": {"gpu0": gpu0, "gpu1": gpu1},
        "cpu_busy_loops": sum(1 for n in [*gpu0, *gpu1] if "cpu-hog" in n),
        "contended": {},
        "krex": {},
    }
    say("C: both victims contended (no region) ...")
    for g, r in run.both({"cmd": "measure"}).items():
        entry = measured(r)
        add_inflation(entry, run.doc["alone"][f"gpu{g}"])
        out["contended"][f"gpu{g}"] = entry
    say("C: both victims inside exclusive(gpu=i), at once ...")
    granted = run.both({"cmd": "acquire", "max_hold": 300.0}, 120)
    inside = run.both({"cmd": "measure"})
    released = run.both({"cmd": "release"}, 120)
    t_in = max(r["t_granted"] for r in granted.values())
    t_out = min(r["t_release_sent"] for r in released.values())
    regions = {}
    for g in (0, 1):
        entry = measured(inside[g])
        add_inflation(entry, run.doc["alone"][f"gpu{g}"])
        entry["within_targets"] = within_targets(entry)
        out["krex"][f"gpu{g}"] = entry
        rep = released[g]["report"]
        regions[f"gpu{g}"] = {
            "t_requested": granted[g]["t_requested"],
            "t_granted": granted[g]["t_granted"],
            "t_release_sent": released[g]["t_release_sent"],
            **{k: rep.get(k) for k in ("region", "gpu", *REPORT)},
        }
    out["regions"] = regions
    out["overlap_s"] = round(t_out - t_in, 3)
    r0, r1 = regions["gpu0"], regions["gpu1"]
    lockable = bool(r0["lock_capable"])
    c0, c1 = set(r0["cores"] or []), set(r1["cores"] or [])
    if run.cpus >= 3:
        cores_ok = bool(c0) and bool(c1) and not c0 & c1
    else:  # two cores: one region reserves the spare core, the other says it could not
        cores_ok = not c0 & c1 and (not c0 or not c1) and (r0["degraded"] if not c0 else r1["degraded"])
    measures_inside = all(t_in <= inside[g]["t0"] and inside[g]["t1"] <= t_out for g in (0, 1))
    run.checks.update(
        {
            "C_holds_overlap": t_in < t_out,
            "C_measurements_inside_both_holds": measures_inside,
            "C_gpu0_region_froze_only_gpu0": set(gpu0.values()) - {gpu0["victim0"]} <= set(r0["frozen"])
            and not set(gpu1.values()) & set(r0["frozen"]),
            "C_gpu1_region_froze_only_gpu1": set(gpu1.values()) - {gpu1["victim1"]} <= set(r1["frozen"])
            and not set(gpu0.values()) & set(r1["frozen"]),
            "C_locks_per_gpu": (not lockable)
            or (
                gpu0["gpu0-hog"] in r0["locked"]
                and gpu1["gpu1-hog"] in r1["locked"]
                and not set(gpu1.values()) & set(r0["locked"])
                and not set(gpu0.values()) & set(r1["locked"])
            ),
            "C_reserved_cores_disjoint": cores_ok,
        }
    )
    if not run.simulated:
        for g in (0, 1):
            run.checks[f"C_gpu{g}_within_targets"] = all(out["krex"][f"gpu{g}"]["within_targets"].values())
    say(f"C: holds overlapped {out['overlap_s']:.2f} s; cores GPU0 {sorted(c0)} / GPU1 {sorted(c1)}")
    return out
