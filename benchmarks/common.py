"""What every benchmark shares: machine description and where results go."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: the results that README, docs and RESULTS.md cite, kept in git (tests/test_results_cited.py)
RESULTS = REPO / "benchmarks" / "results"
#: where a run writes (ignored by git): a result worth keeping is moved to RESULTS and cited
OUTPUT = Path(os.environ.get("KREX_RESULTS_DIR") or REPO / "benchmarks" / "out")
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        # what else ran meanwhile: on a shared machine it moves every figure (1, 5, 15 min averages)
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    gpus = nvidia_smi("name,driver_version")
    if gpus:
        info["gpus"] = gpus
    return info


def nvidia_smi(query: str) -> list[str]:
    """``nvidia-smi --query-gpu=QUERY``'s lines, one a GPU ([] where it does not answer)."""
    try:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []


def load_file(path: str, name: str) -> Any:
    """Import the file at ``path`` as the module ``name``, registered in ``sys.modules`` (numba and
    Triton find a kernel's source through its module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/out/<name>-<date>.json`` (under ``$KREX_RESULTS_DIR`` when set, and a copy
    under $OUT when set); the date is UTC to the minute, to the second where a file of that minute
    exists. Nothing lands in git's tree: a result worth keeping is moved to benchmarks/results/ and
    cited where its figure is quoted."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    path = OUTPUT / f"{name}-{now:%Y-%m-%dT%H%M}.json"
    if path.exists():  # two runs in one minute: the second keeps its seconds, not the first's name
        path = OUTPUT / f"{name}-{now:%Y-%m-%dT%H%M%S}.json"
    text = json.dumps(data, indent=2)
    path.write_text(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, path.name).write_text(text)
    print(f"wrote {path}")
    return path


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def private_arbiter(prefix: str, *args: str, timeout: float = 30) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A ``krex arbiter`` (``args`` after ``arbiter``) on a fresh private runtime dir, started and
    answering, and the environment a process needs to use it (``KREX_ENDPOINT`` and the repo on
    ``PYTHONPATH``). Stop it with SIGTERM. ``KREX_PROF=FILE`` in the environment runs it under
    cProfile, its statistics written to FILE when it stops. The runtime dir (its sockets and the
    logs of what ran on it) goes when the script exits."""
    import atexit
    import shutil
    import tempfile
    import time

    runtime = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, runtime, ignore_errors=True)
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": f"ipc://{runtime}/arbiter.sock",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }
    profile = ["-m", "cProfile", "-o", os.environ["KREX_PROF"]] if os.environ.get("KREX_PROF") else []
    # Its log goes to a file: a pipe nobody reads fills up (64 KiB) and blocks the arbiter's next
    # write, which stalls every region of a long run.
    log = runtime / "arbiter.log"
    with open(log, "w") as err:
        arbiter = subprocess.Popen(
            [sys.executable, *profile, "-m", "krex_lab.cli", "arbiter", *args], env=env, stderr=err, text=True
        )
    deadline = time.monotonic() + timeout
    while not (runtime / "arbiter.sock").exists():
        if arbiter.poll() is not None or time.monotonic() > deadline:
            arbiter.kill()
            arbiter.wait()
            raise SystemExit(f"arbiter did not start: {log.read_text()[-4000:]}")
        time.sleep(0.05)
    return arbiter, env


#: Source of ``matmul_times(n, reps=200)``: a torch n x n matmul timed with one CUDA event pair per
#: launch after 20 warm-up launches (milliseconds). Sent as text to the timing processes of
#: quickstart_device.py and two_users_device.py as part of their programs (torch is imported at the first call).
CUDA_MATMUL_TIMER = """
def matmul_times(n, reps=200):
    import torch
    a = torch.randn(n, n, device="cuda"); b = torch.randn(n, n, device="cuda")
    for _ in range(20): a @ b
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record(); a @ b; e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]
"""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s; exit the benchmark saying ``what`` did not happen in time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{Path(sys.argv[0]).stem}: {what} within {timeout:.0f} s")
        time.sleep(0.1)
