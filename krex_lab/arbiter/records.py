"""What the arbiter keeps of its regions: the region history database (``Arbiter.history_db``)
and the Prometheus metrics (``Arbiter.metrics_port``), fed by each finished region's report.

Either may be off. A history database that cannot be opened costs the history, never the
arbiter: the error is logged and History requests say why (:meth:`RegionRecords.database`).
``metrics`` needs prometheus_client, imported only when metrics are asked for (``import
krex_lab`` stays cheap, and a node without the package runs an arbiter without metrics).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import KrexError
from ..region_report import RegionReport
from .history import RegionHistory

if TYPE_CHECKING:
    import collections

    from .metrics import ArbiterMetrics
    from .region import Region
    from .sessions import Session

    #: the scheduler's holders and queues and the session table, which the metrics' gauges show
    LiveState = tuple[dict[int, Region | None], dict[int, collections.deque[Region]], Iterable[Session]]

log = logging.getLogger("krex.arbiter")


class RegionRecords:
    """The history database and the metrics of one arbiter (built before the scheduler; ``live``
    is read only once the arbiter serves)."""

    def __init__(
        self,
        db: Path | str,
        *,
        retention_days: float,
        arbiter: str,
        per_user: int,
        metrics: bool,
        live: Callable[[], LiveState],
    ) -> None:
        self.history: RegionHistory | None = (
            RegionHistory(db, retention_days, arbiter=arbiter, per_user=per_user) if db else None
        )
        #: why there is no history (History requests say it)
        self.history_off = "" if db else "this arbiter keeps no region history (Arbiter.history_db is '')"
        self.live = live
        #: per user: when a degraded region was last said, and how many were not said since
        self._degraded: dict[str, tuple[float, int]] = {}
        self.metrics: ArbiterMetrics | None = None
        if metrics:
            try:
                from .metrics import ArbiterMetrics
            except ImportError as exc:
                raise KrexError(
                    f"Arbiter.metrics_port is set but prometheus_client cannot be imported ({exc}): "
                    "install it (pip install prometheus_client, or krex-lab[jupyter]) or set metrics_port=0"
                ) from None
            self.metrics = ArbiterMetrics(self.history)

    def database(self) -> tuple[RegionHistory | None, str]:
        """The history database and, when there is none, why (what History requests read)."""
        return self.history, self.history_off

    def serve_metrics(self, port: int, addr: str) -> None:
        if self.metrics is None:
            return
        try:
            self.metrics.serve(port, addr)
        except OSError as exc:
            raise KrexError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None

    def open(self) -> int | None:
        """Open the history database; the highest region number it holds (None: no history, or it
        could not be opened: that is logged, and History requests say why)."""
        if self.history is None:
            return None
        try:
            self.history.open()
            return self.history.highest_region_number()
        except (OSError, sqlite3.Error, KrexError) as exc:
            self.history_off = f"the region history {self.history.path} could not be opened: {exc}"
            log.error("%s; regions are not recorded", self.history_off)
            self.history = None
            if self.metrics is not None:
                self.metrics.history = None
            return None

    def region_finished(self, report: RegionReport) -> None:
        """Each finished region's report (on the loop: both only enqueue or count)."""
        if report.degraded:
            self._say_degraded(report)
        if self.history is not None:
            self.history.add(report)
        if self.metrics is not None:
            self.metrics.region_finished(report)
            self._snapshot()

    def _say_degraded(self, report: RegionReport) -> None:
        """Say a degraded region where operators look (its timings may be disturbed): at most one
        line a user each :data:`DEGRADED_EVERY` seconds, counting the others (a loop of short
        regions beside an undrainable session degrades every one of them: hundreds of lines a
        second were most of the arbiter's time). The history and the metrics keep every one."""
        now = time.monotonic()
        last, quiet = self._degraded.get(report.user, (-DEGRADED_EVERY, 0))
        if now - last < DEGRADED_EVERY:
            self._degraded[report.user] = (last, quiet + 1)
            return
        if len(self._degraded) > 4096:
            self._degraded.clear()
        self._degraded[report.user] = (now, 0)
        more = f" ({quiet} more of {report.user}'s regions degraded since the last such line)" if quiet else ""
        log.warning(
            "region %s of %s on GPU %d was DEGRADED: %s%s",
            report.region,
            report.user,
            report.gpu,
            "; ".join(brief(report)) or "no reason recorded",
            more,
        )

    def _snapshot(self) -> None:
        from .metrics import snapshot

        if self.metrics is not None:
            self.metrics.refresh(snapshot(*self.live()))

    async def refresh_metrics(self, interval: float) -> None:
        """The gauges' snapshot, taken on the loop every ``interval`` s."""
        while True:
            try:
                self._snapshot()
            except Exception:
                log.exception("metrics snapshot failed")
            await asyncio.sleep(interval)

    def close(self) -> None:
        if self.history is not None:
            self.history.close()  # writes what the last releases queued
        if self.metrics is not None:
            self.metrics.close()


#: seconds between two log lines of one user's degraded regions (see RegionRecords._say_degraded)
DEGRADED_EVERY = 1.0
#: how many processes a log line names for one reason (the report keeps every one)
NAMED = 3


def brief(report: RegionReport) -> list[str]:
    """The reasons ``report`` is degraded, short enough for one log line: processes not drained
    for the same reason are one entry naming the first few and a count (63 siblings named one
    by one made a line of several KB a region, at hundreds of regions a second)."""
    if not report.degraded:
        return []
    by_why: dict[str, list[str]] = {}
    for pid, why in report.not_drained.items():
        by_why.setdefault(why, []).append(str(pid))
    reasons = []
    for why, pids in by_why.items():
        named = ", ".join(pids[:NAMED]) + (f" and {len(pids) - NAMED} more" if len(pids) > NAMED else "")
        who = f"process {named}" if len(pids) == 1 else f"{len(pids)} processes ({named})"
        reasons.append(f"{who} not drained: {why}")
    failures = list(report.failures)
    if len(failures) > NAMED:
        failures = [*failures[:NAMED], f"{len(failures) - NAMED} more failures"]
    return reasons + failures
