"""A timed round's input sets, as the judge's data path makes, hands over and checks them.

Each set lies in memory of its own with its output buffers (:mod:`.buffers`); a round's sets are
made for it, sent with it and freed after it, so the candidate's process never sees a round's
inputs before the round, and no set reaches another. After a round every call is checked as in
the check phase (:func:`_round_checks`). Used by :mod:`.rounds`, which owns the clock.
"""

from __future__ import annotations

import sys
from typing import Any

from .. import cuda_ipc
from ..channel import Shared
from ..messages import CallEntry, Timed
from ..options import Case
from .buffers import CallSet, OutSpec, out_spec, set_bytes, share_set
from .compare import same
from .problems import nbytes
from .tensors import arrays, clone, synchronize

#: the judge of :mod:`.session` (not imported: the session imports the rounds)
Judge = Any

__all__ = ["case_layout", "l2_flush", "make_sets", "memory_mark", "read_round", "refill", "round_checks"]


class _Sets:
    """A round's input sets: each in memory of its own (:class:`.buffers.CallSet`), their pristine
    copies, and the message that hands them over (sent once, with the round that uses them)."""

    def __init__(self, sets: list[CallSet], pristine: list[Any], shared: Shared) -> None:
        self.sets, self.pristine, self.shared = sets, pristine, shared

    def entries(self) -> list[CallEntry]:
        return [cs.entry for cs in self.sets]

    def release(self) -> None:
        """Every reference the judge holds to the sets' memory dropped (the message's too), so
        that it is freed as soon as the candidate's process lets go of it."""
        for cs in self.sets:
            cs.release()
        self.sets, self.pristine = [], []
        self.shared.keep.clear()


def make_sets(judge: Judge, case: Case | None, k: int, spec: OutSpec) -> _Sets:
    """K input sets under K seeds, in new memory the candidate has never mapped."""
    assert judge.problem is not None
    shared = Shared()
    sets: list[CallSet] = []
    pristine: list[Any] = []
    for _ in range(k):
        data = judge.problem.make(case, judge.seed(secret=True))  # timed: never reproducible
        synchronize()
        pristine.append(clone(data))
        sets.append(share_set(judge.problem, data, spec, shared))
    synchronize()
    return _Sets(sets, pristine, shared)


def refill(judge: Judge, case: Case | None, old: _Sets, spec: OutSpec) -> _Sets:
    """The next round's sets: new values in new memory (never the memory the candidate holds,
    which a thread or finalizer of its could read while the judge fills it); the old sets' memory
    freed."""
    fresh = make_sets(judge, case, len(old.sets), spec)
    old.release()
    cuda_ipc.collect()
    return fresh


def memory_mark() -> tuple[int, int, int] | None:
    """(MiB the judge's torch holds allocated on its GPU, MiB it holds reserved from the device,
    CUDA IPC shares a receiver still holds) after a refill; None off a GPU. A round's sets are
    freed once the candidate lets go of them, so all three stay flat over the rounds of a case
    where nothing keeps them (reserved memory is what the GPU's other users lose)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_allocated()) >> 20, int(torch.cuda.memory_reserved()) >> 20, cuda_ipc.held()


def read_round(rs: _Sets, order: list[int], body: Timed) -> list[Any]:
    """Each call's output, read from the judge's own buffers of its set (the last call on a set,
    where a warm-up calls one set more than once)."""
    values: list[Any] = body.values if len(body.values) == len(order) else [None] * len(order)
    return [rs.sets[j].read(v) for j, v in zip(order, values)]


def round_checks(
    judge: Judge, rs: _Sets, order: list[int], body: Timed, outs: list[Any], written: set[int]
) -> dict[str, str]:
    """What every call of a round must hold, as in the check phase: no input written (each set
    against its pristine copy), no output in an input's memory, no thread left running the
    candidate's code, no output changed after the judge read it."""
    for n, j in enumerate(order):
        cs = rs.sets[j]
        wrote = sorted(k for k, (a, b) in enumerate(zip(arrays(rs.pristine[j]), cs.inputs)) if not same(a, b))
        wrote = [k for k in wrote if k not in written]
        if wrote:
            return {
                "inputs_modified": f"a timed call (call {n + 1} of a round) wrote into its input(s) {wrote} "
                "(the reference does not)"
            }
    for n, alias in enumerate(body.aliased):
        bad = sorted(i for i in alias if i not in written)
        if bad:
            return {"aliased_output": f"a timed call (call {n + 1} of a round) returned its input(s) {bad} (or a view)"}
    if body.threads:
        names = ", ".join(body.threads[:3])
        return {
            "threads_left": f"the candidate left thread(s) running its own code after a timed round ({names}): "
            "work a timer around the call would not see"
        }
    for j, out in zip(order, outs):
        for k, (now, then) in enumerate(zip(rs.sets[j].outs, list(arrays(out)))):
            if now is not None and not same(now, then):
                return {
                    "outputs_written_late": f"output {k} of a timed call changed after the round had ended "
                    "(work left running past the call writes the answer afterwards)"
                }
    return {}


def case_layout(judge: Judge, case: Case | None) -> tuple[OutSpec, set[int], int, Any]:
    """A case's output buffers (the reference's answer on a sample set), the inputs the reference
    itself writes (GPU MODE's output arguments), the bytes one set takes in the judge, and the
    sample set itself (the calibration twin's rounds take sets of the case's own shapes)."""
    assert judge.problem is not None
    sample = judge.problem.make(case, judge.seed())
    synchronize()
    ref_data = clone(sample)
    expected = judge.problem.reference(ref_data)
    synchronize()
    written = {k for k, (a, b) in enumerate(zip(arrays(sample), arrays(ref_data))) if not same(a, b)}
    spec = out_spec(expected)
    # the shared set with its output buffers (a GPU's in a segment of its own), its pristine copy,
    # and the judge's copies of the outputs
    host, device = set_bytes(sample, spec)
    per_set = max(1, host + device + nbytes(sample) + spec.nbytes)
    return spec, written, per_set, sample


def l2_flush(device: str) -> str:
    """What the timing does to the caches between calls, as the result says it."""
    if device == "cuda":
        return (
            "256 MiB written before every timed call, outside its event pair (KernelBench's and GPU MODE's "
            "clear_l2_cache), for the candidate and the reference alike"
        )
    return "none: a CPU's caches are not flushed between calls"
