"""Regions at scale: G fake GPUs x S sessions each, one holder per GPU cycling regions at once.

    python benchmarks/regions/scale.py                     # 8 GPUs x 64 sessions, 20 s, freeze on
    python benchmarks/regions/scale.py --gpus 2 --sessions 16 --seconds 5

Starts its own ``krex arbiter --backend fake --fake-gpus G`` on a private runtime dir. For each
GPU a registrar process starts S-1 sleeping children and registers a session for each (no
control channel: they are frozen, never asked to drain), and a holder process attaches to the
GPU and takes regions back to back (freeze on; ``--isolate`` to reserve cores too). Every
region of every GPU stops the GPU's S-1 siblings and continues them at release. Prints the
aggregate regions/s, per-GPU counts and acquire/release percentiles; writes
``benchmarks/out/scale-<date>.json``. The GPUs are simulated (fake backend): what is
measured is the arbiter's region sequence (queues, freeze and thaw of real processes, isolation)
under load, not GPU work.
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

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, percentile, private_arbiter, write_result

REGISTRAR = """
import subprocess, sys, time
import krex_lab.client
gpu, n = int(sys.argv[1]), int(sys.argv[2])
kids = [subprocess.Popen(["sleep", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
sessions = [krex_lab.client.Session(gpu=gpu, pid=k.pid, name=f"sibling-{gpu}", control=False) for k in kids]
print("ready", flush=True)
sys.stdin.read()
for k in kids:
    k.kill()
"""

HOLDER = """
import json, sys, time, krex_lab
gpu, seconds, isolate, start_at = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
krex_lab.attach(gpu=gpu, name=f"scale-holder-{gpu}")
print("ready", flush=True)
while time.time() < start_at:
    time.sleep(0.001)
rows = []
cpu0 = time.process_time()
end = time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    region = krex_lab.exclusive(gpu=gpu, isolate=isolate)
    region.acquire()
    t1 = time.perf_counter()
    region.release()
    t2 = time.perf_counter()
    rows.append([t1 - t0, t2 - t1, len(region.report.get("frozen", []))])
print(json.dumps({"rows": rows, "cpu": time.process_time() - cpu0}), flush=True)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--sessions", type=int, default=64, help="sessions per GPU, the holder included")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--isolate", action="store_true", help="reserve cores in every region too")
    p.add_argument("--shield", default="sessions", help="the arbiter's --Arbiter.shield (with --isolate)")
    p.add_argument("--cgroups", default="off", choices=["off", "auto"], help="the arbiter's --Arbiter.cgroups")
    p.add_argument(
        "--arbiter-option",
        action="append",
        default=[],
        metavar="OPT",
        help="one more option for the arbiter (repeatable), e.g. --arbiter-option=--Arbiter.history_db=",
    )
    args = p.parse_args()
    total = args.gpus * args.sessions
    arbiter, env = private_arbiter(
        "krex-scale-",
        "--backend",
        "fake",
        "--fake-gpus",
        str(args.gpus),
        f"--Quotas.sessions_per_user={total + 16}",
        f"--Arbiter.shield={args.shield}",
        f"--Arbiter.cgroups={args.cgroups}",
        *args.arbiter_option,
    )
    registrars: list[subprocess.Popen[str]] = []
    holders: list[subprocess.Popen[str]] = []
    try:
        for g in range(args.gpus):
            r = subprocess.Popen(
                [sys.executable, "-c", REGISTRAR, str(g), str(args.sessions - 1)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            registrars.append(r)
        for r in registrars:
            assert r.stdout is not None and r.stdout.readline().startswith("ready"), "a registrar failed"
        start_at = time.time() + 2.0 + 0.3 * args.gpus
        for g in range(args.gpus):
            h = subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(g), str(args.seconds), str(int(args.isolate)), str(start_at)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            holders.append(h)
        per_gpu: list[list[list[float]]] = []
        holder_cpu = 0.0
        for h in holders:
            assert h.stdout is not None and h.stdout.readline().startswith("ready"), "a holder failed"
        # The arbiter's own CPU time over the run: on a 2-core machine shared with 16 client
        # processes, regions/s swings by a third from run to run; CPU per region much less.
        time.sleep(max(0.0, start_at - time.time()))
        cpu0 = psutil.Process(arbiter.pid).cpu_times()
        for h in holders:
            out, _ = h.communicate(timeout=args.seconds + 120)
            done = json.loads(out.strip().splitlines()[-1])
            per_gpu.append(done["rows"])
            holder_cpu += done["cpu"]
        cpu1 = psutil.Process(arbiter.pid).cpu_times()
        arbiter_user, arbiter_sys = cpu1.user - cpu0.user, cpu1.system - cpu0.system
        arbiter_cpu = arbiter_user + arbiter_sys
    finally:
        for r in registrars:  # end of input: each registrar kills its sleeping children
            if r.stdin is not None:
                r.stdin.close()
        for proc in [*holders, *registrars]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        arbiter.send_signal(signal.SIGTERM)
        try:
            arbiter.wait(15)
        except subprocess.TimeoutExpired:  # said, and never left running (nor holding our stdout)
            print(f"the arbiter (pid {arbiter.pid}) did not stop on SIGTERM within 15 s: killed", file=sys.stderr)
            arbiter.kill()
            arbiter.wait()
    counts = [len(rows) for rows in per_gpu]
    acquire = [r[0] * 1e3 for rows in per_gpu for r in rows]
    release = [r[1] * 1e3 for rows in per_gpu for r in rows]
    frozen = sorted({int(r[2]) for rows in per_gpu for r in rows})
    rate = sum(counts) / args.seconds
    result: dict[str, Any] = {
        "gpus": args.gpus,
        "sessions_per_gpu": args.sessions,
        "seconds": args.seconds,
        "isolate": args.isolate,
        "shield": args.shield,
        "arbiter_options": args.arbiter_option,
        "regions": sum(counts),
        "regions_per_s": round(rate, 1),
        "per_gpu": counts,
        "frozen_per_region": frozen,
        "acquire_p50_ms": round(percentile(acquire, 0.5), 3),
        "acquire_p99_ms": round(percentile(acquire, 0.99), 3),
        "release_p50_ms": round(percentile(release, 0.5), 3),
        "release_p99_ms": round(percentile(release, 0.99), 3),
        "arbiter_cpu_s": round(arbiter_cpu, 3),
        "arbiter_user_s": round(arbiter_user, 3),
        "arbiter_sys_s": round(arbiter_sys, 3),
        "arbiter_cpu_ms_per_region": round(1e3 * arbiter_cpu / max(1, sum(counts)), 3),
        # the holders' own CPU (the client library's share of the machine)
        "holder_cpu_ms_per_region": round(1e3 * holder_cpu / max(1, sum(counts)), 3),
    }
    print(
        f"{args.gpus} GPUs x {args.sessions} sessions, freeze on, isolate {'on' if args.isolate else 'off'}: "
        f"{sum(counts)} regions in {args.seconds:.0f} s = {rate:.0f} regions/s (per GPU {counts}); "
        f"frozen per region {frozen}; acquire p50 {result['acquire_p50_ms']:.2f} ms "
        f"p99 {result['acquire_p99_ms']:.2f} ms, release p50 {result['release_p50_ms']:.2f} ms; "
        f"arbiter CPU {result['arbiter_cpu_ms_per_region']:.2f} ms a region "
        f"({100 * arbiter_sys / max(arbiter_cpu, 1e-9):.0f}% in the kernel), the holder's "
        f"{result['holder_cpu_ms_per_region']:.2f} ms"
    )
    write_result(
        "scale",
        {
            "benchmark": "scale",
            "backend": "fake",
            "simulated": True,
            "machine": machine(),
            "command": " ".join(sys.argv),
            "result": result,
            "target": ">= 200 regions/s in aggregate with freeze on (8 GPUs x 64 sessions)",
        },
    )


if __name__ == "__main__":
    main()
