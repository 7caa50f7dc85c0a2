"""What the candidate's sandbox costs an evaluation: its two steps, timed in processes forked as
spares are (from a parent that imported torch and loaded libseccomp, as the zygote does), and a
system call's price under the filter.

    python benchmarks/eval/sandbox_cost.py [--runs 20] [--cuda]

Per run, in a fresh fork: ``lock_process`` (no_new_privs, capabilities, the seccomp filter,
landlock's scopes), with ``--cuda`` the CUDA context made after it (as a spare makes it, to show
the driver works inside the lock, and what the context costs beside the lock), then
``confine_files`` (landlock on a build directory, the socket filter). A million ``getppid``
calls bare and locked give the filter's price per system call. JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, write_result


def syscall_ns(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        os.getppid()
    return (time.perf_counter() - t0) / n * 1e9


def one(build: str, cuda: bool, calls: int) -> dict[str, object]:
    from krex_lab.evaluate.candidate import sandbox
    from krex_lab.evaluate.judge.spares import sandbox_summary

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out: dict[str, object] = {}
        t0 = time.perf_counter()
        report = sandbox.lock_process()
        out["lock_ms"] = (time.perf_counter() - t0) * 1e3
        if cuda:
            import torch

            t1 = time.perf_counter()
            torch.cuda.init()
            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            out["cuda_context_ms"] = (time.perf_counter() - t1) * 1e3
        t2 = time.perf_counter()
        report.update(sandbox.confine_files(build, os.path.join(build, "tmp", str(os.getpid())), []))
        out["confine_ms"] = (time.perf_counter() - t2) * 1e3
        out["getppid_ns"] = syscall_ns(calls)
        out["sandbox"] = sandbox_summary(report)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    result: dict[str, object] = json.loads(data)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cuda", action="store_true", help="make a CUDA context in each locked fork")
    ap.add_argument("--calls", type=int, default=200_000, help="getppid calls for the per-call price")
    args = ap.parse_args()
    import torch  # noqa: F401  (the zygote's state: torch imported, CUDA not initialised)

    from krex_lab.evaluate.candidate import sandbox

    sandbox.preload()
    build = tempfile.mkdtemp(prefix="krex-sandbox-cost-")
    runs = [one(build, args.cuda, args.calls) for _ in range(args.runs)]
    bare = statistics.median(syscall_ns(args.calls) for _ in range(5))
    shutil.rmtree(build, ignore_errors=True)
    summary = {
        key: {
            "median": statistics.median(float(str(r[key])) for r in runs),
            "max": max(float(str(r[key])) for r in runs),
        }
        for key in ("lock_ms", "confine_ms", "getppid_ns", *(["cuda_context_ms"] if args.cuda else []))
    }
    summary["getppid_ns_bare"] = {"median": bare}
    data = {"machine": machine(), "landlock_abi": sandbox.landlock_abi(), "sandbox": runs[0]["sandbox"]}
    data.update({"runs": args.runs, "summary": summary, "each": runs})
    for key, value in summary.items():
        print(f"{key:>20}: " + ", ".join(f"{k} {v:.3f}" for k, v in value.items()))
    print("sandbox:", data["sandbox"])
    write_result("sandbox_cost", data)


if __name__ == "__main__":
    main()
