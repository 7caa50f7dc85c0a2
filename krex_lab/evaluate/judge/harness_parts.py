"""What a harness says of its calls' host time (:attr:`..messages.Timed.parts_us`): the
candidate's process and the calibration twin each report it, and ``metadata.timing_split_us``
shows it beside the judge's own figures. A process may say anything: only the known parts,
finite and not negative, are shown, and none is ever used for a figure."""

from __future__ import annotations

import math

__all__ = ["PARTS", "parts_of", "said_text"]

#: the parts of a call's host time a harness reports (:attr:`Timed.parts_us`), then the
#: harness thread's CPU time over them and how often it was preempted (a count, not us)
PARTS = ("launch", "call", "deliver", "sync", "cpu", "preempted")


def parts_of(said: object) -> dict[str, float]:
    """The known parts of what a process said, finite and not negative (it may say anything)."""
    if not isinstance(said, dict):
        return {}
    out = {}
    for k in PARTS:
        v = said.get(k)
        if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0:
            out[k] = float(v)
    return out


def said_text(per_call: dict[str, float]) -> str:
    return "its harness says, a call: " + ", ".join(f"{k} {per_call[k]:.1f}" for k in PARTS if k in per_call)
