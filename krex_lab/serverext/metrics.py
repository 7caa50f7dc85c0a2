"""Prometheus metrics of the node, built from the arbiter's status and its regions history.

Gauges describe the moment of the scrape (per GPU: sessions, queue length, holder present,
gate closed, memory). Counters and histograms accumulate finished regions: every scrape reads
the arbiter's recent history and counts each region once (keyed by arbiter instance and region
id), so they stay monotonic as long as scrapes come faster than the history (200 regions by
default) turns over.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..node_status import ArbiterRow, NodeStatus
from ..region_report import RegionReport
from .processes import ServicesInfo

#: wait for a region (queue): from sub-millisecond to minutes
WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
#: acquire = gate + drain + freeze + isolate
ACQUIRE_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
HOLD_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class RegionStats(Collector):
    """Counters and histograms of finished regions, fed from the arbiter's history."""

    def __init__(self) -> None:
        labels = ("gpu",)
        self.regions = Counter(
            "krex_regions", "Finished regions (granted or withdrawn) by outcome", ("gpu", "outcome"), registry=None
        )
        self.degraded = Counter(
            "krex_regions_degraded",
            "Regions whose report says DEGRADED (something not drained, frozen or isolated)",
            labels,
            registry=None,
        )
        self.frozen = Counter("krex_region_frozen_processes", "Processes stopped by regions", labels, registry=None)
        self.intruders = Counter(
            "krex_region_intruders", "Processes that appeared on a GPU during a region", labels, registry=None
        )
        self.wait = Histogram(
            "krex_region_wait_seconds",
            "Time a region waited in its GPU's queue",
            labels,
            buckets=WAIT_BUCKETS,
            registry=None,
        )
        self.acquire = Histogram(
            "krex_region_acquire_seconds",
            "Gate + drain + freeze + isolate time of a region",
            labels,
            buckets=ACQUIRE_BUCKETS,
            registry=None,
        )
        self.hold = Histogram(
            "krex_region_hold_seconds", "How long a region was held", labels, buckets=HOLD_BUCKETS, registry=None
        )
        self._seen: set[tuple[int, float, str]] = set()
        self._lock = threading.Lock()

    def observe(self, arbiter: ArbiterRow, reports: Iterable[RegionReport]) -> int:
        """Count the reports not seen before; returns how many were new."""
        instance = (arbiter.pid, arbiter.started)
        new = 0
        with self._lock:
            current = set()
            for r in reports:
                key = (*instance, r.region)
                current.add(key)
                if key in self._seen:
                    continue
                new += 1
                gpu = str(r.gpu)
                self.regions.labels(gpu, r.outcome).inc()
                if r.degraded:
                    self.degraded.labels(gpu).inc()
                self.frozen.labels(gpu).inc(len(r.frozen))
                self.intruders.labels(gpu).inc(len(r.intruders))
                for hist, seconds in ((self.wait, r.wait_s), (self.acquire, r.acquire_s), (self.hold, r.hold_s)):
                    if seconds is not None:
                        hist.labels(gpu).observe(seconds)
            # Keep only what the history still holds: it only slides forward.
            self._seen = {k for k in self._seen if k[:2] != instance} | current
        return new

    def collect(self) -> Iterator[Metric]:
        for m in (self.regions, self.degraded, self.frozen, self.intruders, self.wait, self.acquire, self.hold):
            yield from m.collect()


class Snapshot(Collector):
    """Gauges of one status snapshot (or ``krex_arbiter_up 0`` when none answered)."""

    def __init__(self, status: NodeStatus | None, services: ServicesInfo) -> None:
        self.status = status
        self.services = services

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("krex_arbiter_up", "1 when the arbiter answered this scrape")
        up.add_metric([], 1.0 if self.status else 0.0)
        yield up
        pool = GaugeMetricFamily("krex_pool_up", "1 when this server's pool service is running")
        pool.add_metric([], 1.0 if self.services.pool else 0.0)
        yield pool
        if not self.status:
            return
        a = self.status.arbiter
        info = GaugeMetricFamily(
            "krex_arbiter_info",
            "The arbiter's backend (simulated=true: fake backend, no real GPU)",
            labels=("backend", "simulated", "lock_capable"),
        )
        info.add_metric(
            [
                str(a.backend),
                str(a.simulated).lower(),
                str(a.capabilities.lock).lower(),
            ],
            1.0,
        )
        yield info
        sessions_total = GaugeMetricFamily("krex_sessions", "Sessions registered with the arbiter")
        sessions_total.add_metric([], float(a.sessions))
        yield sessions_total
        labels = ("gpu", "name")
        fams = {
            "sessions": GaugeMetricFamily("krex_gpu_sessions", "Sessions placed on the GPU", labels=labels),
            "kernels": GaugeMetricFamily(
                "krex_gpu_kernel_sessions", "Notebook kernels placed on the GPU", labels=labels
            ),
            "queue": GaugeMetricFamily("krex_gpu_queue_length", "Regions waiting for the GPU", labels=labels),
            "holder": GaugeMetricFamily("krex_gpu_holder_present", "1 while a region holds the GPU", labels=labels),
            "held": GaugeMetricFamily(
                "krex_gpu_holder_held_seconds", "How long the current region has held the GPU", labels=labels
            ),
            "gate": GaugeMetricFamily("krex_gpu_gate_closed", "1 while the GPU's gate is closed", labels=labels),
            "mem_used": GaugeMetricFamily("krex_gpu_memory_used_bytes", "GPU memory in use", labels=labels),
            "mem_total": GaugeMetricFamily("krex_gpu_memory_total_bytes", "GPU memory", labels=labels),
            "util": GaugeMetricFamily(
                "krex_gpu_utilization_ratio", "GPU utilisation (0..1), where the backend reports it", labels=labels
            ),
        }
        for g in self.status.gpus:
            lv = [str(g.index), g.name]
            holder = g.holder
            fams["sessions"].add_metric(lv, float(len(g.sessions)))
            fams["kernels"].add_metric(lv, float(sum(1 for s in g.sessions if s.role == "kernel")))
            fams["queue"].add_metric(lv, float(len(g.queue)))
            fams["holder"].add_metric(lv, 1.0 if holder else 0.0)
            fams["held"].add_metric(lv, float(holder.held_s or 0.0) if holder else 0.0)
            fams["gate"].add_metric(lv, 1.0 if g.gate == "closed" else 0.0)
            fams["mem_used"].add_metric(lv, float(g.memory_used))
            fams["mem_total"].add_metric(lv, float(g.memory_total))
            if g.utilization_gpu is not None:
                fams["util"].add_metric(lv, g.utilization_gpu / 100.0)
        yield from fams.values()


def render(
    stats: RegionStats, status: NodeStatus | None, regions: list[RegionReport] | None, services: ServicesInfo
) -> bytes:
    """The Prometheus text exposition of one scrape."""
    if status is not None and regions is not None:
        stats.observe(status.arbiter, regions)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot(status, services))
    registry.register(stats)
    return generate_latest(registry)
