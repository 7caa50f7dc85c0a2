"""A region's reserved core beside a neighbour who widens its affinity again (root, real users).

    sudo python benchmarks/regions/rewiden.py                  # 3 rounds, 2 s a region, every config
    sudo python benchmarks/regions/rewiden.py --rounds 5 --configs on-affinity,on-auto

Makes two users with ``useradd`` (removed after), starts a root ``krex arbiter --multi-user`` on
the fake backend for each configuration (``off-affinity``: guard_neighbours off, the affinity
shield, as before the watch; ``on-affinity``: the watch; ``on-auto``: the shield guard_neighbours
picks, a cpuset partition where the arbiter may make one), and times alice's loop in a region of
one reserved core beside one of mallory's busy loops per core: ``plain`` loops that never touch
their affinity, ``once`` loops that widen themselves again the first time they find themselves
narrowed, ``always`` loops that do so every time. Prints the holder's rate beside ``once`` and
``always`` as a share of its rate beside ``plain`` (medians over rounds, taken in turn), whether the
report said degraded and whom it named; writes ``benchmarks/results/rewiden-<date>.json``.
The goal: >= 85% beside re-wideners or a degraded report naming them; >= 95% on a cpuset shield.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/

from tests.security.helpers_arbiter import multi_user_arbiter
from tests.security.rewiden import MODES, region_beside
from tests.security.users import make_user

CONFIGS = {
    "off-affinity": ("--Arbiter.guard_neighbours=False", "--Arbiter.shield=affinity"),
    "on-affinity": ("--guard-neighbours", "--Arbiter.shield=affinity"),
    "on-auto": ("--guard-neighbours", "--Arbiter.shield=auto"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="the holder's timed loop in each region")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"among {', '.join(CONFIGS)}")
    args = p.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"rewiden.py: unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    results: dict[str, Any] = {}
    with make_user("krexalice") as alice, make_user("krexmal") as mallory:
        for config in configs:
            rows: list[dict[str, Any]] = []
            with multi_user_arbiter(*CONFIGS[config]) as arb:
                for _ in range(args.rounds):
                    row: dict[str, Any] = {}
                    for mode in MODES:
                        result, loops = region_beside(alice, mallory, arb, mode, args.seconds)
                        report = result["report"]
                        named = [i for i in report["shield"].get("intrusions", []) if i["pid"] in loops]
                        row[mode] = {
                            "rate": round(result["rate"], 1),
                            "degraded": report["degraded"],
                            "shield": report["shield"]["mode"],
                            "named": named,
                        }
                    rows.append(row)
            summary: dict[str, Any] = {"shield": rows[0]["plain"]["shield"], "rounds": rows}
            for mode in ("once", "always"):
                shares = [r[mode]["rate"] / r["plain"]["rate"] for r in rows]
                summary[f"{mode}_share_median"] = round(statistics.median(shares), 4)
                summary[f"{mode}_shares"] = [round(x, 4) for x in shares]
                caught = [bool(r[mode]["degraded"] and r[mode]["named"]) for r in rows]
                summary[f"{mode}_degraded_and_named"] = sum(caught)
            results[config] = summary
            print(
                f"{config} (shield {summary['shield']}): holder's rate beside loops that widen once "
                f"{summary['once_share_median']:.1%} of its rate beside plain loops "
                f"(rounds {[f'{x:.1%}' for x in summary['once_shares']]}, degraded and named in "
                f"{summary['once_degraded_and_named']}/{args.rounds}); beside loops that always widen "
                f"{summary['always_share_median']:.1%} (degraded and named in "
                f"{summary['always_degraded_and_named']}/{args.rounds})",
                flush=True,
            )
    write_result(
        "rewiden",
        {
            "benchmark": "rewiden",
            "backend": "fake",
            "machine": machine(),
            "command": " ".join(sys.argv),
            "seconds": args.seconds,
            "results": results,
            "target": ">= 85% of the rate beside re-wideners, or a degraded report naming them; >= 95% on cpuset",
        },
    )


if __name__ == "__main__":
    main()
