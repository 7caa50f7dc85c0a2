"""The quickstart on a real GPU: two `krex` kernels on GPU 0, one timing a matmul inside
``%%krex_exclusive`` while the other loops on the GPU.

    python benchmarks/lab/quickstart_device.py

Starts its own arbiter (nvidia backend) and two kernels through jupyter_client with the
`krex` kernelspec (KREX_GPU=0). Kernel A times torch matmuls with CUDA events (one event pair
per launch, 200 launches, after warm-up): alone; while kernel B loops 4096^2 matmuls
(contended); and inside a ``%%krex_exclusive`` cell with B still looping. B records a
timestamp per iteration, so the script also reports B's longest stall and whether it fell
inside A's region. JSON: benchmarks/out/quickstart_device-<date>.json.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "regions"))  # fidelity
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multigpu"))  # multi_gpu_placement
from common import CUDA_MATMUL_TIMER, REPO, machine, percentile, write_result
from fidelity import start_arbiter, stop_arbiter
from multi_gpu_placement import ensure_provisioner_entry_point

TIMER = "import json, time, torch\n" + CUDA_MATMUL_TIMER + "krex_time = matmul_times\n"
LOOPER = r"""
import time, torch
x = torch.randn(4096, 4096, device="cuda"); stamps = []
t_end = time.time() + {seconds}
while time.time() < t_end:
    for _ in range(4): y = x @ x
    torch.cuda.synchronize(); stamps.append(time.time())
"""
SIZES = (2048, 4608)


def run_cell(kc: Any, code: str, timeout: float = 300) -> tuple[str, dict[str, Any]]:
    """Execute ``code``; returns (stdout text, reply content)."""
    msg_id = kc.execute(code)
    out: list[str] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    return "".join(out), reply["content"]


def stats(xs: list[float], base: dict[str, float] | None) -> dict[str, float]:
    d = {"median_ms": round(percentile(xs, 0.5), 5), "p95_ms": round(percentile(xs, 0.95), 5)}
    if base:
        d["p95_inflation_pct"] = round(100 * (d["p95_ms"] / base["p95_ms"] - 1), 3)
        d["median_inflation_pct"] = round(100 * (d["median_ms"] / base["median_ms"] - 1), 3)
    return d


def main() -> int:
    from jupyter_client.manager import KernelManager

    tmp = Path(tempfile.mkdtemp(prefix="krex-quickstart-"))
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(tmp),
        "KREX_ENDPOINT": f"ipc://{tmp}/arbiter.sock",
        "KREX_GPU": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_PATH": str(REPO / "extension" / "share" / "jupyter"),
    }
    os.environ.update({k: env[k] for k in ("KREX_RUNTIME_DIR", "KREX_ENDPOINT", "KREX_GPU", "JUPYTER_PATH")})
    entry = ensure_provisioner_entry_point(tmp)
    arbiter, hello = start_arbiter(env, "nvidia", tmp / "arbiter.log")
    kms = []
    doc: dict[str, Any] = {
        "benchmark": "quickstart_device",
        "machine": machine(),
        "provisioner": entry,
        "backend": hello.get("backend"),
        "timing": "CUDA events around each launch",
    }
    try:
        kcs = []
        for _ in range(2):
            km = KernelManager(kernel_name="krex")
            km.start_kernel(env=env)
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            kms.append(km)
            kcs.append(kc)
        a, b = kcs
        env_probe = "import os; print(os.environ.get('KREX_GPU'), os.environ.get('CUDA_VISIBLE_DEVICES'))"
        out, _ = run_cell(a, TIMER + env_probe)
        doc["kernel_a_env"] = out.strip()
        run_cell(b, "import json, time, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()")
        results: dict[str, Any] = {}
        for n in SIZES:
            out, _ = run_cell(a, f"print(json.dumps(krex_time({n})))")
            results[n] = {"alone": stats(json.loads(out.strip().splitlines()[-1]), None)}
        b_id = b.execute(LOOPER.format(seconds=60))
        time.sleep(3)
        for n in SIZES:
            out, _ = run_cell(a, f"print(json.dumps(krex_time({n})))")
            results[n]["contended"] = stats(json.loads(out.strip().splitlines()[-1]), results[n]["alone"])
        regions = []
        for n in SIZES:
            t0 = time.time()
            out, reply = run_cell(a, f"%%krex_exclusive\nprint(json.dumps(krex_time({n})))")
            t1 = time.time()
            lines = out.strip().splitlines()
            samples = next(json.loads(line) for line in lines if line.startswith("["))
            results[n]["krex"] = stats(samples, results[n]["alone"])
            regions.append(
                {
                    "size": n,
                    "report_line": [ln for ln in lines if "KREX region" in ln],
                    "cell_start": t0,
                    "cell_end": t1,
                    "status": reply["status"],
                }
            )
        doc["regions"] = regions
        # B's loop ends by itself; then read its timestamps to see when it ran.
        while True:
            msg = b.get_shell_msg(timeout=120)
            if msg["parent_header"].get("msg_id") == b_id:
                break
        out, _ = run_cell(b, "print(json.dumps(stamps))")
        stamps = json.loads(out.strip().splitlines()[-1])
        gaps = [(t2 - t1, t1, t2) for t1, t2 in itertools.pairwise(stamps)]
        longest = max(gaps) if gaps else (0.0, 0.0, 0.0)
        inside = [g for g in gaps if any(r["cell_start"] <= g[1] and g[2] <= r["cell_end"] + 1 for r in regions)]
        doc["kernel_b"] = {
            "iterations": len(stamps),
            "longest_stall_s": round(longest[0], 3),
            "stalls_over_0.5s": [[round(g, 3), t1, t2] for g, t1, t2 in gaps if g > 0.5],
            "stall_inside_region": bool([g for g in inside if g[0] > 0.5]),
        }
        doc["results"] = {str(k): v for k, v in results.items()}
    finally:
        for km in kms:
            km.shutdown_kernel(now=True)
        stop_arbiter(arbiter)
    print(json.dumps(doc["results"], indent=1))
    print("regions:", json.dumps(doc["regions"], indent=1))
    print("kernel B:", doc["kernel_b"])
    write_result("quickstart_device", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
