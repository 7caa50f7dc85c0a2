"""How soon NVML's per-process GPU memory shows a free (the pool's reset reads it to decide
whether a job left memory behind; ``krex_lab.workers.context.reset``).

    python benchmarks/probes/nvml_memory_lag.py [--mib 400] [--rounds 5]

In one process: allocate ``--mib`` with numba.cuda (and with torch, where installed), fill it,
free it, then read NVML's ``usedGpuMemory`` for this process at once and after 5 ms ... 1 s.
numba is freed two ways: ``numba (context queue)`` clears only the context's pending frees, as
the pool's reset did until 2026-12-02 (on the H200 the 400 MiB then stayed); ``numba (both
queues)`` also its memory manager's, where a device array's free waits
(``krex_lab.devsync.numba_free_pending``). torch: its cache emptied. Prints and writes
``benchmarks/out/nvml_memory_lag-<date>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_kernels
from common import machine, write_result

from krex_lab.devsync import numba_free_pending

DELAYS = (0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def used(pynvml: Any, handle: Any) -> int | None:
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == os.getpid():
            return int(p.usedGpuMemory or 0)
    return None


def after_free(pynvml: Any, handle: Any, before: int) -> list[float]:
    """MiB above ``before`` at each of DELAYS after the free."""
    t0 = time.perf_counter()
    out = []
    for d in DELAYS:
        while time.perf_counter() - t0 < d:
            time.sleep(0.001)
        now = used(pynvml, handle)
        out.append(round(((now or 0) - before) / 2**20, 1))
    return out


def evaluations(pynvml: Any, handle: Any, ctx: Any, torch: Any) -> list[dict[str, Any]]:
    """What one agent_study evaluation (compile, check, time; no region) leaves in this process:
    MiB above the memory before it, at once and after gc, numba's pending frees and torch's cache."""
    import gc

    import agent_kernels as ak

    out = []
    work = Path(os.environ.get("TMPDIR", "/tmp"))
    ids = ["vector_add/optimised", "softmax/naive", "matmul/optimised", "vector_add/optimised", "vector_add/triton"]
    cands = {c.id: c for c in ak.space(None, ak.COMPILERS)}
    for i, cid in enumerate(ids):
        c = cands[cid]
        before = used(pynvml, handle) or 0
        path = ak.write_source(c, work, f"lag_{i}")
        job = {"candidate": ak.candidate_dict(c), "path": str(path), "mode": "none", "gpu": 0,
               "check_size": "0.05ms", "time_size": "0.1ms", "bench": {"min_time": 0.1}}  # fmt: skip
        rec = ak.evaluate(job)
        at_once = ((used(pynvml, handle) or 0) - before) / 2**20
        gc.collect()
        numba_free_pending(ctx)
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        cuda_sync = ((used(pynvml, handle) or 0) - before) / 2**20
        row = {"candidate": cid, "status": rec["status"], "left_mib": round(at_once, 1),
               "left_after_cleanup_mib": round(cuda_sync, 1)}  # fmt: skip
        print(row, flush=True)
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import numpy as np
    import pynvml
    from numba import cuda

    import krex_lab.kernels.spec  # noqa: F401 - numba-cuda's np.row_stack under NumPy 2.4 (see spec.py)

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ctx = cuda.current_context()
    cuda.device_array(16).copy_to_host()
    result: dict[str, Any] = {"benchmark": "nvml_memory_lag", "machine": machine(), "mib": args.mib,
                              "delays_s": list(DELAYS), "rounds": {}}  # fmt: skip
    rounds: dict[str, list[list[float]]] = {"numba (context queue)": [], "numba (both queues)": [], "torch": []}
    for name in ("numba (context queue)", "numba (both queues)"):
        for _ in range(args.rounds):
            numba_free_pending(ctx)  # nothing left over from the round before
            before = used(pynvml, handle) or 0
            arr = cuda.device_array(args.mib << 18, dtype=np.float32)
            arr[:] = 1.0
            cuda.synchronize()
            held = ((used(pynvml, handle) or 0) - before) / 2**20
            del arr
            if name == "numba (both queues)":
                numba_free_pending(ctx)
            else:
                ctx.deallocations.clear()
            rounds[name].append([round(held, 1), *after_free(pynvml, handle, before)])
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        for _ in range(args.rounds):
            before = used(pynvml, handle) or 0
            t = torch.ones(args.mib << 18, device="cuda")
            torch.cuda.synchronize()
            held = ((used(pynvml, handle) or 0) - before) / 2**20
            del t
            torch.cuda.empty_cache()
            rounds["torch"].append([round(held, 1), *after_free(pynvml, handle, before)])
    result["rounds"] = rounds
    result["evaluations"] = evaluations(pynvml, handle, ctx, torch)
    for name, rs in rounds.items():
        for r in rs:
            print(f"{name:21s} held {r[0]:7.1f} MiB; after the free, at " + ", ".join(
                f"{d * 1e3:g} ms: {v:+.1f}" for d, v in zip(DELAYS, r[1:])))  # fmt: skip
    write_result("nvml_memory_lag", result)


if __name__ == "__main__":
    main()
