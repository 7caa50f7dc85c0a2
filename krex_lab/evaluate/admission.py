"""Admission by GPU memory: which evaluation of a batch starts now, on which GPU, and what an
out-of-memory says.

A batch (:mod:`.batch`) asks :class:`Admission` where the next evaluation fits. Each GPU's
memory is what the arbiter's backend reads (NVML on NVIDIA: every process on the GPU counts,
foreign ones included; the fake backend's simulated figures in CI). An evaluation is admitted on
a GPU while its footprint fits

    total - reserve - max(used now, used when none of ours ran + footprints of ours running)

(``used now`` sees a neighbour that grew; the second term counts what our running evaluations
will take although they have not allocated it yet). A footprint is measured by the judge
(:mod:`.judge.footprint`: the reference's peak, the input sets, the candidate's allowance) the
first time a problem runs; until then an evaluation of that problem is admitted with the largest
footprint measured in the batch so far, at least ``unknown_footprint_mb``. An evaluation whose
footprint does not fit, but would with its input sets shrunk (to 16 MiB a round, or one set, at
least), starts now with them shrunk to what is free; what does not fit even so waits in the queue.

An out-of-memory is the candidate's verdict only where the candidate alone held more than its
allowance (its own figures: what it held and asked for). Any other (the judge's side ran out,
or the candidate did below its allowance) was caused by someone else's memory: the batch runs
the evaluation again, alone on its GPU, up to ``attempts`` times, and it is never the candidate's
verdict.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .result import Evaluation

if TYPE_CHECKING:
    from ..workers.client import PoolClient

__all__ = ["Admission", "GpuMemory", "MemoryPolicy", "arbiter_memory", "oom_cause"]

MiB = 1 << 20
GiB = 1 << 30
#: the judge's default budget for a case's input sets on a GPU
INPUT_SETS = 512 * MiB
#: the least an evaluation admitted short of memory keeps for its input sets
LEAST_SETS = 16 * MiB


@dataclass
class MemoryPolicy:
    """How a batch admits evaluations by GPU memory (``krex eval --batch``'s ``--memory-*``)."""

    #: memory kept free on every GPU, beyond every admitted footprint
    reserve_mb: int = 1024
    #: the least footprint an evaluation of a problem not measured yet is admitted with
    unknown_footprint_mb: int = 2048
    #: runs of one pair at most while its out-of-memory errors are not its own
    attempts: int = 4
    #: seconds between reads of the GPUs' memory while evaluations wait for it
    poll_s: float = 0.5
    #: seconds an evaluation waits for memory before it runs alone on a GPU where none of ours runs
    max_wait_s: float = 120.0
    #: False: no admission by memory (evaluations start as workers are free)
    enabled: bool = True
    #: True: while nothing could be admitted for ``give_back_after_s``, the batch lets the pool keep
    #: half as many workers per GPU (down to what runs, at least 1): the idle ones' contexts hold
    #: GPU memory that the evaluations waiting need (off by default until proven on a GPU)
    give_back_workers: bool = False
    #: seconds without an admission, while evaluations wait for memory, before each give-back
    give_back_after_s: float = 5.0


@dataclass
class GpuMemory:
    total: int
    used: int


MemoryReader = Callable[[], dict[int, GpuMemory]]


def arbiter_memory(pool: PoolClient | None) -> MemoryReader | None:
    """The GPUs' memory as the pool's arbiter reads it (None: no arbiter answers, nothing to read)."""
    from ..connection import status
    from ..node_status import NodeStatus

    endpoint: str | None = None
    if pool is not None:
        try:
            endpoint = pool.status().pool.arbiter
        except Exception:
            return None
        if endpoint is None:
            return None

    def read() -> dict[int, GpuMemory]:
        table = NodeStatus.of(status(endpoint, timeout=5.0))
        return {g.index: GpuMemory(g.memory_total, g.memory_used) for g in table.gpus if g.memory_total}

    try:
        read()
    except Exception:
        return None
    return read


# -- what an out-of-memory says ---------------------------------------------------------------------

_OOM_WORDS = ("out of memory", "outofmemory", "cudaerrormemoryallocation", "cuda_error_out_of_memory")
_HOST_OOM = ("cannot allocate memory", "can't allocate memory", "memoryerror")
_SIZE = r"([0-9.]+)\s*(B|bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _bytes(match: re.Match[str] | None) -> int | None:
    return None if match is None else int(float(match.group(1)) * _UNITS[match.group(2)])


def _texts(ev: Evaluation, keys: tuple[str, ...]) -> str:
    return "\n".join(str(ev.metadata.get(k, "")) for k in keys).lower()


def candidate_figures(text: str) -> tuple[int, int] | None:
    """(held, asked) from a framework's out-of-memory message in the candidate's process: what its
    allocator held and the allocation that failed (None: the message does not say)."""
    asked = _bytes(re.search(r"tried to allocate " + _SIZE, text, re.I))
    held = _bytes(re.search(r"of the allocated memory " + _SIZE + r" is allocated by", text, re.I))
    if asked is None:
        return None
    return held or 0, asked


def oom_cause(ev: Evaluation, allowance: int) -> str | None:
    """None: not a GPU out-of-memory. ``"candidate"``: the candidate alone held and asked for more
    than ``allowance``. ``"elsewhere"``: someone else's memory (the judge's side ran out, the
    candidate ran out below its allowance, or it does not say how much it held)."""
    if ev.verdict == "out_of_memory":
        text = str(ev.metadata.get("out_of_memory", ""))
        low = text.lower()
        if any(w in low for w in _HOST_OOM) and not any(w in low for w in _OOM_WORDS):
            return "candidate"  # host memory: its own allowance (RLIMIT_DATA), no neighbour's
        figures = candidate_figures(text)
        if figures is not None and sum(figures) > allowance:
            return "candidate"
        # its words are the candidate's: the device had what it asked for (or, unsaid, its whole
        # allowance) free when the judge looked, so no one else's memory stopped it
        free = device_free_seen(ev)
        if free is not None and free >= (figures[1] if figures is not None else allowance):
            return "candidate"
        return "elsewhere"
    if ev.verdict == "error" and any(
        w in _texts(ev, ("reference_error", "evaluation_error", "worker_output")) for w in _OOM_WORDS
    ):
        return "elsewhere"
    return None


def device_free_seen(ev: Evaluation) -> int | None:
    """The GPU memory free as the judge read it when the candidate's out-of-memory arrived."""
    seen = str(ev.metadata.get("out_of_memory_device_free", ""))
    return int(seen) if seen.isdigit() else None


def oom_figures(ev: Evaluation, allowance: int, free: int | None) -> str:
    """The candidate's own out-of-memory, in figures (``metadata["out_of_memory_figures"]``)."""
    figures = candidate_figures(str(ev.metadata.get("out_of_memory", "")))
    allowed = f"its allowance of {allowance / GiB:.2f} GiB"
    line = f"the candidate ran out of memory beyond {allowed}"
    if figures is not None:
        held, asked = figures
        where = "beyond" if held + asked > allowance else "within"
        line = (
            f"the candidate held {held / GiB:.2f} GiB and asked for {asked / GiB:.2f} GiB more "
            f"({(held + asked) / GiB:.2f} GiB), {where} {allowed}"
        )
    seen = device_free_seen(ev)
    if seen is not None and (figures is None or sum(figures) <= allowance):
        line = f"the candidate said it ran out of memory ({line.removeprefix('the candidate ')})"
    if free is not None:
        line += f"; {free / GiB:.2f} GiB of the GPU was free for it when it was admitted"
    if seen is not None:
        line += f"; {seen / GiB:.2f} GiB of the device was free when it failed"
    return line


# -- admission ----------------------------------------------------------------------------------------


@dataclass
class _Gpu:
    total: int = 0
    used: int = 0
    #: used when none of ours ran (idle workers, neighbours)
    base: int = 0
    #: ticket -> footprint of each of ours running here
    running: dict[int, int] = field(default_factory=dict)
    #: a ticket that runs alone here: nothing else of ours is admitted beside it
    alone: int | None = None


class Admission:
    """Where the next evaluation fits (see the module doc). Not thread-safe: the batch calls it
    under its own lock."""

    def __init__(self, policy: MemoryPolicy, gpus: list[int], read: MemoryReader | None) -> None:
        self.policy = policy
        self.read = read if policy.enabled else None
        self.gpus = {g: _Gpu() for g in gpus}
        self.read_at = 0.0
        self.refresh(force=True)

    @property
    def by_memory(self) -> bool:
        return self.read is not None

    def refresh(self, force: bool = False) -> None:
        if self.read is None or (not force and time.monotonic() - self.read_at < self.policy.poll_s):
            return
        self.read_at = time.monotonic()
        try:
            seen = self.read()
        except Exception:
            return  # the last figures stand until the arbiter answers again
        for g, gpu in self.gpus.items():
            mem = seen.get(g)
            if mem is None:
                continue
            gpu.total, gpu.used = mem.total, mem.used
            # used below the base: something of it was given back (a worker the pool let go), so
            # the base was that much too high, even while ours run and count in ``used``
            gpu.base = mem.used if not gpu.running else min(gpu.base, mem.used)

    def available(self, g: int) -> int | None:
        """Bytes an evaluation may still be admitted with on ``g`` (None: memory not known)."""
        gpu = self.gpus[g]
        if self.read is None or not gpu.total:
            return None
        committed = max(gpu.used, gpu.base + sum(gpu.running.values()))
        return gpu.total - self.policy.reserve_mb * MiB - committed

    def place(
        self, need: int, gpu: int | None, alone: bool, waited_s: float, shrink: int = 0
    ) -> tuple[int, int | None] | None:
        """``(gpu, bytes available there)`` for an evaluation of footprint ``need`` (``gpu``: the one
        it asked for), or None: it waits. ``alone``: it runs with none of ours beside it. ``shrink``:
        what ``need`` loses with its timed rounds' input sets at their least: where the rest fits,
        it starts now with fewer sets rather than wait."""
        options = [g for g in self.gpus if gpu is None or g == gpu]
        if gpu is not None and gpu not in self.gpus:
            options = [gpu]
            self.gpus[gpu] = _Gpu()
        best: tuple[int, int | None] | None = None
        least = need - max(0, shrink)
        for g in sorted(options, key=lambda g: (len(self.gpus[g].running), -(self.available(g) or 0), g)):
            state = self.gpus[g]
            if state.alone is not None or (alone and state.running):
                continue
            free = self.available(g)
            if free is None or free >= need:
                return g, free
            if best is None and free >= least:
                best = (g, free)  # fits with its input sets shrunk to what is free
            if not state.running and waited_s >= self.policy.max_wait_s and best is None:
                best = (g, free)  # waited long enough: alone, and the input sets shrunk to what is free
        return best

    def start(self, ticket: int, g: int, need: int, alone: bool, free: int | None = None) -> None:
        """``ticket`` runs on ``g``, counted at ``need`` (or at ``free``, where it was admitted short
        and its input sets shrink to that)."""
        state = self.gpus[g]
        state.running[ticket] = need if free is None else max(0, min(need, free))
        if alone:
            state.alone = ticket

    def finish(self, ticket: int, g: int) -> None:
        state = self.gpus[g]
        state.running.pop(ticket, None)
        if state.alone == ticket:
            state.alone = None

    def budget_mb(self, need: int, free: int | None, sets: int = 0) -> int:
        """MiB a round's input sets may take in the judge: the default where the footprint fits,
        less where it was admitted short. ``sets``: their part of ``need`` where it was measured
        (two rounds' worth: the next round's sets are made before the last's are freed), else
        twice the default; each round gives up half of what the footprint lacks."""
        if free is None or free >= need:
            return INPUT_SETS // MiB
        return max(LEAST_SETS // MiB, ((sets or 2 * INPUT_SETS) - (need - free)) // 2 // MiB)

    @staticmethod
    def shrinkable(sets: int, least: int) -> int:
        """What a footprint whose input sets take ``sets`` loses with them at their least: the
        judge's budget at :data:`LEAST_SETS`, or one set a round (``least``: two rounds' worth)."""
        return max(0, sets - max(2 * LEAST_SETS, least))
