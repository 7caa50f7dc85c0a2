"""The floating-point switches a format's programs run under (TF32, cuDNN), on both sides.

GPU MODE's runner (``run_eval.py`` in gpu-mode/kernelbot) starts ``python3 eval.py`` with the
problem's files and sets none of torch's switches: the submission and the reference run under
torch's defaults. GPU MODE checks its published solutions (``solutions/correct``, ``wrong``) on a
T4, which has no TF32, so every fp32 result there is IEEE fp32. On a card with TF32 (A100, H100,
H200) torch's default ``torch.backends.cudnn.allow_tf32 = True`` rounds the inputs of fp32
convolutions to 10 mantissa bits: GPU MODE's own correct solution of ``conv2d_py`` (a plain
``F.conv2d``) then differs from its reference (which turns TF32 off for itself) in thousands of
elements beyond the check's 1e-3, and would be judged wrong where GPU MODE judged it right.

So a GPU MODE program runs here as on the card GPU MODE decides on: IEEE fp32 (cuDNN's and
cuBLAS's TF32 off, ``float32_matmul_precision`` "highest"), every other switch as torch leaves it
(``cudnn.benchmark`` and ``cudnn.deterministic`` off), in the candidate's process before its code
is imported and in the judge around the reference and its check. A program may still set any switch
itself, as it may under GPU MODE's runner (its conv2d submission turns TF32 off for itself).
KernelBench's harness sets none either and runs both programs in one process under torch's
defaults: a KernelBench pair keeps them (``None``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["GPUMODE", "Settings", "applied", "apply", "current", "settings_for"]

#: switches by name, as :func:`current` reads them and :func:`apply` sets them
Settings = dict[str, bool | str]

#: GPU MODE's programs: IEEE fp32, the rest as torch leaves it
GPUMODE: Settings = {
    "cudnn_allow_tf32": False,
    "matmul_allow_tf32": False,
    "float32_matmul_precision": "highest",
    "cudnn_benchmark": False,
    "cudnn_deterministic": False,
}


def settings_for(format: str) -> Settings | None:
    """The switches ``format``'s programs run under (None: torch's defaults, untouched)."""
    return dict(GPUMODE) if format == "gpumode" else None


def current() -> Settings | None:
    """The switches as they are in this process (None: torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return {
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
    }


def apply(settings: Settings | None) -> None:
    """Set the switches ``settings`` names (nothing when None, or where torch is not imported:
    a program without torch has none of them)."""
    torch = sys.modules.get("torch")
    if not settings or torch is None:
        return
    if "cudnn_allow_tf32" in settings:
        torch.backends.cudnn.allow_tf32 = bool(settings["cudnn_allow_tf32"])
    if "matmul_allow_tf32" in settings:
        torch.backends.cuda.matmul.allow_tf32 = bool(settings["matmul_allow_tf32"])
    if "float32_matmul_precision" in settings:
        torch.set_float32_matmul_precision(str(settings["float32_matmul_precision"]))
    if "cudnn_benchmark" in settings:
        torch.backends.cudnn.benchmark = bool(settings["cudnn_benchmark"])
    if "cudnn_deterministic" in settings:
        torch.backends.cudnn.deterministic = bool(settings["cudnn_deterministic"])


@contextlib.contextmanager
def applied(settings: Settings | None) -> Iterator[None]:
    """The switches set for the block, and put back as they were after it (the judge is a warm
    worker that serves other formats next)."""
    before = current() if settings else None
    apply(settings)
    try:
        yield
    finally:
        apply(before)
