"""Prometheus metrics of the node arbiter, labelled by user and GPU, on one HTTP endpoint.

Counters and the wait histogram are updated from the scheduler's finished-region hook
(:meth:`ArbiterMetrics.region_finished`, on the event loop; prometheus_client's metrics are
thread-safe). Gauges describe a :class:`Snapshot` of the queues, holders and sessions that the
event loop takes (:meth:`ArbiterMetrics.refresh`) every telemetry period and at each region's
end, so that the HTTP thread that answers a scrape never reads the scheduler's live state.

Served by ``prometheus_client.start_http_server`` with a registry of its own when
``Arbiter.metrics_port`` is set (``Arbiter.metrics_addr``, default 127.0.0.1); the module needs
``prometheus_client`` (the ``jupyter`` extra), and the arbiter refuses to start without it.

Series (``outcome``: completed, expired, revoked, failed, withdrawn; see
:attr:`krex_lab.region_report.RegionReport.outcome`)::

    krex_regions_total{user,gpu,outcome}            counter
    krex_region_hold_seconds_total{user,gpu}        counter
    krex_degraded_regions_total{user,gpu}           counter
    krex_region_wait_seconds{gpu}                   histogram (granted regions)
    krex_sessions{user,gpu}                         gauge
    krex_queue_length{gpu}                          gauge
    krex_gpu_held{gpu}                              gauge (0/1)
    krex_history_dropped_total, krex_history_write_failures_total   counters (history database)
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..region_report import RegionReport

if TYPE_CHECKING:
    from .history import RegionHistory
    from .region import Region
    from .sessions import Session

#: wait for a region: from sub-millisecond (a free GPU) to minutes (a queue)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass(frozen=True)
class Snapshot:
    """The gauges' values at one moment, taken on the event loop."""

    gpus: tuple[int, ...] = ()
    sessions: dict[tuple[str, int], int] = field(default_factory=dict)
    queues: dict[int, int] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)


def snapshot(
    active: dict[int, Region | None], queues: dict[int, collections.deque[Region]], sessions: Iterable[Session]
) -> Snapshot:
    """The gauges of the scheduler's ``active`` and ``queues`` and the session table."""
    from .region import RegionState

    per_user: collections.Counter[tuple[str, int]] = collections.Counter((s.user, s.gpu) for s in sessions)
    return Snapshot(
        gpus=tuple(sorted(active)),
        sessions=dict(per_user),
        queues={g: len(q) for g, q in queues.items()},
        held={g: int(r is not None and r.state is RegionState.HELD) for g, r in active.items()},
    )


class _Gauges(Collector):
    def __init__(self, metrics: ArbiterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self.metrics.current  # one reference read: the loop swaps whole snapshots
        sessions = GaugeMetricFamily("krex_sessions", "Sessions registered with the arbiter", labels=("user", "gpu"))
        for (user, gpu), n in sorted(snap.sessions.items()):
            sessions.add_metric([user, str(gpu)], float(n))
        yield sessions
        queue = GaugeMetricFamily("krex_queue_length", "Regions waiting for the GPU", labels=("gpu",))
        held = GaugeMetricFamily("krex_gpu_held", "1 while a region holds the GPU", labels=("gpu",))
        for g in snap.gpus:
            queue.add_metric([str(g)], float(snap.queues.get(g, 0)))
            held.add_metric([str(g)], float(snap.held.get(g, 0)))
        yield queue
        yield held
        history = self.metrics.history
        if history is not None:
            dropped = CounterMetricFamily(
                "krex_history_dropped", "Finished regions not recorded: the history writer's queue was full"
            )
            dropped.add_metric([], float(history.dropped))
            yield dropped
            failed = CounterMetricFamily(
                "krex_history_write_failures", "Finished regions the history database failed to store"
            )
            failed.add_metric([], float(history.failed))
            yield failed


class ArbiterMetrics:
    """The arbiter's metrics in a registry of their own (never prometheus_client's global one)."""

    def __init__(self, history: RegionHistory | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.history = history
        self.current = Snapshot()
        self.regions = Counter(
            "krex_regions",
            "Finished regions by outcome (completed, expired, revoked, failed, withdrawn)",
            ("user", "gpu", "outcome"),
            registry=self.registry,
        )
        self.hold = Counter(
            "krex_region_hold_seconds", "Seconds regions held their GPU", ("user", "gpu"), registry=self.registry
        )
        self.degraded = Counter(
            "krex_degraded_regions",
            "Regions whose report says DEGRADED (something not drained, frozen or isolated)",
            ("user", "gpu"),
            registry=self.registry,
        )
        self.wait = Histogram(
            "krex_region_wait_seconds",
            "Seconds a granted region waited in its GPU's queue",
            ("gpu",),
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(self))
        self._server: Any = None

    def region_finished(self, report: RegionReport) -> None:
        user, gpu = report.user, str(report.gpu)
        self.regions.labels(user, gpu, report.outcome).inc()
        if report.hold_s is not None and report.hold_s > 0:
            self.hold.labels(user, gpu).inc(report.hold_s)
        if report.degraded:
            self.degraded.labels(user, gpu).inc()
        if report.granted and report.wait_s is not None:
            self.wait.labels(gpu).observe(report.wait_s)

    def refresh(self, snap: Snapshot) -> None:
        self.current = snap

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP from a thread of prometheus_client's."""
        self._server = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        server = self._server[0] if isinstance(self._server, tuple) else None
        if server is not None:
            server.shutdown()
            server.server_close()
        self._server = None
