"""What one evaluation takes of its GPU's memory, measured in the judge for the batch's admission.

The reference's peak is measured around its first use (the model built, the first trial's inputs
drawn, its first answer computed): ``torch.cuda.max_memory_allocated`` on a GPU, the simulated
allocator's peak on the fake backend (:mod:`krex_lab.gpu.fake`), nothing on a plain CPU. The
footprint a batch admits an evaluation by is then

* the judge's side: the reference's peak twice (its model and answers, the pristine copies and
  the compared outputs of a trial), and the timed rounds' input sets: as many as a round may have
  (``MAX_SETS``) of the first trial's size (its inputs twice, with their pristine copies, and its
  output), within the judge's default budget (:data:`INPUT_SETS`) but one set at least, however
  large; twice that, as the next round's sets are made before the last round's are freed;
* the candidate's allowance: twice the reference's peak, at least :data:`MIN_ALLOWANCE` (a
  candidate builds a model like the reference's and computes outputs like its own).

A candidate that runs out of GPU memory while it holds more than its allowance has used more than
its share: that is its verdict. Below it, the memory was someone else's (another evaluation, a
neighbour) and the batch runs the evaluation again, unless the device had the memory free when
the judge looked (:func:`device_free`, read as the candidate's failure arrives): an out-of-memory
that only the candidate's words claim is its own.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["MIN_ALLOWANCE", "device_free", "figures", "judge_peak", "reference_peak"]

#: the least GPU memory a candidate is allowed, whatever the reference takes
MIN_ALLOWANCE = 512 << 20
#: the judge's budget for a case's input sets, where no admission asked for less (``rounds.budget``)
INPUT_SETS = {"cuda": 512 << 20, "cpu": 256 << 20}


@contextlib.contextmanager
def reference_peak(device: str) -> Iterator[list[int]]:
    """Bytes the block took at its peak, beyond what was allocated before it (``[0]`` at exit);
    ``[1]``: what was allocated before it, from which :func:`judge_peak` counts the whole evaluation."""
    out = [0, 0]
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None:
        torch.cuda.synchronize()
        out[1] = before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        try:
            yield out
        finally:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                out[0] = max(0, torch.cuda.max_memory_allocated() - before)
        return
    from ...gpu.fake import simulated_peak

    simulated_peak(reset=True)
    try:
        yield out
    finally:
        out[0] = simulated_peak()


def figures(device: str, peak: int, per_set: int, max_sets: int) -> dict[str, str]:
    """The evaluation's footprint, by part, in bytes (``metadata["memory"]``): ``per_set`` is one
    input set's size with its pristine copy and output, ``max_sets`` the most a round may have.
    ``input_sets``: the sets' part of the footprint (two rounds' worth, see the module doc), of
    which ``input_sets_least`` stays however little the batch gives the judge for them."""
    per_set = max(1, per_set)
    a_round = max(per_set, min(INPUT_SETS.get(device, INPUT_SETS["cpu"]), per_set * max_sets))
    allowance = max(MIN_ALLOWANCE, 2 * peak)
    return {
        "reference_peak": str(peak),
        "input_sets": str(2 * a_round),
        "input_sets_least": str(2 * per_set),
        "candidate_allowance": str(allowance),
        "footprint": str(2 * peak + 2 * a_round + allowance),
    }


def judge_peak(device: str, before: int) -> int | None:
    """Bytes the judge's side of the evaluation took at its peak, from the reference's load to now,
    beyond the ``before`` of :func:`reference_peak` (None where nothing is measured). The estimate
    of :func:`figures` leaves out what a problem's sizes make hard to foresee (the layout's sample
    set and its reference copy, the first trial's data, the L2 flush): the batch admits the next
    pairs of the problem by this figure where it is larger."""
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None:
        with contextlib.suppress(Exception):
            return max(0, int(torch.cuda.max_memory_allocated()) - before)
        return None
    from ...gpu.fake import SimulatedMemory, simulated_peak

    return simulated_peak() if SimulatedMemory.from_env() is not None else None


def device_free(device: str) -> int | None:
    """Bytes free on this judge's GPU now, all processes counted (the driver's figure; the fake
    backend's simulated memory), None where there is no such figure."""
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None:
        with contextlib.suppress(Exception):
            return int(torch.cuda.mem_get_info()[0])
        return None
    import os

    from ...gpu.fake import SimulatedMemory

    memory = SimulatedMemory.from_env()
    if memory is None:
        return None
    gpu = int(os.environ.get("KREX_GPU", "0") or 0)
    return max(0, memory.total(gpu, 80 << 30) - memory.used(gpu))
