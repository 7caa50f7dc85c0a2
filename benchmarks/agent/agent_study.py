"""The paper's evaluation, reproduced: LLM-agent kernel optimisation on shared GPUs.

    python benchmarks/agent/agent_study.py [--backend fake|nvidia] [--gpus 1] [--agents 1,4,8,16,32]
        [--think-mean 0,8] [--think-sigma 0.6] [--modes command,region,none] [--launch warm,cold]
        [--seconds 30] [--warmup 10] [--cold-agents 4] [--cold-seconds 20] [--kernels ...]

Agents behave like kernel-optimising LLM agents. Each is a real process (``agent_loop.py``)
registered with a real ``krex arbiter`` as a session on its GPU (agent i on GPU i mod --gpus),
looping: **think** (the model's latency, drawn from a lognormal with mean ``--think-mean`` and
sigma ``--think-sigma``; a sleep, as waiting on a remote model is), **write** a candidate (a
new ``.py`` file: a kernel of ``krex_lab.kernels``, naive or optimised, or a parameter mutation of one
such as block size or tile shape; with probability ``--p-wrong`` one that is wrong on purpose,
see ``agent_kernels.SPACE``), **compile** it, **check** it with ``krex_lab.check`` and, if
correct, **time** it with ``krex_lab.bench``.

Modes (where the region is):
* ``command``: compile + check + time inside one ``krex_lab.exclusive`` region - the
  one-evaluation-per-GPU practice of KernelBench-style harnesses;
* ``region``: only the timing inside a region (KREX's region granularity);
* ``none``: no exclusivity at all.
Launch: ``cold`` = a new process per evaluation (``python agent_kernels.py eval``, as ``python
eval.py`` would; in command mode the agent holds the region around that process, which joins it
as ``krex exclusive -- python eval.py`` does); ``warm`` = ``krex_lab.submit`` to a pool of warm
context workers (``krex pool``, ``--workers`` per GPU, started here).

**Throughput is a steady state.** Every agent starts at one moment, runs ``--warmup`` seconds
unmeasured (queues form, think times spread out), then ``--seconds`` measured: a point's
evaluations per minute count the evaluations that *returned* inside the measured window.
(Counting from the start, in windows a few think times long, mostly measured the start: all
agents think at once, then all want the GPU at once; 2026-12-02, T0235.)

Before the sweep a **reference pass** evaluates every correct candidate alone
``--reference-repeats`` times on the warm workers, one evaluation at a time, and again after
the points (``--no-reference-after``: only before): every timed evaluation records its error
against the median of those alone runs, and the JSON says how far the passes lie apart
(``reference_drift_pct``) and how far one alone run lies from the reference
(``reference_spread_pct``: the floor under any error the study can show). See
``agent_reference.py``.

**Real**: the arbiter, its regions (queue, freeze of the other sessions of the GPU, core
isolation; on NVIDIA also the driver lock), the agent processes and their sessions, the pool
and its workers, the candidate source files, ``krex_lab.check`` and ``krex_lab.bench``, all
timestamps. On ``--backend nvidia`` the compile is numba.cuda's JIT, and Triton's for the
Triton candidates (``--compilers``; where Triton and torch are installed), and check and timing
run on the GPU. **Simulated on the fake backend** (said in the output and the JSON): numba's CUDA
simulator runs the kernels on the CPU (check and timing are real code and real measurements of
simulated kernels, at the tiny test sizes), and the compile phase is CPU work: a busy loop
until the evaluating process has used the CPU seconds drawn from a lognormal
(``--sim-compile-mean``/``--sim-compile-sigma``). Like a real JIT it competes for the machine's
cores (16 agents compiling on 2 cores take 8 times as long in wall time) and it stops while its
process is frozen by another region. The think time is a sleep on both backends (a remote model
call: it elapses even while its agent is frozen).

Outputs: ``benchmarks/out/agent_study-<backend>-<date>.json`` (machine, date, backend,
parameters, reference, per point its summary and every evaluation record with its region's
requested / granted / released times, wait, acquire and hold) and three PNGs next to it
(``…-throughput.png``, ``…-errors.png``, ``…-regions.png``); ``notebooks/04_agent_study.ipynb``
shows them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family; benchmarks/: common

import agent_kb  # noqa: E402
import agent_kernels as ak  # noqa: E402
import agent_plots  # noqa: E402 - matplotlib only when a figure is drawn
import agent_reference  # noqa: E402
from agent_summary import history_overlaps, summarise  # noqa: E402
from agent_world import World  # noqa: E402
from common import machine, write_result  # noqa: E402

from krex_lab.errors import KrexError  # noqa: E402


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="fake", choices=["fake", "nvidia"])
    p.add_argument("--gpus", type=int, default=1, help="GPUs the agents spread over (1 or 2)")
    p.add_argument("--agents", type=ints, default=[1, 4, 8, 16, 32], help="agent counts of the warm sweep")
    p.add_argument("--think-mean", type=floats, default=[0.0, 4.0], help="mean think times (s) to sweep")
    p.add_argument("--think-sigma", type=float, default=0.6, help="sigma of the lognormal think time")
    p.add_argument("--modes", default="command,region,none")
    p.add_argument(
        "--freeze",
        default="on",
        help="whether command and region points freeze the GPU's other sessions: on, off or on,off "
        "(both, as separate points; locks and the core shield stay either way)",
    )
    p.add_argument("--launch", default="warm,cold", help="warm (context workers) and/or cold (a process each)")
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per warm point")
    p.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="seconds every point runs before its measured window (evaluations returned then are not counted)",
    )
    p.add_argument("--cold-agents", type=int, default=4, help="agents of the cold vs warm comparison")
    p.add_argument("--cold-seconds", type=float, default=20.0, help="measured window of a cold point and its warm twin")
    p.add_argument(
        "--cold-think", type=float, default=None, help="think mean there (default: the last of --think-mean)"
    )
    p.add_argument("--cold-modes", default="command,region")
    p.add_argument("--kernels", default="", help="kernels of krex_lab.kernels the agents work on (default: all)")
    p.add_argument(
        "--kernelbench",
        action="store_true",
        help="agents submit KernelBench-format candidates of benchmarks/eval_problems through krex_lab.evaluate "
        "(agent_kb.py; modes region and none, warm; --kernels names problems)",
    )
    p.add_argument(
        "--compilers",
        default="numba,triton",
        help="what the candidates are written for: numba (numba.cuda JIT) and triton (where Triton, torch and a "
        "GPU are; said when left out)",
    )
    p.add_argument("--p-wrong", type=float, default=0.2, help="probability that a candidate is a wrong one")
    p.add_argument("--sim-compile-mean", type=float, default=1.0, help="fake backend: compile phase mean (s)")
    p.add_argument("--sim-compile-sigma", type=float, default=0.4)
    p.add_argument("--check-size", default=None, help="check size (default: 0.05ms preset; fake: test1)")
    p.add_argument("--time-size", default=None, help="timing size (default: 0.1ms preset; fake: test1)")
    p.add_argument("--bench-min-time", type=float, default=None, help="krex_lab.bench min_time (default its own)")
    p.add_argument(
        "--bench-warmup",
        type=float,
        default=None,
        help="krex_lab.bench warmup in seconds (default its own, 0.2 s): GPU time each evaluation spends "
        "outside its region, which region mode's throughput pays at 16 agents (the reference pass too)",
    )
    p.add_argument("--workers", type=int, default=0, help="warm workers per GPU (default: agents per GPU, <= 16)")
    p.add_argument("--max-hold", type=float, default=60.0)
    p.add_argument(
        "--pool-memory-slack-mb",
        type=int,
        default=None,
        help="the pool's Pool.memory_slack_mb (GPU memory a job may leave behind before its worker is "
        "recycled; default: the pool's own)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--use-arbiter", action="store_true", help="use the arbiter at $KREX_ENDPOINT (tests)")
    p.add_argument("--out", default="", help="write the JSON here instead of benchmarks/out/")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--reference-repeats", type=int, default=2, help="alone runs of each candidate per reference pass")
    p.add_argument(
        "--reference-after",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a second reference pass after the points; errors are then against the mean of both, and "
        "their drift is reported (what the GPU itself moved meanwhile)",
    )
    return p.parse_args(argv)


def bench_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.backend == "fake":
        opts.update(min_samples=5, max_samples=5)  # simulated kernels: a few host-clock samples
    if args.bench_min_time is not None:
        opts["min_time"] = args.bench_min_time
    if args.bench_warmup is not None:
        opts["warmup"] = args.bench_warmup
    return opts


def run_point(
    world: World, point: dict[str, Any], cands: list[ak.Candidate], workdir: Path, ref: dict[str, Any]
) -> dict[str, Any]:
    args = world.args
    check_size, time_size = agent_reference.sizes(args)
    logs = workdir / f"point{point['index']:02d}"
    logs.mkdir()
    start_at = time.time() + (3.0 if point["launch"] == "warm" else 2.0) + 0.05 * point["agents"]
    measure_from = start_at + args.warmup
    until = measure_from + point["seconds"]
    procs = []
    for i in range(point["agents"]):
        cfg = {
            "agent": i,
            "gpu": i % args.gpus,
            "mode": point["mode"],
            "launch": point["launch"],
            "seed": args.seed * 1000 + point["index"] * 100 + i,
            "candidates": [
                ak.candidate_dict(c) for c in cands if c.kernel == point["kernels"][i % len(point["kernels"])]
            ],
            "workdir": str(logs / f"agent{i}"),
            "log": str(logs / f"agent{i}.jsonl"),
            "start_at": start_at,
            "until": until,
            "think_mean": point["think_mean_s"],
            "think_sigma": args.think_sigma,
            "p_wrong": args.p_wrong,
            "sim_compile_mean": args.sim_compile_mean,
            "sim_compile_sigma": args.sim_compile_sigma,
            "check_size": check_size,
            "time_size": time_size,
            "bench": bench_options(args),
            "max_hold": args.max_hold,
            "freeze": point["freeze"],
            "kernelbench": args.kernelbench,
            **agent_kb.trials(args.backend),
        }
        path = logs / f"agent{i}.json"
        path.write_text(json.dumps(cfg))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "agent_loop.py"), str(path)], env=world.env))
    codes = [p.wait(timeout=point["seconds"] + 600) for p in procs]
    starts: list[tuple[int, int]] = []
    records: list[dict[str, Any]] = []
    tracebacks: dict[str, str] = {}  # the first of each distinct error (worker failures show here)
    for i in range(point["agents"]):
        path = logs / f"agent{i}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            ev = json.loads(line)
            if ev["event"] == "start":
                starts.append((i, ev["seq"]))
            else:
                tb = ev.pop("traceback", None)
                if tb and len(tracebacks) < 8:
                    tracebacks.setdefault(str(ev.get("error", ""))[:120], tb)
                agent_reference.score(ev, ref)
                records.append(ev)
    return {**summarise(point, start_at, measure_from, until, codes, starts, records), "tracebacks": tracebacks}


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    modes = [m for m in args.modes.split(",") if m]
    freezes = [{"on": True, "off": False}[x] for x in args.freeze.split(",") if x]
    launches = [x for x in args.launch.split(",") if x]
    everything = agent_kb.eval_set.problems() if args.kernelbench else sorted({c.kernel for c in ak.SPACE})
    kernels = [k for k in args.kernels.split(",") if k] or everything
    points: list[dict[str, Any]] = []
    if "warm" in launches:
        for think in args.think_mean:
            for agents in args.agents:
                for mode in modes:
                    for freeze in freezes if mode != "none" else [True]:
                        points.append(
                            {"launch": "warm", "mode": mode, "agents": agents, "think_mean_s": think, "freeze": freeze}
                        )
    if "cold" in launches:
        think = args.cold_think if args.cold_think is not None else args.think_mean[-1]
        for mode in [m for m in args.cold_modes.split(",") if m]:
            for launch in ("cold", "warm"):
                points.append(
                    {
                        "launch": launch,
                        "mode": mode,
                        "agents": args.cold_agents,
                        "think_mean_s": think,
                        "seconds": args.cold_seconds,
                        "compare_with_cold": launch == "warm",
                        "freeze": freezes[0],
                    }
                )
    for i, p in enumerate(points):
        p.setdefault("seconds", args.seconds)
        p.setdefault("compare_with_cold", False)
        p["index"] = i
        p["kernels"] = kernels
    return points


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    simulated = args.backend == "fake"
    if simulated:
        print(
            "agent_study: FAKE backend - the GPU phases are SIMULATED (numba's CUDA simulator runs the kernels "
            "on the CPU; the compile phase is CPU work of a drawn duration). Arbiter, regions, processes and "
            "timestamps are real.",
            flush=True,
        )
    points = plan(args)
    kernels = points[0]["kernels"] if points else []
    compilers = tuple(x for x in args.compilers.split(",") if x)
    if args.kernelbench:
        cands, compilers = agent_kb.setup(args, kernels)
    elif "triton" in compilers and (simulated or ak.triton_usable()):
        why = "the fake backend has no GPU" if simulated else ak.triton_usable()
        print(f"agent_study: no Triton candidates ({why})", flush=True)
        compilers = tuple(x for x in compilers if x != "triton")
    if not args.kernelbench:
        cands = ak.space(kernels, compilers)
    runtime = Path(tempfile.mkdtemp(prefix="krex-agents-"))
    runtime.chmod(0o700)
    workdir = runtime / "work"
    workdir.mkdir()
    world = World(args, runtime)
    if args.kernelbench:
        world.env.update(agent_kb.world_env(args.backend))
    t_start = time.time()
    result: dict[str, Any] = {
        "benchmark": "agent_study",
        "backend": args.backend,
        "simulated_gpu_phases": simulated,
        "simulated": "numba CUDA simulator for check and timing, compile = lognormal CPU time (a busy loop)"
        if simulated
        else "",
        "machine": machine(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "parameters": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "compilers": list(compilers),
        "candidates": [{**ak.candidate_dict(c), "id": c.id} for c in cands],
    }
    try:
        world.start_arbiter()
        warm = [p for p in points if p["launch"] == "warm"]
        per_gpu = max([-(-p["agents"] // args.gpus) for p in warm] or [1])
        workers = args.workers or min(16, per_gpu)
        preload = ["numba.cuda"] + (["torch", "triton"] if "triton" in compilers else [])
        if args.kernelbench:
            preload = ["torch", *preload]
        result["pool"] = {"workers_per_gpu": workers, "ready_s": round(world.start_pool(workers, preload), 1)}
        print(f"pool: {workers} warm workers per GPU ready in {result['pool']['ready_s']} s", flush=True)
        t0 = time.monotonic()
        if args.kernelbench:  # each evaluation carries its reference's time (agent_kb.py): no alone pass
            result["reference"], args.reference_after = {}, False
        else:
            result["reference"] = agent_reference.reference_pass(
                world, cands, workdir, bench_options(args), repeats=args.reference_repeats
            )
        result["reference_s"] = round(time.monotonic() - t0, 1)
        result["reference_recycled"] = world.recycled()
        print(
            f"reference pass: {len(result['reference'])} candidates alone, {args.reference_repeats} runs each, "
            f"on warm workers in {result['reference_s']} s; workers recycled: {result['reference_recycled']}",
            flush=True,
        )
        result["points"] = []
        signal.signal(signal.SIGTERM, _interrupt)  # `timeout` on the device: keep what was measured
        for p in points:
            try:
                s = run_point(world, p, cands, workdir, result["reference"])
                s["pool_recycled"] = world.recycled()
            except KeyboardInterrupt:
                result["interrupted"] = f"stopped before point {p['index']} ended"
                print(f"agent_study: INTERRUPTED during point {p['index']}; writing what was measured", flush=True)
                break
            result["points"].append(s)
            if os.environ.get("OUT"):  # a run killed outright still leaves the points it finished
                Path(os.environ["OUT"], f"agent_study-{args.backend}-partial.json").write_text(json.dumps(result))
            reg = s["regions"] or {}
            recycled = sum(v for v in s["pool_recycled"].values() if isinstance(v, int))
            print(
                f"{p['launch']:4s} {agent_plots.series(p):17s} agents {p['agents']:2d} "
                f"think {p['think_mean_s']:4.1f} s: "
                f"{s['evals_per_min']:6.1f} evals/min ({s['timed_per_min']:5.1f} timed), "
                f"{agent_reference.error_text(s)}, "
                f"wait {reg.get('wait_s_mean', 0):.2f} s hold {reg.get('hold_s_mean', 0):.2f} s, "
                f"overlaps {s['region_overlaps']}, returned once: {s['returned_exactly_once']}, "
                f"queue for a worker median {s['queue_s_median']} s, workers recycled {recycled}",
                flush=True,
            )
            if recycled * 10 > s["evaluations_returned"]:
                print(
                    f"    WARNING: the pool recycled a worker after {recycled} of {s['evaluations_returned']} "
                    "evaluations, and the agents waited for new ones: this throughput is the pool's",
                    flush=True,
                )
            for why, n in s["pool_recycled"].items():
                print(f"    recycled {n}x: {why}" if why != "left_mib" else f"    MiB left: {n}", flush=True)
        t_end = time.time()
        if args.reference_after and result["points"]:
            t0 = time.monotonic()
            after = agent_reference.reference_pass(
                world, cands, workdir, bench_options(args), "after", repeats=args.reference_repeats
            )
            result["reference_after_s"] = round(time.monotonic() - t0, 1)
            agent_reference.bracket(result, after)
            print(
                f"reference pass after the points: drift |after/before - 1| "
                f"median {result['reference_drift_pct']['median']} % p95 {result['reference_drift_pct']['p95']} %; "
                f"one alone run against the reference: |error| median {result['reference_spread_pct']['median']} % "
                f"p95 {result['reference_spread_pct']['p95']} %; errors against the median of every alone run:",
                flush=True,
            )
            for s in result["points"]:
                label = f"{s['launch']:4s} {agent_plots.series(s):17s} agents {s['agents']:2d}"
                print(agent_reference.error_line(s, label), flush=True)
        time.sleep(1.5)  # the arbiter writes its history in batches, from a thread
        try:
            n, bad = history_overlaps(world.env["KREX_ENDPOINT"], t_start, t_end)
            result["arbiter_history"] = {"regions": n, "overlapping_pairs": bad}
        except KrexError as exc:  # `timeout` signals the whole process group, the arbiter too
            result["arbiter_history"] = {"error": str(exc)}
    finally:
        world.stop()
        shutil.rmtree(runtime, ignore_errors=True)  # sockets, journals, the agents' files: nothing kept
    result["wall_s"] = round(time.time() - t_start, 1)
    result["ratios_region_over_command"] = agent_reference.ratios(result["points"])
    for r in result["ratios_region_over_command"]:
        print(agent_reference.ratio_line(r), flush=True)
    name = f"agent_study-{args.backend}"
    if args.out:
        path = Path(args.out)
        path.write_text(json.dumps(result, indent=1))
    else:
        path = write_result(name, result)
    if not args.no_plots:
        agent_plots.write_plots(result, path)
    return path


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
