"""benchmarks/multigpu/multi_gpu.py's dry run on two fake GPUs: the orchestration the two-H200 stage relies on.

Device time is scarce, so the stage must not be the first place the orchestration runs (its CPU
hogs once stopped registering and part B failed at the first hog). The dry run starts its own
arbiter, krex kernels through jupyter_client and the victim, holder and hog processes; every
check is about placement and freezing, none about timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_fake_dry_run_passes_every_placement_and_freeze_check(tmp_path: Path) -> None:
    out = tmp_path / "multi_gpu.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "multigpu" / "multi_gpu.py"),
            "--backend",
            "fake",
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OUT": ""},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["simulated"] is True
    failed = [name for name, ok in doc["checks"].items() if not ok]
    assert not failed and len(doc["checks"]) >= 20, (failed, run.stdout[-2000:])
    assert doc["passed"] is True and doc["A"]["method"] == "kernelspec"
    assert sorted(k["gpu"] for k in doc["A"]["placed"]) == [0, 0, 1, 1]
