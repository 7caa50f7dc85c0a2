"""Where a region's drain goes with many CUDA siblings: the driver's checkpoint lock, measured alone.

    python benchmarks/probes/lock_cost.py                         # 1, 3 and 15 idle siblings; 1..16 threads
    python benchmarks/probes/lock_cost.py --counts 15 --threads 1,16 --rounds 50

With 15 idle CUDA siblings a region's drain took 14.0 ms on the H200 (2026-12-01), 16 locks in
parallel threads, although one lock of an idle process alone takes about 0.15 ms: the
driver seems to serialise them, and parallel callers may make it worse. This script takes the
arbiter and the rest of the region away and times only what the drain does, so that a change to
the drain (fewer threads, sequential locks, fewer /proc checks) can be chosen from figures:

* ``driver``: the bare ``cuCheckpointProcessLock`` / ``Unlock`` calls (``CtypesCudaDriver``);
* ``backend``: ``NvidiaBackend.lock`` / ``unlock`` as the arbiter's ``Locker`` calls them (each
  adds liveness, stopped and frozen-cgroup checks and a ``cuCheckpointProcessGetState``);
* ``locker``: the drain's own ``Locker.lock_all`` / ``unlock_all`` on an event loop, as the arbiter
  runs them (the checks on the loop, then only driver calls in the threads);
* ``state``: ``cuCheckpointProcessGetState`` alone, one call per sibling;
* ``listing``: the drain's reads around the locks, each timed for all siblings: the backend's
  process listing (NVML, namespace mapping, /dev/nvidia check) and the stopped/frozen checks.

Siblings are plain driver-API processes (``cuInit``, primary context, 1 MiB allocation, then
asleep), not torch, so that they start in seconds. For each sibling count and each thread count
(one persistent pool, as the arbiter's) every round locks all siblings and unlocks them again;
the JSON holds the p50/p99 wall time of a whole lock and unlock round and of a single call.
Needs an NVIDIA GPU with driver R550 or newer; there is no fake mode (nothing here would mean
anything without the driver).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, percentile, write_result

from krex_lab.enforcement.drain import DrainResult, Locker
from krex_lab.gpu.cuda_driver import CtypesCudaDriver
from krex_lab.gpu.nvidia import NvidiaBackend, cgroup_frozen
from krex_lab.gpu.pid_mapping import holds_nvidia_device, local_pid
from krex_lab.procutil import proc_state

SIBLING = r"""
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
for call, rc in [
    ("cuInit", cu.cuInit(0)),
    ("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0)),
    ("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
    ("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx)),
    ("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))),
]:
    if rc != 0:
        sys.exit(f"{call} failed: CUresult {rc}")
print("ready", flush=True)
time.sleep(3600)
"""


def _timed(fn: Callable[[int], Any], pid: int) -> float:
    t = time.perf_counter()
    fn(pid)
    return time.perf_counter() - t


def _round(pool: concurrent.futures.Executor, fn: Callable[[int], Any], pids: list[int]) -> tuple[float, list[float]]:
    t = time.perf_counter()
    calls = list(pool.map(lambda p: _timed(fn, p), pids))
    return time.perf_counter() - t, calls


def _stats(prefix: str, xs: list[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in xs]
    return {f"{prefix}_p50_ms": round(percentile(ms, 0.5), 4), f"{prefix}_p99_ms": round(percentile(ms, 0.99), 4)}


def measure_locker(pids: list[int], threads: int, rounds: int, timeout_s: float) -> dict[str, Any]:
    """Whole lock and unlock rounds through the arbiter's Locker (no per-call figures)."""
    backend = NvidiaBackend()
    locker = Locker(backend, timeout_s, threads)
    lock_walls, unlock_walls = [], []

    async def rounds_() -> None:
        for _ in range(rounds):
            result = DrainResult()
            t = time.perf_counter()
            await locker.lock_all(pids, result, lambda _: None)
            lock_walls.append(time.perf_counter() - t)
            if len(result.locked) != len(pids):
                raise SystemExit(f"locker: {len(result.locked)} of {len(pids)} locked: {result.not_drained}")
            t = time.perf_counter()
            errors = await locker.unlock_all(result.locked)
            unlock_walls.append(time.perf_counter() - t)
            if errors:
                raise SystemExit(f"locker: {errors}")

    try:
        asyncio.run(rounds_())
    finally:
        locker.shutdown()
        backend.close()
    return {
        "siblings": len(pids),
        "threads": threads,
        "path": "locker",
        "rounds": rounds,
        **_stats("lock_all", lock_walls),
        **_stats("unlock_all", unlock_walls),
    }


def measure(pids: list[int], threads: int, rounds: int, path: str, timeout_s: float) -> dict[str, Any]:
    if path == "locker":
        return measure_locker(pids, threads, rounds, timeout_s)
    drv = CtypesCudaDriver()
    backend = NvidiaBackend() if path == "backend" else None

    def lock(pid: int) -> None:
        if backend is not None:
            backend.lock(pid, timeout_s)
        else:
            drv.checkpoint_lock(pid, int(timeout_s * 1000))

    unlock: Callable[[int], Any] = backend.unlock if backend is not None else drv.checkpoint_unlock
    lock_walls, unlock_walls, lock_calls, unlock_calls = [], [], [], []
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="lock") as pool:
        list(pool.map(lambda _: None, range(threads)))  # the arbiter's pool is warm too
        for _ in range(rounds):
            wall, calls = _round(pool, lock, pids)
            lock_walls.append(wall)
            lock_calls += calls
            wall, calls = _round(pool, unlock, pids)
            unlock_walls.append(wall)
            unlock_calls += calls
    if backend is not None:
        backend.close()
    return {
        "siblings": len(pids),
        "threads": threads,
        "path": path,
        "rounds": rounds,
        **_stats("lock_all", lock_walls),
        **_stats("unlock_all", unlock_walls),
        **_stats("lock_call", lock_calls),
        **_stats("unlock_call", unlock_calls),
    }


def state_cost(pids: list[int], rounds: int) -> dict[str, Any]:
    drv = CtypesCudaDriver()
    calls = [_timed(drv.checkpoint_state, p) for _ in range(rounds) for p in pids]
    return {"siblings": len(pids), "threads": 1, "path": "state", "rounds": rounds, **_stats("state_call", calls)}


def listing_cost(pids: list[int], rounds: int) -> dict[str, Any]:
    """What a drain reads before and around its locks: the backend's process listing (NVML, then
    each pid's namespace mapping and /dev/nvidia check) and each lock's stopped/frozen checks."""
    backend = NvidiaBackend()
    parts: dict[str, Callable[[], Any]] = {
        "listing": lambda: backend.processes(0),
        "nvml": lambda: backend._nvml.processes(0),
        "local_pid": lambda: [local_pid(p) for p in pids],
        "holds_device": lambda: [holds_nvidia_device(p) for p in pids],
        "stopped_frozen": lambda: [(proc_state(p), cgroup_frozen(p)) for p in pids],
    }
    row: dict[str, Any] = {"siblings": len(pids), "threads": 1, "path": "listing", "rounds": rounds}
    for name, fn in parts.items():
        walls = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t)
        row.update(_stats(name, walls))
    row["listed"] = len(backend.processes(0))
    backend.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", default="1,3,15", help="sibling counts (comma-separated)")
    p.add_argument("--threads", default="1,2,4,16", help="lock thread counts (the arbiter's default is 16)")
    p.add_argument("--paths", default="driver,backend,locker", help="driver, backend, locker (module docstring)")
    p.add_argument("--rounds", type=int, default=30, help="lock+unlock rounds per configuration")
    p.add_argument("--lock-timeout", type=float, default=2.0, help="each lock's driver timeout in seconds")
    args = p.parse_args()
    counts = [int(x) for x in args.counts.split(",")]
    rows: list[dict[str, Any]] = []
    for n in counts:
        siblings = [
            subprocess.Popen([sys.executable, "-c", SIBLING], stdout=subprocess.PIPE, text=True) for _ in range(n)
        ]
        try:
            for s in siblings:
                assert s.stdout is not None
                line = s.stdout.readline()
                if not line.startswith("ready"):
                    raise SystemExit(f"a sibling did not start (exit {s.wait()})")
            pids = [s.pid for s in siblings]
            rows.append(state_cost(pids, args.rounds))
            print(f"{n:>3} siblings  state   1 thread : {rows[-1]['state_call_p50_ms']:.3f} ms per call", flush=True)
            r = listing_cost(pids, args.rounds)
            rows.append(r)
            print(
                f"{n:>3} siblings  listing ({r['listed']} listed): p50 {r['listing_p50_ms']:.3f} ms = nvml "
                f"{r['nvml_p50_ms']:.3f} + local_pid {r['local_pid_p50_ms']:.3f} + /dev/nvidia "
                f"{r['holds_device_p50_ms']:.3f}; stopped+frozen checks {r['stopped_frozen_p50_ms']:.3f} ms",
                flush=True,
            )
            for path in args.paths.split(","):
                for t in [int(x) for x in args.threads.split(",")]:
                    r = measure(pids, t, args.rounds, path, args.lock_timeout)
                    rows.append(r)
                    calls = (
                        (f" (one call {r['lock_call_p50_ms']:.3f})", f" (one call {r['unlock_call_p50_ms']:.3f})")
                        if "lock_call_p50_ms" in r
                        else ("", "")
                    )
                    print(
                        f"{n:>3} siblings  {path:<7} {t:>2} threads: lock all p50 {r['lock_all_p50_ms']:.3f} ms"
                        f"{calls[0]}, unlock all {r['unlock_all_p50_ms']:.3f} ms{calls[1]}",
                        flush=True,
                    )
        finally:
            for s in siblings:
                s.send_signal(signal.SIGCONT)
                s.kill()
                s.wait()
    write_result("lock_cost", {"machine": machine(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
