"""A candidate's failure as the judge states it: what its process raised (its answer ``Failed``),
or how the process ended. Never the candidate's own word for a shortage of memory: the device's
figure is read here."""

from __future__ import annotations

import errno
import os
import signal

from ..messages import Failed
from .footprint import device_free
from .tracebacks import user_traceback
from .values import CandidateFailed

__all__ = ["died", "raised", "trim_compiler_message"]

_OOM = ("out of memory", "can't allocate memory", "cannot allocate memory", "outofmemory")
_COMPILE_ERRORS = ("SyntaxError", "ImportError", "ModuleNotFoundError", "LookupError", "IndentationError")


def trim_compiler_message(text: str, limit: int = 3000) -> str:
    """The compiler's errors out of a build log: lines saying ``error`` and the two after each."""
    lines = text.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if "error" in line.lower():
            keep += [ln for ln in lines[i : i + 3] if ln not in keep[-3:]]
    body = "\n".join(keep or lines[-40:])
    return body if len(body) <= limit else body[:limit] + f"\n[... {len(body) - limit} more characters]"


def died(status: int | None, phase: str, why: str) -> CandidateFailed:
    """The candidate's process gone (``status``: its wait status, None where it is not known)."""
    if status is not None and os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return CandidateFailed("crashed", "worker_died", f"the candidate's process died of {sig} in the {phase} phase")
    if status is not None:
        return CandidateFailed("crashed", "worker_died", f"the candidate's process exited ({os.WEXITSTATUS(status)})")
    return CandidateFailed("crashed", "worker_died", f"the candidate's process stopped answering ({why})")


def raised(body: Failed, phase: str, device: str) -> CandidateFailed:
    """What the candidate's process raised in ``phase``, as a verdict."""
    kind, message = body.kind or "Error", body.message
    text = f"{kind}: {message}"
    tb = body.traceback
    if body.sticky:
        return CandidateFailed("crashed", "cuda_error", f"{body.sticky} (a sticky CUDA error)")
    if kind == "OutputRejected":  # a value of a type the judge does not take, named
        return CandidateFailed("rejected", "rejected", "", {"output_type": message[:2000]})
    if kind == "OutputMismatch":
        return CandidateFailed("incorrect", "correctness_issue", message[:2000])
    if body.oom or any(s in text.lower() for s in _OOM):
        # the device's own figure, read now: the candidate's words alone prove no shortage
        free = device_free(device)
        seen = {} if free is None else {"out_of_memory_device_free": str(free)}
        return CandidateFailed("out_of_memory", "out_of_memory", text[:2000], figures=seen)
    if (kind == "OSError" and "File too large" in message) or f"[Errno {errno.EFBIG}]" in message:
        return CandidateFailed("rejected", "output_limit", f"the candidate wrote more than its output limit ({text})")
    building = "error building extension" in text.lower()
    if phase == "load" and building:
        return CandidateFailed("compile_error", "compilation_error", trim_compiler_message(f"{text}\n{tb}"))
    if phase == "load" and kind in _COMPILE_ERRORS:
        # the user's file and line, not the harness's frames that compiled it
        return CandidateFailed("compile_error", "compilation_error", f"{text}\n{user_traceback(tb)[-2000:]}")
    return CandidateFailed("runtime_error", "runtime_error", f"{text}\n{user_traceback(tb)[-1500:]}"[:3000])
