"""Throughput of concurrent kernel-optimisation agents: region-granular vs command-granular exclusivity.

    python benchmarks/throughput.py [--backend fake|nvidia] [--agents 8] [--seconds 40]

Each agent repeats a "command" the way an LLM agent's candidate evaluation goes: a *prepare*
phase (waiting on the model, compiling, checking correctness: ``--prepare`` seconds, a sleep
plus, on a GPU, a small correctness kernel) and a *timing* phase (``--timing`` seconds of
kernels; on the fake backend a sleep). Three modes, each for ``--seconds`` with every agent
running:

* ``command``: the whole command inside ``krex_lab.exclusive()`` (command-granular, the
  baseline the paper compares with);
* ``region``: only the timing phase inside ``exclusive()`` (KREX);
* ``none``: no exclusivity at all (throughput bound, timings unprotected).

Reports completed commands per minute per mode and the ratio region/command. The agents are
real processes registered with a real arbiter; on the fake backend the GPU phases are
simulated (sleeps) and the JSON says so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, machine, write_result

AGENT = r"""
import json, os, sys, time, krex_lab
mode, gpu = sys.argv[1], sys.argv[5] == "1"
prepare, timing, until = (float(x) for x in sys.argv[2:5])
start = until - float(sys.argv[6])
krex_lab.attach(gpu=0, name="agent")
if gpu:
    import torch
    a = torch.randn(2048, 2048, device="cuda"); torch.cuda.synchronize()
def prep():
    time.sleep(prepare * 0.8)
    if gpu:
        t = time.time() + prepare * 0.2
        while time.time() < t:
            (a @ a).sum().item()
    else:
        time.sleep(prepare * 0.2)
def timed():
    if gpu:
        t = time.time() + timing
        while time.time() < t:
            a @ a
        torch.cuda.synchronize()
    else:
        time.sleep(timing)
done = 0
waits = []
time.sleep(max(0.0, start - time.time()))  # a common start line for every agent
while time.time() < until:
    if mode == "command":
        t0 = time.time()
        with krex_lab.exclusive(gpu=0):
            waits.append(time.time() - t0); prep(); timed()
    elif mode == "region":
        prep(); t0 = time.time()
        with krex_lab.exclusive(gpu=0):
            waits.append(time.time() - t0); timed()
    else:
        prep(); timed()
    if time.time() <= until:
        done += 1
print(json.dumps({"done": done, "mean_wait_s": sum(waits) / len(waits) if waits else 0.0}), flush=True)
"""


def run_mode(env: dict[str, str], mode: str, args: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    until = time.time() + 3 + args.seconds  # every agent has attached well before the 3 s are up
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                AGENT,
                mode,
                str(args.prepare),
                str(args.timing),
                str(until),
                str(int(gpu)),
                str(args.seconds),
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(args.agents)
    ]
    out = [json.loads(a.communicate(timeout=args.seconds + 120)[0].strip().splitlines()[-1]) for a in agents]
    done = sum(o["done"] for o in out)
    return {
        "mode": mode,
        "commands": done,
        "per_minute": round(done * 60 / args.seconds, 2),
        "mean_wait_s": round(sum(o["mean_wait_s"] for o in out) / len(out), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="fake", choices=["fake", "nvidia"])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--seconds", type=float, default=40.0, help="measured time per mode")
    p.add_argument("--prepare", type=float, default=1.5, help="seconds of prepare per command")
    p.add_argument("--timing", type=float, default=0.5, help="seconds of timed kernels per command")
    p.add_argument("--modes", default="command,region,none")
    args = p.parse_args()
    gpu = args.backend == "nvidia"
    runtime = Path(tempfile.mkdtemp(prefix="krex-throughput-"))
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": f"ipc://{runtime}/arbiter.sock",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    arbiter = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", args.backend], env=env, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while not (runtime / "arbiter.sock").exists():
            if arbiter.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the arbiter did not start")
            time.sleep(0.05)
        results = []
        for mode in args.modes.split(","):
            r = run_mode(env, mode, args, gpu)
            results.append(r)
            print(
                f"{mode:8s}: {r['commands']:4d} commands in {args.seconds:.0f} s = {r['per_minute']:.1f}/min, "
                f"mean wait for a region {r['mean_wait_s']:.3f} s",
                flush=True,
            )
    finally:
        arbiter.send_signal(signal.SIGTERM)
        arbiter.wait(15)
    by = {r["mode"]: r for r in results}
    ratio = (
        (by["region"]["commands"] / by["command"]["commands"])
        if by.get("command", {}).get("commands") and "region" in by
        else None
    )
    if ratio is not None:
        print(
            f"region-granular / command-granular throughput: {ratio:.2f}x "
            f"(ideal bound here: min(agents, (prepare+timing)/timing) = "
            f"{min(args.agents, (args.prepare + args.timing) / args.timing):.2f}x)"
        )
    write_result(
        f"throughput-{args.backend}",
        {
            "benchmark": "throughput",
            "backend": args.backend,
            "simulated_gpu_phases": not gpu,
            "machine": machine(),
            "command": " ".join(sys.argv),
            "agents": args.agents,
            "seconds": args.seconds,
            "prepare_s": args.prepare,
            "timing_s": args.timing,
            "results": results,
            "ratio_region_over_command": ratio,
        },
    )


if __name__ == "__main__":
    main()
