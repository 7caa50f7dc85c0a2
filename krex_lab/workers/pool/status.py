"""What ``PoolStatus`` answers about the dispatcher's state: per GPU its gate, workers and
queue; the queue, the running jobs and the leases; the counters (the rows are
:mod:`krex_lab.workers.wire`'s, as the reply crosses the wire)."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping

from ..wire import DispatcherTable, LeaseRow, PoolGpuRow, QueuedRow, RunningRow
from .handle import WorkerHandle
from .jobs import Gates, Job, Lease


def dispatcher_status(
    *,
    gpus: list[int],
    gates: Gates,
    exclusive_gpus: Mapping[int, str],
    workers: Iterable[WorkerHandle],
    queue: list[Job],
    jobs: Iterable[Job],
    leases: Iterable[Lease],
    counters: collections.Counter[str],
    ready: bool,
) -> DispatcherTable:
    workers = list(workers)
    return DispatcherTable(
        gpus=[
            PoolGpuRow(
                index=g,
                gate="open" if gates.is_open(g) else "closed",
                holder_pid=gates.holder_pid(g),
                exclusive_job=exclusive_gpus.get(g),
                workers=[w.public() for w in workers if w.gpu == g],
                queued=sum(1 for j in queue if j.gpu == g),
            )
            for g in gpus
        ],
        queue=[
            QueuedRow(
                job=j.id,
                kind=j.kind,
                gpu=j.gpu,
                lease=j.lease,
                waiting_s=round(time.time() - j.submitted, 3),
            )
            for j in queue
        ],
        running=[
            RunningRow(
                job=j.id,
                kind=j.kind,
                worker=j.worker.id,
                pid=j.worker.pid,
                gpu=j.worker.gpu,
                lease=j.lease,
                running_s=round(time.time() - (j.dispatched or 0), 3),
            )
            for j in jobs
            if j.worker is not None
        ],
        leases=[
            LeaseRow(
                lease=le.key,
                owner_pid=le.owner_pid,
                worker=le.worker.id if le.worker else None,
                gpu=le.gpu,
                pending=le.pending,
            )
            for le in leases
        ],
        counters=dict(counters),
        ready=ready,
    )
