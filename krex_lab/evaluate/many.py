"""Many evaluations over every GPU of the node: ``evaluate_many`` and the engine under
``krex eval --batch``.

Pairs wait in one queue. The engine starts the next one when fewer than ``jobs`` run and it fits
(:mod:`.admission`): on the GPU with the fewest of ours running (then the most memory free), or
on the GPU the pair asked for. The pool is sized to the jobs per GPU (``PoolClient.size``), and
an evaluation starts on the first worker free, not when every worker is up. An out-of-memory
that was not the candidate's own sends the pair back to the queue (to run alone on its GPU);
whatever happens, every pair gets exactly one result, given to ``emit`` as it finishes.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

from .admission import Admission, GiB, MemoryPolicy, arbiter_memory, oom_cause, oom_figures
from .judge.footprint import MIN_ALLOWANCE
from .options import EvaluateOptions
from .pairs import PAIR_OPTIONS, BatchRecord, Pair, Progress, error_result
from .result import Evaluation

if TYPE_CHECKING:
    from ..workers.client import PoolClient

__all__ = ["evaluate_many", "run_pairs"]

#: evaluations at once per GPU where the caller does not say (memory admission bounds them too)
PER_GPU = 4


@dataclass
class _Item:
    pair: Pair
    queued_at: float = field(default_factory=time.monotonic)
    attempts: int = 0
    alone: bool = False
    waited_s: float = 0.0
    #: its input sets' part of the footprint it was admitted with (0: not measured)
    sets: int = 0
    #: why it was sent back to the queue, one line a time
    requeued: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The problem, for its footprint: the reference and what makes its inputs."""
        o = self.pair.options
        return f"{self.pair.reference}|{o.get('format', '')}|{o.get('tests')!r}|{o.get('benchmarks')!r}"


def _gpus_of(pool: PoolClient | None) -> list[int]:
    if pool is None:
        return []
    try:
        return sorted(g.index for g in pool.status().gpus)
    except Exception:
        return list(getattr(pool.info, "gpus", None) or [])


class _Engine:
    def __init__(
        self,
        pairs: Sequence[Pair],
        *,
        jobs: int,
        defaults: EvaluateOptions,
        pool: PoolClient | None,
        emit: Callable[[BatchRecord], None],
        bar: Progress,
        policy: MemoryPolicy,
        gpus: list[int],
    ) -> None:
        self.jobs, self.defaults, self.pool, self.emit, self.bar = max(1, jobs), defaults, pool, emit, bar
        self.policy = policy
        self.queue: deque[_Item] = deque(_Item(p) for p in pairs)
        self.running = 0
        self.cond = threading.Condition()
        self.footprints: dict[str, int] = {}
        #: the input sets' part of each measured footprint, and what of it stays at their least
        self.input_sets: dict[str, int] = {}
        self.sets_least: dict[str, int] = {}
        self.cancelled = False
        self.admission = Admission(policy, gpus, arbiter_memory(pool) if pool is not None and gpus else None)
        self._tickets = 0
        #: the pool's workers per GPU the batch asks for, and the fewer it let the pool keep (memory)
        self.per_gpu = math.ceil(self.jobs / len(gpus)) if gpus else self.jobs
        self.capped: int | None = None
        #: when the last evaluation was admitted, or workers given back (the batch's start at first)
        self.moved_at = time.monotonic()

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="krex-eval") as ex, self.cond:
            while self.queue or self.running:
                if self.cancelled:
                    while self.queue:
                        item = self.queue.popleft()
                        self._deliver(item, error_result(item.pair, "cancelled before it started"), None)
                    if not self.running:
                        break
                else:
                    self.admission.refresh()
                    self.bar.waiting(*self._admit(ex))
                self.cond.wait(timeout=self.policy.poll_s)

    def _admit(self, ex: ThreadPoolExecutor) -> tuple[int, str]:
        """Start what fits; returns how many wait for memory, and what the first of them needs."""
        waiting, detail = 0, ""
        now = time.monotonic()
        for item in list(self.queue):
            if self.running >= self.jobs:
                break
            pair = item.pair
            if pair.problem is not None or not self.admission.gpus:
                self.queue.remove(item)
                self._start(ex, item, None, 0, None)
                continue
            need = self.footprints.get(item.key)
            if need is None:  # not measured yet: the largest measured so far, at least the policy's guess
                need = max([self.policy.unknown_footprint_mb << 20, *self.footprints.values()])
            given = pair.options.get("gpu", self.defaults.gpu)
            gpu = given if isinstance(given, int) else None
            sets = self.input_sets.get(item.key, 0) if item.key in self.footprints else 0
            shrink = self.admission.shrinkable(sets, self.sets_least.get(item.key, 0)) if sets else 0
            placed = self.admission.place(need, gpu, item.alone, now - item.queued_at, shrink)
            if placed is None:
                if not waiting:
                    detail = self._wants(need, now - item.queued_at) + self._give_back(now, need)
                waiting += 1
                if now - item.queued_at >= self.policy.max_wait_s:
                    break  # waited long enough: no pair behind it starts, so that a GPU drains for it
                continue
            self.queue.remove(item)
            item.waited_s += now - item.queued_at
            item.sets = sets
            self._start(ex, item, placed[0], need, placed[1])
        return waiting, detail

    def _give_back(self, now: float, need: int) -> str:
        """Nothing admitted for a while, the first waiting pair needing more memory than any GPU
        has free: let the pool keep half as many workers per GPU (at least what runs, and 1), so
        that the idle ones' contexts give their memory back (:attr:`MemoryPolicy.give_back_workers`).
        A pair that waits behind one running alone waits for that one, not for memory: nothing is
        given back for it. Returns a note for the progress line."""
        note = f"; {self.capped} worker(s) a GPU kept, the others' memory given back" if self.capped else ""
        if not self.policy.give_back_workers or self.pool is None or not self.admission.by_memory:
            return note
        if now - self.moved_at < self.policy.give_back_after_s:
            return note
        free = [f for f in map(self.admission.available, self.admission.gpus) if f is not None]
        if not free or max(free) >= need:
            return note
        now_per_gpu = self.capped or self.per_gpu
        running = max((len(g.running) for g in self.admission.gpus.values()), default=0)
        target = max(1, running, now_per_gpu // 2)
        if target >= now_per_gpu:
            return note
        try:
            self.pool.size(target, cap=True)
        except Exception:
            return note
        self.capped, self.moved_at = target, now
        self.jobs = min(self.jobs, target * len(self.admission.gpus))
        return f"; {target} worker(s) a GPU kept, the others' memory given back"

    def _wants(self, need: int, waited_s: float) -> str:
        free = [f for f in map(self.admission.available, self.admission.gpus) if f is not None]
        most = f", at most {max(free) / GiB:.2f} GiB free" if free else ""
        return f"the first needs {need / GiB:.2f} GiB{most}; waited {waited_s:.0f} s of {self.policy.max_wait_s:.0f}"

    def _start(self, ex: ThreadPoolExecutor, item: _Item, gpu: int | None, need: int, free: int | None) -> None:
        self._tickets += 1
        ticket = self._tickets
        if gpu is not None:
            self.admission.start(ticket, gpu, need, item.alone, free)
        self.running += 1
        item.attempts += 1
        self.moved_at = time.monotonic()
        ex.submit(self._one, item, ticket, gpu, need, free)

    # -- one evaluation (in its thread) ------------------------------------------------------------
    def _one(self, item: _Item, ticket: int, gpu: int | None, need: int, free: int | None) -> None:
        ev: Evaluation | None = None
        try:
            ev = self._evaluate(item.pair, gpu, need, free, item.sets)
        except BaseException as exc:  # never a pair without its result
            ev = error_result(item.pair, f"{type(exc).__name__}: {exc}")
        finally:
            with self.cond:
                self.running -= 1
                if gpu is not None:
                    self.admission.finish(ticket, gpu)
                try:
                    settled = self._settle(item, ev or error_result(item.pair, "no result"), gpu, need, free)
                except Exception as exc:  # the engine's own failure costs no pair its result
                    settled = error_result(item.pair, f"{type(exc).__name__}: {exc}")
                try:
                    if settled is not None:
                        self._deliver(item, settled, gpu, need, free)
                finally:
                    self.cond.notify_all()

    def _evaluate(self, pair: Pair, gpu: int | None, need: int, free: int | None, sets: int = 0) -> Evaluation:
        from .api import evaluate

        if pair.problem is not None:
            return error_result(pair, pair.problem, "manifest_error")
        over = dict(pair.options)
        if gpu is not None:
            over["gpu"] = gpu
            if self.admission.by_memory:
                over["memory_budget_mb"] = self.admission.budget_mb(need, free, sets)
        return evaluate(pair.reference, pair.candidate, options=self.defaults.merged(over), pool=self.pool)

    def _settle(self, item: _Item, ev: Evaluation, gpu: int | None, need: int, free: int | None) -> Evaluation | None:
        """Learn its footprint; send it back to the queue (None), or give the result to deliver."""
        measured = ev.metadata.get("memory")
        if isinstance(measured, dict) and str(measured.get("footprint", "")).isdigit():
            footprint = int(measured["footprint"])
            if str(measured.get("judge_peak", "")).isdigit() and str(measured.get("candidate_allowance", "")).isdigit():
                # what the judge's side took, as it ran, where that is more than the estimate said
                footprint = max(footprint, int(measured["judge_peak"]) + int(measured["candidate_allowance"]))
            self.footprints[item.key] = max(footprint, self.footprints.get(item.key, 0))
            if str(measured.get("input_sets", "")).isdigit():
                self.input_sets[item.key] = max(int(measured["input_sets"]), self.input_sets.get(item.key, 0))
            if str(measured.get("input_sets_least", "")).isdigit():
                self.sets_least[item.key] = max(int(measured["input_sets_least"]), self.sets_least.get(item.key, 0))
        allowance = MIN_ALLOWANCE
        if isinstance(measured, dict) and str(measured.get("candidate_allowance", "")).isdigit():
            allowance = int(measured["candidate_allowance"])
        cause = oom_cause(ev, allowance) if gpu is not None else None
        if cause == "elsewhere" and item.attempts < self.policy.attempts and not self.cancelled:
            why = str(ev.metadata.get("out_of_memory") or ev.metadata.get("reference_error") or "")
            why = why or str(ev.metadata.get("evaluation_error", ""))
            first = (why.strip().splitlines() or ["out of memory"])[0][:200]
            item.requeued.append(f"attempt {item.attempts} on GPU {gpu}: {first}")
            item.alone, item.queued_at = True, time.monotonic()
            self.queue.appendleft(item)
            return None
        if cause == "elsewhere":  # still someone else's memory: never the candidate's verdict
            free_gib = f"{free / 2**30:.2f} GiB" if free is not None else "an unknown amount"
            note = (
                f"GPU {gpu} ran out of memory in each of {item.attempts} attempts (after the first, alone among "
                f"this batch's evaluations; {free_gib} free when admitted), on the judge's side or below the "
                "candidate's allowance: the reference or other processes needed more than was free, not the "
                "candidate"
            )
            ev.metadata["out_of_memory_elsewhere"] = note + "; " + "; ".join(item.requeued)
            ev.verdict, ev.correctness = "error", False
            ev.summary = f"error: {note}"
        elif cause == "candidate":
            ev.metadata["out_of_memory_figures"] = oom_figures(ev, allowance, free)
        return ev

    def _deliver(self, item: _Item, ev: Evaluation, gpu: int | None, need: int = 0, free: int | None = None) -> None:
        if gpu is not None:
            ev.metadata["admission"] = {
                "gpu": gpu,
                "footprint_bytes": need,
                "free_bytes": free,
                "waited_for_memory_s": round(item.waited_s, 3),
                "attempts": item.attempts,
                **({"requeued": item.requeued} if item.requeued else {}),
                **({"workers_per_gpu_kept": self.capped} if self.capped else {}),
            }
        pair = item.pair
        record = BatchRecord(
            index=pair.index, id=pair.id if pair.id is not None else pair.candidate, **msgspec.structs.asdict(ev)
        )
        try:
            self.emit(record)
        finally:
            self.bar.update(ev.verdict)


def run_pairs(
    pairs: Sequence[Pair],
    *,
    jobs: int,
    defaults: EvaluateOptions,
    pool: PoolClient | None,
    emit: Callable[[BatchRecord], None],
    progress: TextIO | None = None,
    memory: MemoryPolicy | None = None,
    gpus: list[int] | None = None,
    cancel: threading.Event | None = None,
) -> Counter[str]:
    """Evaluate ``pairs`` (``jobs`` at once, over ``gpus``: default every GPU the pool serves);
    ``emit`` each result as it finishes, exactly once per pair. Returns the count of each verdict."""
    bar = Progress(len(pairs), progress or sys.stderr)
    gpus = _gpus_of(pool) if gpus is None else gpus
    engine = _Engine(
        pairs, jobs=jobs, defaults=defaults, pool=pool, emit=emit, bar=bar, policy=memory or MemoryPolicy(), gpus=gpus
    )
    sized = False
    if pool is not None and gpus:
        try:  # the pool keeps as many workers per GPU as the batch runs there
            pool.size(math.ceil(engine.jobs / len(gpus)))
            sized = True
        except Exception:
            pass
    watcher = None
    if cancel is not None:

        def watch() -> None:
            cancel.wait()
            with engine.cond:
                engine.cancelled = True
                engine.cond.notify_all()

        watcher = threading.Thread(target=watch, daemon=True, name="krex-eval-cancel")
        watcher.start()
    try:
        engine.run()
    finally:
        if sized and pool is not None:
            for cap in (False, True) if engine.capped else (False,):
                try:  # the ask ends, and the cap where workers were given back
                    pool.size(0, cap=cap)
                except Exception:
                    pass
        bar.close()
    return bar.verdicts


PairLike = tuple[Any, Any] | Mapping[str, Any]


def _pairs(items: Iterable[PairLike]) -> list[Pair]:
    out: list[Pair] = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            unknown = set(item) - {"reference", "candidate", "id", *PAIR_OPTIONS}
            if unknown or "reference" not in item or "candidate" not in item:
                problem = f"pair {i}: needs reference and candidate" + (
                    f"; unknown keys {sorted(unknown)}" if unknown else ""
                )
                out.append(Pair(index=i, line=i, problem=problem))
                continue
            opts = {k: item[k] for k in PAIR_OPTIONS if k in item}
            pid = item.get("id")
            try:
                EvaluateOptions.of(opts)
            except ValueError as exc:
                out.append(Pair(index=i, line=i, problem=f"pair {i}: {exc}"))
                continue
            out.append(
                Pair(
                    index=i,
                    line=i,
                    reference=item["reference"],
                    candidate=item["candidate"],
                    id=None if pid is None else str(pid),
                    options=opts,
                )
            )
        else:
            try:
                ref, cand = item
            except (TypeError, ValueError):
                out.append(Pair(index=i, line=i, problem=f"pair {i}: not (reference, candidate)"))
                continue
            out.append(Pair(index=i, line=i, reference=ref, candidate=cand))
    return out


def evaluate_many(
    pairs: Iterable[PairLike],
    *,
    jobs: int | None = None,
    per_gpu: int = PER_GPU,
    memory: MemoryPolicy | None = None,
    pool: PoolClient | None = None,
    on_result: Callable[[BatchRecord], None] | None = None,
    progress: TextIO | None = None,
    **options: Any,
) -> Iterator[BatchRecord]:
    """Evaluate every ``(reference, candidate)`` pair over every GPU of the node; yield each
    result as it finishes (a :class:`~.batch.BatchRecord`: the :class:`Evaluation`, its ``index``
    in ``pairs`` and its ``id``), exactly one per pair whatever happens.

    A pair is ``(reference, candidate)`` (paths or source text) or a mapping with ``reference``,
    ``candidate``, ``id`` and any option a batch manifest line may set (``format``, ``gpu``,
    ``timing``, ...). ``options``: :func:`krex_lab.evaluate`'s, the defaults of every pair.
    ``jobs``: evaluations at once (default ``per_gpu`` per GPU the pool serves); the pool is sized
    to them. ``memory``: how they are admitted by GPU memory (:class:`~.admission.MemoryPolicy`).
    ``on_result``: also called with each result, in the engine's thread, as it finishes.
    ``progress``: a stream for the progress line (shown when it is a terminal).

    Stopping the iteration early (``break``, ``close()``) starts no further pair; those running
    finish first. A bad option raises ValueError before anything runs.
    """
    defaults = EvaluateOptions.of(options)
    listed = _pairs(pairs)
    if pool is None:
        from ..workers.client import default_client

        pool = default_client()
    gpus = _gpus_of(pool)
    n = jobs if jobs is not None else per_gpu * max(1, len(gpus))
    if n < 1:
        raise ValueError(f"jobs must be >= 1, not {n}")
    results: queue.Queue[BatchRecord | None] = queue.Queue()
    cancel = threading.Event()

    def emit(record: BatchRecord) -> None:
        results.put(record)
        if on_result is not None:
            try:
                on_result(record)
            except Exception:
                pass  # the caller's callback never costs a result

    def drive() -> None:
        try:
            run_pairs(
                listed,
                jobs=n,
                defaults=defaults,
                pool=pool,
                emit=emit,
                progress=progress,
                memory=memory,
                gpus=gpus,
                cancel=cancel,
            )
        finally:
            results.put(None)

    thread = threading.Thread(target=drive, name="krex-evaluate-many", daemon=True)
    thread.start()
    try:
        while (record := results.get()) is not None:
            yield record
    finally:
        cancel.set()
        thread.join()
