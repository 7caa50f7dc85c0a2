"""Evaluations as Ray tasks: placed by Ray's scheduler, run on that node's warm context worker,
timed inside a region of that node's arbiter; results yielded as they finish (``ray.wait``).

Each evaluation takes a fraction of the node's GPU resource (``krex_gpu`` on the fake backend,
``GPU`` on real ones), so that several share a GPU: their set-up runs side by side on the pool's
workers and only the timing loops take turns, one region at a time per GPU. A task whose node
dies is retried by Ray on another node (``max_retries``), and so is one that finds its node's
pool or arbiter gone (``retry_exceptions``); the result says which attempt it was and where it ran.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import ray

from krex_lab.errors import ArbiterUnavailable, PoolUnavailable, WorkerDied
from krex_lab.region_report import RegionReport

from .candidate import Candidate, CandidateRun, run_candidate
from .cluster import _local, _local_lock, local_node, start_nodes
from .node import NodeConfig
from .progress import make_progress

if TYPE_CHECKING:
    from krex_lab.workers.client import PoolClient

#: failures of a node's KREX services: the task is retried (by Ray, on whichever node it picks)
RETRIED = (PoolUnavailable, ArbiterUnavailable)


@dataclasses.dataclass
class EvalResult:
    """One candidate's result, returned exactly once.

    ``times``: the timed calls in seconds (inside the region). ``region``: the region's report
    (``granted_at`` / ``released_at``, what was frozen, degraded, ``simulated``). ``node`` /
    ``node_id`` / ``hostname``: where the returned attempt ran; ``attempt``: Ray's attempt number
    (0: first try; > 0: earlier attempts were lost with their node or its services).
    """

    index: int
    name: str
    key: Any = None
    ok: bool = False
    times: list[float] = dataclasses.field(default_factory=list)
    value: str | None = None
    error: str | None = None
    traceback: str | None = None
    node: str | None = None
    node_id: str | None = None
    hostname: str | None = None
    gpu: int | None = None
    attempt: int | None = None
    region: RegionReport = dataclasses.field(default_factory=RegionReport)
    worker_pid: int | None = None
    task_pid: int | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def best(self) -> float | None:
        return min(self.times) if self.times else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def retried(self) -> bool:
        return bool(self.attempt)


def _attempt() -> int | None:
    try:  # Ray has no public accessor for it (2.x)
        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number())
    except Exception:
        return None


_pools: dict[str, PoolClient] = {}


def _pool(endpoint: str) -> PoolClient:
    from krex_lab.workers.client import PoolClient

    with _local_lock:
        client = _pools.get(endpoint)
        if client is None or client._closed:
            client = _pools[endpoint] = PoolClient.connect(endpoint, start=False)
        return client


def _forget(node_id: str, endpoint: str | None) -> None:
    with _local_lock:
        _local.pop(node_id, None)
        client = _pools.pop(endpoint or "", None)
    if client is not None:
        client.close()


def evaluate_one(index: int, candidate: Candidate, config: NodeConfig, gpu: int | None = None) -> EvalResult:
    """The body of an evaluation task (on whichever node Ray placed it)."""
    import os

    info = local_node(config)
    if gpu is None and config.resource == "GPU":
        ids = ray.get_gpu_ids()
        gpu = int(ids[0]) if ids else None
    result = EvalResult(
        index=index,
        name=candidate.name or getattr(candidate.fn, "__name__", "candidate"),
        key=candidate.key,
        node=info.node,
        node_id=info.node_id,
        hostname=info.hostname,
        attempt=_attempt(),
        task_pid=os.getpid(),
    )
    try:
        client = _pool(info.pool_endpoint)
        run: CandidateRun = client.call(run_candidate, candidate, gpu=gpu)
    except WorkerDied as exc:
        # The candidate crashed its worker (a result), unless the pool itself is gone (retried).
        try:
            client = _pool(info.pool_endpoint)
            client.status()
        except PoolUnavailable:
            _forget(info.node_id, info.pool_endpoint)
            raise PoolUnavailable(f"the pool of node {info.node} is gone: {exc}") from exc
        result.error, result.traceback = f"WorkerDied: {exc}", getattr(exc, "traceback", None)
        return result
    except RETRIED:
        _forget(info.node_id, info.pool_endpoint)
        raise
    result.ok, result.times, result.value, result.error, result.traceback = (
        run.ok,
        run.times,
        run.value,
        run.error,
        run.traceback,
    )
    result.gpu, result.worker_pid, result.started_at, result.finished_at = (
        run.gpu,
        run.worker_pid,
        run.started_at,
        run.finished_at,
    )
    if run.region is not None:
        result.region = run.region
    return result


_task = ray.remote(evaluate_one)


def submit(
    candidates: Iterable[Candidate],
    *,
    config: NodeConfig | None = None,
    fraction: float = 0.5,
    max_retries: int = 3,
    spread: bool = True,
) -> dict[Any, tuple[int, Candidate]]:
    """Submit one task per candidate; ``{ObjectRef: (index, candidate)}``. See :func:`evaluate`."""
    config = config or NodeConfig()
    # SPREAD: a batch uses every node's GPUs at once (Ray's default packs a node first)
    strategy = "SPREAD" if spread else "DEFAULT"
    if config.resource == "GPU":
        task = _task.options(
            num_cpus=0,
            scheduling_strategy=strategy,
            max_retries=max_retries,
            retry_exceptions=list(RETRIED),
            num_gpus=fraction,
        )
    else:
        task = _task.options(
            num_cpus=0,
            scheduling_strategy=strategy,
            max_retries=max_retries,
            retry_exceptions=list(RETRIED),
            resources={config.resource: fraction},
        )
    return {task.remote(i, c, config): (i, c) for i, c in enumerate(candidates)}


def _failed(index: int, candidate: Candidate, exc: BaseException) -> EvalResult:
    return EvalResult(
        index=index,
        name=candidate.name or getattr(candidate.fn, "__name__", "candidate"),
        key=candidate.key,
        ok=False,
        error=f"not evaluated: {type(exc).__name__}: {exc}".splitlines()[0][:500],
    )


_started: set[NodeConfig] = set()
_started_lock = threading.Lock()


def evaluate(
    candidates: Iterable[Candidate],
    *,
    config: NodeConfig | None = None,
    fraction: float = 0.5,
    max_retries: int = 3,
    spread: bool = True,
    progress: bool | None = None,
    desc: str = "krex evaluations",
    timeout: float | None = None,
) -> Iterator[EvalResult]:
    """Evaluate ``candidates`` across the cluster; yield each result as it finishes (any order).

    Every candidate yields exactly one :class:`EvalResult`: its own failure (``ok`` False, with the
    remote traceback), or ``not evaluated: ...`` once Ray gave up (retries spent). ``fraction``: of
    a GPU per evaluation (Ray's resource: ``1/fraction`` evaluations share a GPU at once).
    ``progress``: a bar (notebook widget, tqdm, or a plain line; None: only on a terminal or in a
    notebook). ``timeout``: seconds to wait for the whole batch, then :class:`TimeoutError` (the
    tasks not yet finished are cancelled). Connects to Ray (``ray.init()``) if not yet connected,
    and starts the node services that are missing (:func:`~.cluster.start_nodes`) the first time.
    """
    config = config or NodeConfig()
    if not ray.is_initialized():
        ray.init(namespace="krex", log_to_driver=False)
    with _started_lock:
        first = config not in _started
        _started.add(config)
    if first:
        start_nodes(config)
    refs = submit(candidates, config=config, fraction=fraction, max_retries=max_retries, spread=spread)
    import sys

    if progress is None:
        progress = sys.stderr.isatty() or "ipykernel" in sys.modules
    bar = make_progress(len(refs), desc) if progress else None
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(refs)
    try:
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                raise TimeoutError(f"{len(pending)} of {len(refs)} evaluations not finished within {timeout} s")
            for ref in done:
                index, candidate = refs[ref]
                try:
                    result = ray.get(ref)
                except Exception as exc:  # retries spent, or the task was cancelled
                    result = _failed(index, candidate, exc)
                if bar is not None:
                    bar.update(failed=not result.ok, retried=result.retried)
                yield result
    finally:
        for ref in pending:  # a consumer that stopped early, or a timeout: nothing left running
            ray.cancel(ref)
        if bar is not None:
            bar.close()
