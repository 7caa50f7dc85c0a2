"""Which CUDA errors leave a context unusable ("sticky"): read by the pool's workers (a job that
hit one recycles its worker) and by the evaluator's candidate side and client (the verdict says
``cuda_error``). A leaf: it imports nothing of the package, so either side may use it."""

from __future__ import annotations

#: Messages of CUDA errors after which a context is unusable ("sticky"): the worker is recycled.
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "illegal address",
    "cuda_error_illegal_address",
    "cudaerrorillegaladdress",
    "illegal instruction",
    "cuda_error_illegal_instruction",
    "misaligned address",
    "cuda_error_misaligned_address",
    "invalid program counter",
    "cuda_error_invalid_pc",
    "unspecified launch failure",
    "cuda_error_launch_failed",
    "cudaerrorlaunchfailure",
    "hardware stack error",
    "cuda_error_hardware_stack_error",
    "device-side assert triggered",  # not the advice "to enable device-side assertions"
    "cuda_error_assert",
    "invalid address space",
    "cuda_error_invalid_address_space",
    "uncorrectable ecc error",
    "cuda_error_ecc_uncorrectable",
    "context is destroyed",
    "cuda_error_context_is_destroyed",
    "launch timed out",
    "cuda_error_launch_timeout",
)


def sticky_cuda_error(exc: BaseException | None) -> str | None:
    """The message of a sticky CUDA error in ``exc`` or its causes, else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        line = sticky_cuda_line(f"{type(exc).__name__}: {exc}")
        if line is not None:
            return line
        exc = exc.__cause__ or exc.__context__
    return None


def sticky_cuda_line(text: str) -> str | None:
    """The line of ``text`` (an error, a traceback) that names a sticky CUDA error, else None.
    The line itself, not the message's first or last: torch's message ends with advice
    ("Compile with TORCH_USE_CUDA_DSA ...") that says nothing of what happened."""
    for line in text.splitlines():
        if any(p in line.lower() for p in STICKY_CUDA_ERRORS):
            return line.strip()[:300]
    return None
