"""Acquire + release round trip of a region, p50 and p99, against the number of sibling sessions.

    python benchmarks/regions/arbiter_latency.py                       # fake backend, 0/4/16 idle siblings
    python benchmarks/regions/arbiter_latency.py --backend nvidia --cuda --counts 0,3,15 --modes idle,busy

Starts its own arbiter (a real ``krex arbiter`` process on a private runtime dir), N sibling
sessions on GPU 0 (idle: asleep; busy: spinning on the CPU, or with ``--cuda`` looping 4096^2
matmuls on the GPU) and a separate holder process (siblings must not be in the holder's
process tree, which a region exempts) that takes ``--rounds`` regions with freeze and isolate
on. Every round's acquire, release and total times come back to this process; the JSON holds
p50/p99 per configuration with the machine and date.

Rounds come back to back, so each region adopts the shield its predecessor left lingering
(``Arbiter.shield_linger``; the JSON counts them, ``adopted``): the cost of a timing loop of
regions. ``--gap 0.1`` waits out the linger before every round: the cost of a region on its own.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, percentile, private_arbiter, write_result

SIBLING = """
import sys, time, krex_lab
cuda, busy, control = sys.argv[1] == "1", sys.argv[2] == "1", sys.argv[3] == "1"
if cuda:
    import torch
    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
if control:
    krex_lab.attach(gpu=0, name="latency-sibling")
else:  # registered, but without a control channel: frozen, never asked to drain
    import krex_lab.client
    keep = krex_lab.client.Session(gpu=0, name="latency-sibling", control=False)
print("ready", flush=True)
i = 0
while True:
    if not busy:
        time.sleep(3600)
    elif cuda:
        y = x @ x
        i += 1
        if i % 8 == 0:
            torch.cuda.synchronize()
    else:
        pass
"""

HOLDER = """
import json, sys, time, krex_lab
rounds, gap = int(sys.argv[1]), float(sys.argv[2])
krex_lab.attach(gpu=0, name="latency-holder")
for _ in range(3):
    with krex_lab.exclusive(gpu=0):
        pass
out = []
for _ in range(rounds):
    time.sleep(gap)
    t0 = time.perf_counter()
    region = krex_lab.exclusive(gpu=0)
    region.acquire()
    t1 = time.perf_counter()
    region.release()
    t2 = time.perf_counter()
    r = region.report.to_dict()
    # The arbiter's own step times (acquire_s, drain_s, drain_list_s, ..., unlock_s, undo_s).
    row = {k[:-2]: v for k, v in r.items() if k.endswith("_s") and isinstance(v, float) and k != "max_hold_s"}
    row.update(client_acquire=t1 - t0, client_release=t2 - t1, round_trip=t2 - t0, frozen=len(r.get("frozen", [])))
    row["adopted"] = r.get("shield", {}).get("adopted", "")
    out.append(row)
print(json.dumps(out), flush=True)
"""


def run_config(
    env: dict[str, str], n: int, busy: bool, cuda: bool, rounds: int, control: bool, gap: float = 0.0
) -> dict[str, Any]:
    args = [str(int(cuda)), str(int(busy)), str(int(control))]
    siblings = [
        subprocess.Popen([sys.executable, "-c", SIBLING, *args], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    try:
        for s in siblings:
            assert s.stdout is not None and s.stdout.readline().startswith("ready")
        time.sleep(0.5 if busy else 0.1)
        holder = subprocess.run(
            [sys.executable, "-c", HOLDER, str(rounds), str(gap)], env=env, capture_output=True, text=True, timeout=600
        )
        if holder.returncode != 0:
            raise RuntimeError(holder.stderr)
        rows = json.loads(holder.stdout.strip().splitlines()[-1])
    finally:
        for s in siblings:
            s.send_signal(signal.SIGCONT)
            s.kill()
            s.wait()
    # Client-side figures keep their old names (acquire, release); the arbiter's acquire is arbiter_acquire.
    rename = {"client_acquire": "acquire", "client_release": "release", "acquire": "arbiter_acquire"}
    steps = [k for k in rows[0] if k not in ("frozen", "adopted", "wait", "hold") and all(k in r for r in rows)]
    ms = {rename.get(k, k): [r[k] * 1e3 for r in rows] for k in steps}
    result: dict[str, Any] = {
        "siblings": n,
        "mode": "busy" if busy else "idle",
        "cuda_siblings": cuda,
        "cooperative_siblings": control,
        "rounds": rounds,
        "gap_s": gap,
        # how many regions took over the shield of the one before (Arbiter.shield_linger)
        "adopted": sum(bool(r["adopted"]) for r in rows),
        "frozen_per_region": rows[-1]["frozen"],
    }
    for k, xs in ms.items():
        result[f"{k}_p50_ms"] = round(percentile(xs, 0.5), 4)
        result[f"{k}_p99_ms"] = round(percentile(xs, 0.99), 4)
    return result


def undo_line(r: dict[str, Any]) -> str:
    """The arbiter's release steps, p50 (absent from results made before they were reported)."""
    parts = [f"{k} {r[k + '_p50_ms']:.2f}" for k in ("undo", "unisolate", "thaw", "unlock") if k + "_p50_ms" in r]
    return ", ".join(parts) or "steps not reported"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="fake", choices=["fake", "nvidia", "amd", "auto"])
    p.add_argument("--counts", default="0,4,16", help="sibling counts, comma-separated")
    p.add_argument("--modes", default="idle", help="idle,busy")
    p.add_argument("--cuda", action="store_true", help="siblings hold a CUDA context (torch)")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument(
        "--plain-siblings",
        action="store_true",
        help="siblings without a control channel (frozen but not asked to drain): the floor "
        "without the cooperative drain's round trips",
    )
    p.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds between one round's release and the next acquire; longer than the arbiter's "
        "shield_linger (0.05 s), every region makes its shield afresh (default 0: back to back, "
        "each region adopts the one before's)",
    )
    p.add_argument("--shield", default="", help="the arbiter's --Arbiter.shield (default: the arbiter's own)")
    p.add_argument(
        "--arbiter-option",
        action="append",
        default=[],
        metavar="--Arbiter.NAME=VALUE",
        help="passed on to the arbiter (repeatable), e.g. --arbiter-option=--Arbiter.lock_threads=1",
    )
    args = p.parse_args()
    arbiter, env = private_arbiter(
        "krex-latency-",
        "--backend",
        args.backend,
        *([f"--Arbiter.shield={args.shield}"] if args.shield else []),
        *args.arbiter_option,
    )
    try:
        from krex_lab import client

        arbiter_status = client.status(env["KREX_ENDPOINT"])["arbiter"]
        shield = arbiter_status.get("shield", args.shield)
        cgroups = arbiter_status.get("cgroups", "")
        results = []
        for mode in args.modes.split(","):
            for n in [int(c) for c in args.counts.split(",")]:
                r = run_config(env, n, mode == "busy", args.cuda, args.rounds, not args.plain_siblings, args.gap)
                results.append(r)
                print(
                    f"{n:3d} {mode:4s} siblings: round trip p50 {r['round_trip_p50_ms']:.2f} ms, "
                    f"p99 {r['round_trip_p99_ms']:.2f} ms (acquire p50 {r['acquire_p50_ms']:.2f} ms, "
                    f"frozen {r['frozen_per_region']}; drain {r['drain_p50_ms']:.2f}, "
                    f"freeze {r['freeze_p50_ms']:.2f}, isolate {r['isolate_p50_ms']:.2f}; release p50 "
                    f"{r['release_p50_ms']:.2f}: {undo_line(r)}; {r['adopted']}/{r['rounds']} adopted)",
                    flush=True,
                )
    finally:
        arbiter.send_signal(signal.SIGTERM)
        arbiter.wait(10)
    name = "-".join(
        ["arbiter_latency", args.backend]
        + ["cuda"] * args.cuda
        + ["plain"] * args.plain_siblings
        + ([f"gap{args.gap:g}"] if args.gap else [])
        + ([f"shield_{args.shield}"] if args.shield else [])
        + [o.lstrip("-").replace("Arbiter.", "").replace("=", "_") for o in args.arbiter_option]
    )
    write_result(
        name,
        {
            "benchmark": "arbiter_latency",
            "backend": args.backend,
            "machine": machine(),
            "command": " ".join(sys.argv),
            "shield": shield,
            "cgroups": cgroups,
            "results": results,
            "target": "p50 round trip under 3 ms with 16 siblings on the 2-core CI-class machine",
        },
    )


if __name__ == "__main__":
    main()
