"""Two Unix users on one GPU under the node's root arbiter: alice times a matmul inside a region
while bob's process loops matmuls on the same GPU.

    sudo python benchmarks/regions/two_users_device.py                    # on a GPU node (nvidia backend)
    sudo python benchmarks/regions/two_users_device.py --backend fake --device cpu --python /path/python  # smoke test

Creates two users with ``useradd`` (removed after), starts a root ``krex arbiter --multi-user`` on
a root-owned runtime dir, and runs, as each user, the process their notebook kernel would be: a
registered KREX session (``krex_lab.attach``). Alice times ``--reps`` launches per size with CUDA
events (one pair per launch): alone, beside bob's loop, and inside ``krex_lab.exclusive()`` beside
it (the code ``%%krex_exclusive`` runs). Locking bob's process needs the arbiter's root: that is
what a shared node adds over the single-user quickstart. JSON: results/two_users_device-<date>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import CUDA_MATMUL_TIMER, REPO, machine, percentile, write_result
from fidelity import start_arbiter, stop_arbiter

# Each user's process reads commands on stdin and answers one JSON line each.
ALICE = (
    r"""
import json, sys, time
import krex_lab
DEVICE = sys.argv[1]
"""
    + CUDA_MATMUL_TIMER
    + r"""
if DEVICE == "cuda":
    import torch  # here, before "ready", not inside the first timed region
    timed = matmul_times
else:  # the smoke test: CPU work of the same shape, no numpy needed
    def timed(n, reps):
        out = []
        for _ in range(reps):
            t = time.perf_counter(); sum(i * i for i in range(n * 40)); out.append((time.perf_counter() - t) * 1e3)
        return out
krex_lab.attach(gpu=0, name="alice timer")
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    mode, n, reps = line.split()
    if mode == "krex":
        with krex_lab.exclusive(gpu=0, max_hold=120) as region:
            xs = timed(int(n), int(reps))
        print(json.dumps({"samples": xs, "report": dict(region.report)}), flush=True)
    else:
        print(json.dumps({"samples": timed(int(n), int(reps))}), flush=True)
"""
)
BOB = r"""
import json, sys, time
import krex_lab
DEVICE, seconds = sys.argv[1], float(sys.argv[2])
krex_lab.attach(gpu=0, name="bob looper")
if DEVICE == "cuda":
    import torch
    x = torch.randn(4096, 4096, device="cuda")
    def step():
        for _ in range(4): x @ x
        torch.cuda.synchronize()
else:
    def step():
        sum(i * i for i in range(20000))
step()
print(json.dumps({"ready": True}), flush=True)
stamps = []
t_end = time.time() + seconds
while time.time() < t_end:
    step(); stamps.append(time.time())
print(json.dumps({"stamps": stamps}), flush=True)
"""


def make_user(prefix: str) -> pwd.struct_passwd:
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    return pwd.getpwnam(name)


def readable_copy(tmp: Path) -> Path:
    """The package where an unprivileged user can import it (the checkout may lie under /root)."""
    dest = tmp / "src"
    shutil.copytree(REPO / "krex_lab", dest / "krex_lab", ignore=shutil.ignore_patterns("__pycache__"))
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def as_user(user: pwd.struct_passwd, python: str, code: str, args: list[str], env: dict[str, str]) -> Any:
    return subprocess.Popen(
        [python, "-c", code, *args],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        cwd="/",
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def answer(proc: Any, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process {proc.pid} ended (exit {proc.poll()})")
        if line.startswith("{"):
            return dict(json.loads(line))
    raise TimeoutError


def stats(xs: list[float], base: dict[str, float] | None) -> dict[str, float]:
    d = {"median_ms": round(percentile(xs, 0.5), 5), "p95_ms": round(percentile(xs, 0.95), 5)}
    if base:
        d["p95_inflation_pct"] = round(100 * (d["p95_ms"] / base["p95_ms"] - 1), 3)
    return d


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="nvidia", choices=["nvidia", "fake"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--python", default=sys.executable, help="interpreter the two users run")
    p.add_argument("--sizes", default="2048,4608", help="matmul sizes, comma-separated")
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("two_users_device: run as root (it creates two users and a root multi-user arbiter)")
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="krex-two-users-"))
    tmp.chmod(0o755)
    runtime = tmp / "rt"
    runtime.mkdir(mode=0o755)
    root_env = {**os.environ, "KREX_RUNTIME_DIR": str(runtime), "KREX_ENDPOINT": f"ipc://{runtime}/arbiter.sock"}
    arbiter, hello = start_arbiter(root_env, args.backend, tmp / "arbiter.log", ("--multi-user",))
    src = readable_copy(tmp)
    paths = [str(src), *[x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x and "krex" not in x]]
    user_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONPATH": os.pathsep.join(paths),
        "KREX_ENDPOINT": root_env["KREX_ENDPOINT"],
        "KREX_GPU": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    alice, bob = make_user("krexalice"), make_user("krexbob")
    procs: list[Any] = []
    doc: dict[str, Any] = {
        "benchmark": "two_users_device",
        "machine": machine(),
        "backend": hello.get("backend"),
        "device": args.device,
        "reps": args.reps,
        "timing": "CUDA events around each launch"
        if args.device == "cuda"
        else "perf_counter around each matmul (smoke test)",
    }
    try:
        a = as_user(alice, args.python, ALICE, [args.device], user_env)
        procs.append(a)
        answer(a, 120)
        results: dict[str, Any] = {}
        for n in sizes:
            a.stdin.write(f"alone {n} {args.reps}\n")
            a.stdin.flush()
            results[str(n)] = {"alone": stats(answer(a)["samples"], None)}
        b = as_user(bob, args.python, BOB, [args.device, str(60 + 5 * len(sizes))], user_env)
        procs.append(b)
        answer(b, 120)
        time.sleep(3)
        regions = []
        for n in sizes:
            base = results[str(n)]["alone"]
            a.stdin.write(f"contended {n} {args.reps}\n")
            a.stdin.flush()
            results[str(n)]["contended"] = stats(answer(a)["samples"], base)
            a.stdin.write(f"krex {n} {args.reps}\n")
            a.stdin.flush()
            got = answer(a)
            results[str(n)]["krex"] = stats(got["samples"], base)
            r = got["report"]
            regions.append(
                {
                    "size": n,
                    "locked": r.get("locked"),
                    "frozen": r.get("frozen"),
                    "not_drained": r.get("not_drained"),
                    "degraded": r.get("degraded"),
                    "acquire_s": r.get("acquire_s"),
                    "bob_pid": b.pid,
                }
            )
        doc["results"] = results
        doc["regions"] = regions
        stamps = answer(b, 300)["stamps"]
        doc["bob"] = {
            "iterations": len(stamps),
            "longest_stall_s": round(max((y - x for x, y in itertools.pairwise(stamps)), default=0.0), 3),
        }
        doc["target"] = "alice's p95 inside a region beside bob's loop within 0.5% of alone"
        path = write_result("two_users_device", doc)
        for n in sizes:
            r = results[str(n)]
            print(
                f"{n}^2: alone p95 {r['alone']['p95_ms']:.4f} ms; "
                f"beside bob {r['contended']['p95_inflation_pct']:+.2f}%; "
                f"in a region beside bob {r['krex']['p95_inflation_pct']:+.2f}%"
            )
        for r in regions:
            print(
                f"region: locked {r['locked']}, frozen {r['frozen']}, not drained {r['not_drained']}, "
                f"degraded {r['degraded']} (bob's pid {r['bob_pid']})"
            )
        print(f"wrote {path}")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        stop_arbiter(arbiter)
        for u in (alice, bob):
            subprocess.run(["pkill", "-KILL", "-u", u.pw_name], check=False)
            subprocess.run(["userdel", u.pw_name], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
