"""A sticky CUDA error is named by the line that says what happened, not by torch's closing advice
(the H200 showed ``crashed: Compile with `TORCH_USE_CUDA_DSA` ...`` for an illegal address)."""

from __future__ import annotations

from krex_lab.cuda_errors import sticky_cuda_error, sticky_cuda_line

# torch 2.x's message for a kernel that wrote to a bad address, as the worker's traceback ends
TORCH_MESSAGE = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def test_the_line_naming_the_error_is_kept() -> None:
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 3\ntorch.AcceleratorError: ' + TORCH_MESSAGE
    assert sticky_cuda_line(traceback) == "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert sticky_cuda_line("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.") is None


def test_a_cause_chain_is_searched() -> None:
    try:
        try:
            raise RuntimeError(TORCH_MESSAGE)
        except RuntimeError as inner:
            raise ValueError("the check failed") from inner
    except ValueError as outer:
        assert sticky_cuda_error(outer) == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert sticky_cuda_error(ValueError("out of range")) is None
