"""Cold ``python script.py`` versus warm ``krex run script.py`` for a one-small-matmul script.

    python benchmarks/pool/warm_vs_cold.py                     # torch on CUDA (the README's figure)
    python benchmarks/pool/warm_vs_cold.py --framework numpy --backend fake   # a machine without GPU

Starts its own arbiter and pool (private runtime dir; the pool preloads torch and creates its
workers' contexts), then measures, for the same script:

* latency: ``--runs`` sequential commands each way, p50 / p90 / min of the command's wall time
  (the process start to its exit, as an agent's shell sees it);
* throughput: 16 (``--concurrent``) commands started at once, each way: commands per second
  until the last one ends (median of ``--rounds`` rounds).

Also the floor of ``krex run``: an empty script against ``python -c pass``, the two run in turn in
the same run (the target: the floor's p50 within 25 ms of Python's own start), what of it is the
CLI's own start-up (the imports of ``krex run``'s short way and of its full way, timed apart in
fresh interpreters), and the in-process API (PoolClient.run_script, no CLI start-up). ``krex`` is
the console script this tree's pyproject.toml declares, written as an installer writes it (not a
``krex`` of another install that PATH may find). Needs torch with a CUDA GPU for the default; exits
with a clear message (status 0, nothing written) where they are missing. JSON goes to benchmarks/out/ and $OUT.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, percentile, wait_until, write_result

SCRIPTS = {
    "torch": (
        "import torch\n"
        "a = torch.randn(256, 256, device='{device}')\n"
        "b = a @ a\n"
        "{sync}"
        "print(round(float(b.abs().sum()) / 1e6, 3))\n"
    ),
    "numpy": (
        "import numpy as np\n"
        "a = np.random.rand(256, 256).astype(np.float32)\n"
        "print(round(float(np.abs(a @ a).sum()) / 1e6, 3))\n"
    ),
}


def check(framework: str, device: str) -> str | None:
    """Why this machine cannot run the benchmark (None: it can)."""
    probe = (
        "import importlib.util, sys\n"
        f"if importlib.util.find_spec('{framework}') is None: sys.exit('{framework} is not installed')\n"
    )
    if framework == "torch" and device == "cuda":
        probe += "import torch\nif not torch.cuda.is_available(): sys.exit('torch sees no CUDA GPU')\n"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["unknown"])[-1]


def stats(xs: list[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in xs]
    return {
        "p50_ms": round(percentile(ms, 0.5), 2),
        "p90_ms": round(percentile(ms, 0.9), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
        "n": len(ms),
    }


def timed(cmd: list[str], env: dict[str, str]) -> float:
    """The command's wall time, stdin /dev/null: a pipe the harness holds open on stdin would make
    every ``krex run`` wait 50 ms for it (its stdin forwarding) and measure the harness."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return dt


#: what ``krex run SCRIPT`` imports before it sends the job (its short way), timed in a fresh interpreter
CLI_IMPORTS = (
    "import time\n"
    "t0 = time.perf_counter()\n"
    "import krex_lab.command, krex_lab.workers.client.fast_run\n"
    "import krex_lab.workers.client.stdin, krex_lab.workers.client.run_report\n"
    "print(time.perf_counter() - t0)\n"
)
#: the same for the full way (a run the short way declines: --exclusive, no pool yet, ...)
FULL_IMPORTS = (
    "import time\n"
    "t0 = time.perf_counter()\n"
    "from krex_lab.cli import parse_run_args\n"
    "parse_run_args(['script.py'])\n"
    "import krex_lab.workers.client.pool_client, krex_lab.workers.client.stdin\n"
    "print(time.perf_counter() - t0)\n"
)


def entry_point(pyproject: Path) -> str:
    """What the installed ``krex`` runs, ``module:function`` (pyproject's ``[project.scripts]``; read
    without tomllib, which Python 3.10 lacks)."""
    found = re.search(r'^krex\s*=\s*"([\w.]+:\w+)"', pyproject.read_text(), re.M)
    assert found is not None, f"no krex console script in {pyproject}"
    return found.group(1)


def console_script(where: Path) -> list[str]:
    """``krex`` as an installer writes it from this tree's pyproject.toml (pip's template)."""
    entry = entry_point(REPO / "pyproject.toml")
    module, func = entry.split(":")
    path = where / "krex"
    path.write_text(
        f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nif __name__ == '__main__':\n"
        f"    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n    sys.exit({func}())\n"
    )
    path.chmod(0o755)
    return [str(path)]


def imports(code: str, runs: int, env: dict[str, str]) -> list[float]:
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        out.append(float(r.stdout))
    return out


def floor(krex: list[str], empty: Path, runs: int, env: dict[str, str]) -> dict[str, Any]:
    """``python -c pass`` and ``krex run empty.py``, in turn (so that both see the same machine),
    and the CLI's imports apart; the target: the floor's p50 within 25 ms of Python's. Also each
    command's own CPU time (user + system, its rusage): on a loaded machine the wall time of
    ``krex run`` also waits for the pool and the worker to be scheduled, its CPU time does not."""
    python: list[float] = []
    warm: list[float] = []
    python_cpu: list[float] = []
    warm_cpu: list[float] = []
    for _ in range(runs):
        for cmd, wall, cpu in (
            ([sys.executable, "-c", "pass"], python, python_cpu),
            ([*krex, "run", str(empty)], warm, warm_cpu),
        ):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall.append(timed(cmd, env))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    over = stats(warm)["p50_ms"] - stats(python)["p50_ms"]
    return {
        "python_start": stats(python),
        "krex_run_empty_script": stats(warm),
        "p50_over_python_ms": round(over, 2),
        "target": "krex run empty.py p50 <= python -c pass p50 + 25 ms",
        "target_met": over <= 25.0,
        "cpu_python_start": stats(python_cpu),
        "cpu_krex_run_empty_script": stats(warm_cpu),
        "load_average": list(os.getloadavg()),
        "krex_run_imports": stats(imports(CLI_IMPORTS, runs, env)),
        "krex_run_full_way_imports": stats(imports(FULL_IMPORTS, runs, env)),
    }


def concurrent(cmd: list[str], env: dict[str, str], n: int) -> float:
    """Seconds from starting n copies at once until the last has exited."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(n)
    ]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err.decode()[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=sorted(SCRIPTS), default="torch")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--runs", type=int, default=15, help="sequential commands per side for latency")
    p.add_argument("--concurrent", type=int, default=16, help="commands started at once for throughput")
    p.add_argument("--rounds", type=int, default=2, help="throughput rounds per side (median reported)")
    p.add_argument("--workers", type=int, default=4, help="active pool workers per GPU")
    p.add_argument("--backend", default="auto", help="arbiter backend (auto: nvidia where present)")
    args = p.parse_args()
    device = "cpu" if args.framework == "numpy" else args.device
    why = check(args.framework, device)
    if why:
        print(
            f"warm_vs_cold: skipped, this machine cannot run it: {why}. Run it on the GPU machine "
            "(benchmarks/device_run.sh warm), or use --framework numpy to check the harness."
        )
        return

    # The package's bytecode cached first, as an installed package's is (and as any first run
    # leaves it): where the environment sets PYTHONDONTWRITEBYTECODE and the sources changed since
    # their cache was written, every `krex run` would compile what it imports again (16 ms here).
    compileall.compile_dir(str(REPO / "krex_lab"), quiet=1)

    runtime = Path(tempfile.mkdtemp(prefix="krex-warm-"))
    os.chmod(runtime, 0o700)
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": f"ipc://{runtime}/arbiter.sock",
        "KREX_POOL_ENDPOINT": f"ipc://{runtime}/pool.sock",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }
    os.environ.update({k: env[k] for k in ("KREX_RUNTIME_DIR", "KREX_ENDPOINT", "KREX_POOL_ENDPOINT")})
    script = runtime / "matmul.py"
    sync = "torch.cuda.synchronize()\n" if device == "cuda" else ""
    script.write_text(SCRIPTS[args.framework].format(device=device, sync=sync))
    empty = runtime / "empty.py"
    empty.write_text("pass\n")
    krex = console_script(runtime)
    cold_cmd = [sys.executable, str(script)]
    warm_cmd = [*krex, "run", str(script)]

    with open(runtime / "arbiter.log", "wb") as arb_log, open(runtime / "pool.log", "wb") as pool_log:
        arbiter = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", args.backend],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=arb_log,
        )
        pool = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "krex_lab.workers.pool",
                f"--Pool.preload={args.framework}",
                f"--workers-per-gpu={args.workers}",
                "--spares=1",
                "--Pool.arbiter_wait=60",
            ],
            env=env,
            stdout=pool_log,
            stderr=subprocess.STDOUT,
        )
    t_pool = time.perf_counter()
    try:
        from krex_lab.workers.client import PoolClient

        wait_until(lambda: (runtime / "pool.sock").exists() or pool.poll() is not None, 60, "no pool socket")
        client = PoolClient.connect(start=False)
        wait_until(lambda: client.status().ready, 300, "the pool's workers were not ready")
        pool_ready_s = time.perf_counter() - t_pool
        status = client.status()
        if not status.pool.arbiter:
            raise SystemExit(f"warm_vs_cold: the arbiter did not answer: {(runtime / 'arbiter.log').read_text()}")
        print(
            f"pool ready in {pool_ready_s:.1f} s: backend {status.pool.backend}, GPUs "
            f"{[g.index for g in status.gpus]}, preloaded {status.gpus[0].workers[0].preloaded}",
            flush=True,
        )

        for _ in range(2):  # first jobs on each path (file cache, worker warm-up) are not the figure
            timed(warm_cmd, env)
            timed(cold_cmd, env)
        cold = [timed(cold_cmd, env) for _ in range(args.runs)]
        print(f"cold  python script.py : p50 {stats(cold)['p50_ms']:.0f} ms", flush=True)
        warm = [timed(warm_cmd, env) for _ in range(args.runs)]
        print(f"warm  krex run script.py: p50 {stats(warm)['p50_ms']:.1f} ms", flush=True)
        api = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            r = client.run_script(script, on_output=lambda s, t: None)
            api.append(time.perf_counter() - t0)
            assert r.ok, r
        print(f"warm  in-process API    : p50 {stats(api)['p50_ms']:.1f} ms", flush=True)
        start = floor(krex, empty, args.runs, env)
        print(
            f"floor: krex run empty.py p50 {start['krex_run_empty_script']['p50_ms']:.1f} ms, python -c pass p50 "
            f"{start['python_start']['p50_ms']:.1f} ms (+{start['p50_over_python_ms']:.1f} ms; target +25 ms: "
            f"{'met' if start['target_met'] else 'NOT met'}); krex run's imports p50 "
            f"{start['krex_run_imports']['p50_ms']:.1f} ms "
            f"(full way {start['krex_run_full_way_imports']['p50_ms']:.1f} ms); CPU p50 "
            f"{start['cpu_krex_run_empty_script']['p50_ms']:.1f} against {start['cpu_python_start']['p50_ms']:.1f} ms; "
            f"load average {start['load_average'][0]:.1f}",
            flush=True,
        )

        n = args.concurrent
        cold_tp = [concurrent(cold_cmd, env, n) for _ in range(args.rounds)]
        warm_tp = [concurrent(warm_cmd, env, n) for _ in range(args.rounds)]
        cold_wall, warm_wall = statistics.median(cold_tp), statistics.median(warm_tp)
        print(
            f"{n} at once: cold {cold_wall:.2f} s ({n / cold_wall:.1f} cmd/s), warm {warm_wall:.2f} s "
            f"({n / warm_wall:.1f} cmd/s)",
            flush=True,
        )
        final = client.status()
        resets = [w.last_reset_s for g in final.gpus for w in g.workers if w.last_reset_s]
        client.close()
    finally:
        for proc in (pool, arbiter):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    ratio = stats(cold)["p50_ms"] / stats(warm)["p50_ms"]
    print(f"latency p50: warm is {ratio:.1f}x lower (target: 20x)")
    write_result(
        "warm_vs_cold",
        {
            "benchmark": "warm_vs_cold",
            "command": " ".join(sys.argv),
            "machine": machine(),
            "framework": args.framework,
            "device": device,
            "bytecode": "compiled before measuring (compileall)",
            "script": script.read_text(),
            "pool": {
                "workers_per_gpu": args.workers,
                "spares_per_gpu": 1,
                "ready_s": round(pool_ready_s, 2),
                "backend": final.pool.backend,
                "counters": final.counters,
                "last_resets_s": resets,
            },
            "latency": {
                "cold_python": stats(cold),
                "warm_krex_run": stats(warm),
                "warm_api_run_script": stats(api),
                "floor": start,
                "p50_ratio_cold_over_warm": round(ratio, 1),
            },
            "throughput": {
                "concurrent": n,
                "rounds": args.rounds,
                "cold_wall_s": [round(x, 3) for x in cold_tp],
                "warm_wall_s": [round(x, 3) for x in warm_tp],
                "cold_cmds_per_s": round(n / cold_wall, 2),
                "warm_cmds_per_s": round(n / warm_wall, 2),
                "speedup": round(cold_wall / warm_wall, 1),
            },
            "target": "warm latency p50 at least 20x lower than cold",
        },
    )
    shutil.rmtree(runtime, ignore_errors=True)  # a run that went well leaves nothing in /tmp (a failed one, its logs)


if __name__ == "__main__":
    main()
