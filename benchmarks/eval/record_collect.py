"""How long the judge's reproducibility record takes: ``krex_lab.evaluate.judge.record.collect``.

The first call reads the static facts (package versions, the GPU's name, UUID and driver through
NVML); every later call reads the clocks alone. Target: under 5 ms after the first call. On a
GPU machine torch's CUDA is initialised first, as in the judge, so the record finds its GPU.

    .venv/bin/python benchmarks/eval/record_collect.py      # prints the figures, writes benchmarks/out/
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, write_result

from krex_lab.evaluate.job import build_job
from krex_lab.evaluate.judge import record


def main() -> None:
    try:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # the judge's context exists before it records
    except ImportError:
        device = "cpu"
    problem = REPO / "tests" / "evaluate" / "problems" / "gm_tasks" / "gm_task_scale"
    job = build_job(problem, problem / "correct.py")
    t0 = time.perf_counter()
    first = record.collect(job, seed=1, device=device)
    first_ms = (time.perf_counter() - t0) * 1e3
    later = []
    for _ in range(200):
        t0 = time.perf_counter()
        record.collect(job, seed=1, device=device)
        later.append((time.perf_counter() - t0) * 1e3)
    later.sort()
    figures = {
        "first_ms": round(first_ms, 3),
        "later_median_ms": round(statistics.median(later), 4),
        "later_p99_ms": round(later[int(0.99 * len(later)) - 1], 4),
        "target_ms": 5.0,
        "gpu_name": first.gpu_name,
        "clocks_mhz": first.clocks_mhz,
    }
    print(
        f"record.collect on {device}: first {figures['first_ms']} ms; later median "
        f"{figures['later_median_ms']} ms, p99 {figures['later_p99_ms']} ms (target < 5 ms)"
    )
    write_result("record_collect", {"machine": machine(), **figures})
    sys.exit(0 if figures["later_p99_ms"] < 5.0 else 1)


if __name__ == "__main__":
    main()
