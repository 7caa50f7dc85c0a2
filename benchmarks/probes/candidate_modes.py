"""Is a candidate's time alone a property of the candidate, of where its inputs landed, or of an idle GPU?

The agent study's tiled numba matmul (``matmul/optimised``) reads two medians alone on the H200,
about 0.246 and 0.257 ms (2026-12-02, ``agent_study-nvidia-…T1131``: alone runs 0.2559, 0.2471,
0.2451, 0.2578 ms), at one SM clock, on the same warm worker from one evaluation to the next. Its
inputs are filled on the device with the same values every time, so the values cannot be the
cause. This script times candidates alone in one process, many times, each time on freshly
allocated inputs:

* ``same place``: inputs allocated and freed again and again (the allocator hands back the
  same addresses);
* ``shifted``: a padding allocation of a random size (1-64 MiB) made first, so the inputs land
  elsewhere;
* ``after idle``: as ``same place``, after ``--idle`` seconds with nothing on the GPU (the study's
  alone runs come to a worker that waited; under 16 agents the GPU is never idle, and there every
  evaluation read the fast mode);
* ``after idle, 1 s warm-up``: the same with ``bench``'s warm-up at ``--long-warmup`` seconds
  instead of 0.2 s, the fix tried in the same run.

If the ``shifted`` medians split into groups and the ``same place`` ones do not, where the
inputs land sets the time; if ``after idle`` ones do, an idle GPU does. Either way one alone run
is a sample of that, not the candidate's time.

Answered on the H200 (2026-12-02 14:40, ``candidate_modes-2026-12-02T1440.json``): all four
split alike, 26 of 32 runs at 0.2436-0.2468 ms and 6 at 0.2592-0.2602 ms, at one clock, each
run in one mode from its warm-up to its last samples. The mode comes with an allocation (the
inputs' offset in a 2 MiB page was 0 in every run), not with an idle GPU or a short warm-up.

Usage (GPU): ``python3 benchmarks/probes/candidate_modes.py [--trials 16] [--candidates matmul/optimised,...]``
Writes ``benchmarks/out/candidate_modes-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_kernels
from common import machine, write_result


def offset_2mib(arr: Any) -> int | None:
    """Where in its 2 MiB page an array starts (None in numba's simulator, which has no pointers)."""
    ptr = getattr(arr, "device_ctypes_pointer", None)
    return None if ptr is None else int(ptr.value) % 2**21


def trials(
    spec: Any, fn: Any, size: Any, n: int, shift: bool, idle: float, warmup: float | None, rng: random.Random
) -> list[dict[str, Any]]:
    import numpy as np
    from numba import cuda

    import krex_lab
    from krex_lab.devsync import numba_free_pending
    from krex_lab.kernels.spec import SIMULATOR

    rows = []
    for _ in range(n):
        time.sleep(idle)
        pad_mib = rng.randint(1, 64) if shift else 0
        pad = cuda.device_array(pad_mib * 2**18, dtype=np.float32) if pad_mib else None
        ins, outs = spec.device_inputs(size)
        m = krex_lab.bench(fn, *ins, *outs, exclusive=False, warmup=warmup)
        clocks = m.clocks or {}
        tenth = max(1, len(m.samples) // 10)
        rows.append(
            {
                "pad_mib": pad_mib,
                "median_ms": m.median,
                "rel_stdev": m.rel_stdev,
                "sm_mhz": clocks.get("sm_mhz_median"),
                "mem_mhz": [clocks.get("mem_mhz_min"), clocks.get("mem_mhz_max")],
                # the first and last tenth of the samples: does a slow start fade within one measurement?
                "first_tenth_ms": statistics.median(m.samples[:tenth]),
                "last_tenth_ms": statistics.median(m.samples[-tenth:]),
                "warmup_estimate_ms": m.warmup.get("estimate_ms"),
                "in_offsets_2mib": [offset_2mib(a) for a in ins],
                "out_offsets_2mib": [offset_2mib(a) for a in outs],
            }
        )
        del ins, outs, pad
        if not SIMULATOR:  # the simulator's context has no queues of frees
            numba_free_pending(cuda.current_context())
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    meds = sorted(r["median_ms"] for r in rows)
    return {
        "median_ms": statistics.median(meds),
        "min_ms": meds[0],
        "max_ms": meds[-1],
        "range_pct": round(100.0 * (meds[-1] / meds[0] - 1.0), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=16, help="timed runs per candidate and placement")
    p.add_argument("--candidates", default="matmul/optimised,softmax/naive,vector_add/naive")
    p.add_argument(
        "--size", default="0.1ms", help="krex_lab.kernels preset (the study's timing size); test0/test1: the simulator"
    )
    p.add_argument("--idle", type=float, default=3.0, help="seconds the GPU idles before each 'after idle' run")
    p.add_argument("--long-warmup", type=float, default=1.0, help="bench warm-up (s) of the last 'after idle' set")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    from agent_kernels import size_arg

    from krex_lab import kernels

    rng = random.Random(args.seed)
    out: dict[str, Any] = {"benchmark": "candidate_modes", "machine": machine(), "size": args.size, "candidates": {}}
    for cid in args.candidates.split(","):
        kernel, name = cid.split("/", 1)
        spec = kernels.get(kernel)
        fn = spec.candidate(name)
        size = size_arg(spec, args.size)
        ins, outs = spec.device_inputs(size)
        fn(*ins, *outs)  # compile once, outside the trials
        del ins, outs
        res = {}
        for label, shift, idle, warmup in (
            ("same place", False, 0.0, None),
            ("shifted", True, 0.0, None),
            ("after idle", False, args.idle, None),
            # the would-be fix, tried in the same run: a warm-up long enough for a GPU out of idle
            (f"after idle, {args.long_warmup:g} s warm-up", False, args.idle, args.long_warmup),
        ):
            rows = trials(spec, fn, size, args.trials, shift, idle, warmup, rng)
            res[label] = {"summary": summary(rows), "runs": rows}
            s = res[label]["summary"]
            medians = " ".join(f"{r['median_ms']:.4f}" for r in rows)
            print(
                f"{cid:22s} {label:24s}: median {s['median_ms']:.4f} ms, range {s['min_ms']:.4f}-{s['max_ms']:.4f} "
                f"({s['range_pct']} %); runs {medians}",
                flush=True,
            )
        out["candidates"][cid] = res
    write_result("candidate_modes", out)


if __name__ == "__main__":
    main()
