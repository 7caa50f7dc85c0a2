"""GPU MODE pairs on a real NVIDIA GPU: judged in IEEE fp32 as GPU MODE judges them, in both layouts,
and many evaluations at once on one GPU with no region degraded.

The problem is written here in the published shape (a family directory with ``utils.py``, the
problem's ``task.yml`` naming ``../utils.py``), a 2-D convolution like GPU MODE's ``conv2d_py``:
its reference turns cuDNN's TF32 off for itself, its check allows 1e-3. A plain ``F.conv2d``
submission is right; under torch's default (cuDNN TF32 on) on a card with TF32 it was judged
wrong, thousands of elements off.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from tests.gpu.helpers import nvidia_pool
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

LIMITS = {"load": 300.0, "check": 60.0, "time": 120.0}

UTILS = """
import torch


def mismatches(received, expected, rtol, atol):
    if received.shape != expected.shape:
        return f"shape {tuple(received.shape)}, expected {tuple(expected.shape)}"
    bad = (received - expected).abs() > atol + rtol * expected.abs()
    return f"{int(bad.sum())} element(s) differ" if bool(bad.any()) else ""
"""

TASK_PY = """
from typing import TypeVar
import torch

input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor])
output_t = TypeVar("output_t", bound=torch.Tensor)
"""

REFERENCE = """
import torch
import torch.nn.functional as F
from task import input_t, output_t
from utils import mismatches


def ref_kernel(data: input_t) -> output_t:
    before = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = False, True
    try:
        x, w = data
        return F.conv2d(x, w, stride=1, padding=0)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = before


def generate_input(size: int, kernelsize: int, channels: int, batch: int, seed: int) -> input_t:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, channels, size, size, device="cuda", generator=g)
    w = torch.randn(channels, channels, kernelsize, kernelsize, device="cuda", generator=g)
    return x, w


def check_implementation(data: input_t, output: output_t) -> str:
    return mismatches(output, ref_kernel(data), rtol=1e-3, atol=1e-3)
"""

TASK_YML = """
files:
  - {"name": "submission.py", "source": "@SUBMISSION@"}
  - {"name": "task.py", "source": "task.py"}
  - {"name": "utils.py", "source": "../utils.py"}
  - {"name": "reference.py", "source": "reference.py"}
  - {"name": "eval.py", "source": "../eval.py"}
lang: "py"
config:
  main: "eval.py"
tests:
  - {"size": 64, "kernelsize": 8, "channels": 32, "batch": 2, "seed": 5531}
  - {"size": 128, "kernelsize": 8, "channels": 64, "batch": 1, "seed": 9173}
benchmarks:
  - {"size": 128, "kernelsize": 8, "channels": 64, "batch": 4, "seed": 54352}
"""

PLAIN = """
import torch.nn.functional as F


def custom_kernel(data):
    x, w = data
    return F.conv2d(x, w, stride=1, padding=0)
"""

WRONG = """
import torch.nn.functional as F


def custom_kernel(data):
    x, w = data
    return F.conv2d(x, w, stride=1, padding=0) * 1.01
"""


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The conv problem published (family/conv) and gathered into one directory (flat/conv)."""
    root = tmp_path_factory.mktemp("gpumode")
    family = root / "family"
    (family / "conv").mkdir(parents=True)
    (family / "utils.py").write_text(UTILS)
    for d in (family / "conv", root / "flat" / "conv"):
        d.mkdir(parents=True, exist_ok=True)
        (d / "task.yml").write_text(TASK_YML)
        (d / "task.py").write_text(TASK_PY)
        (d / "reference.py").write_text(REFERENCE)
        (d / "plain.py").write_text(PLAIN)
        (d / "wrong.py").write_text(WRONG)
    (root / "flat" / "conv" / "utils.py").write_text(UTILS)
    return {"published": family / "conv", "flat": root / "flat" / "conv"}


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=4", "--spares=1")


def run(pool: PoolProc, problem: Path, candidate: str, **options: object) -> Evaluation:
    options.setdefault("timeouts", LIMITS)
    return evaluate(problem, problem / candidate, pool=pool.client, gpu=0, **options)  # type: ignore[arg-type]


def _tf32_changes_convolutions() -> bool:
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 32, 64, 64, device="cuda", generator=g)
    w = torch.randn(32, 32, 8, 8, device="cuda", generator=g)
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        fast = F.conv2d(x, w)
        torch.backends.cudnn.allow_tf32 = False
        exact = F.conv2d(x, w)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    return bool(((fast - exact).abs() > 1e-3 + 1e-3 * exact.abs()).any())


def test_a_plain_conv2d_submission_is_correct_in_both_layouts(gpu_pool: PoolProc, problems: dict[str, Path]) -> None:
    if not _tf32_changes_convolutions():
        pytest.skip("this GPU computes fp32 convolutions alike with TF32 on and off: nothing to tell apart")
    for layout, problem in problems.items():
        ev = run(gpu_pool, problem, "plain.py", mode="leaderboard")
        assert ev.verdict == "correct", f"{layout}: {ev.summary} {ev.metadata.get('correctness_issue')}"
        assert ev.reproducibility is not None and ev.reproducibility.numerics.get("cudnn_allow_tf32") is False
        wrong = run(gpu_pool, problem, "wrong.py", measure=False)
        assert wrong.verdict == "incorrect", f"{layout}: {wrong.summary}"


def test_many_evaluations_at_once_leave_no_region_degraded(gpu_pool: PoolProc, problems: dict[str, Path]) -> None:
    """Eight evaluations on four judges, each forking its next spare (which makes its context while
    idle) while the others time in regions: no region degraded, no process found stopped."""
    jobs = [problems["published"], problems["flat"]] * 4

    def one(problem: Path) -> Evaluation:
        return run(gpu_pool, problem, "plain.py")

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as ex:
        evaluations = list(ex.map(one, jobs))
    assert [ev.verdict for ev in evaluations] == ["correct"] * len(jobs), [ev.summary for ev in evaluations]
    reports = [part.region for ev in evaluations for part in ev.regions if part.region is not None]
    assert reports
    bad = [(r.region, r.why_degraded()) for r in reports if r.degraded or r.skipped_stopped]
    assert bad == [], bad
