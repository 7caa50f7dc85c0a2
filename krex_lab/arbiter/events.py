"""What the arbiter says besides its replies: events on the PUB socket, control messages to the
socket a session registered from, and the periodic ``krex.telemetry`` event for dashboards.

On a multi-user arbiter with ``privacy = "private"`` every subscriber gets the same event, the
anonymous view of it (:func:`~.privacy.public_event`): a PUB socket cannot tell its readers apart.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable

import msgspec

from .. import protocol
from ..gpu import GpuBackend
from ..node_status import GpuProcessRow, NodeStatus, Telemetry
from ..region_report import RegionReport
from ..rpc_server import Service
from .privacy import public_event
from .region import Region
from .sessions import Session

log = logging.getLogger("krex.arbiter")

#: how many of the latest finished regions a telemetry event carries
TELEMETRY_REGIONS = 20


class EventNotifier:
    """Events on the service's PUB socket, control messages to a session's own socket."""

    def __init__(self, service: Service, private: bool) -> None:
        self.service = service
        self.private = private

    # An event is a map the notifier passes on unread (it only stamps the time): its values are
    # whatever its producer put there, each topic its own shape.
    def publish(self, topic: str, data: dict[str, object]) -> None:
        data.setdefault("time", time.time())
        # Every subscriber gets the same event: on a shared node, the anonymous view of it.
        self.service.publish(f"krex.{topic}", public_event(topic, data) if self.private else data)

    def control(self, session: Session, kind: str, region: Region) -> None:
        if session.control is not None:
            self.service.send(
                session.control,
                protocol.Control(
                    kind=kind,  # type: ignore[arg-type]
                    region=region.id,
                    gpu=region.gpu,
                ),
            )


async def publish_telemetry(
    notify: EventNotifier,
    interval: float,
    table: Callable[[], NodeStatus],
    backend: GpuBackend,
    gpu_count: int,
    finished: Callable[[], Iterable[RegionReport]],
) -> None:
    """Publish ``krex.telemetry`` every ``interval`` s: the node ``table``, the GPU processes'
    memory and the latest ``finished`` regions. One backend query per period, whatever the number
    of subscribers (``seq`` numbers the events)."""
    loop = asyncio.get_running_loop()
    for seq in itertools.count(1):
        await asyncio.sleep(interval)
        try:
            data = table()
            # Per-process GPU memory (NVML lists it; the fake backend has none), off the loop.
            procs = await loop.run_in_executor(
                None,
                lambda: [
                    GpuProcessRow(gpu=g, pid=p.pid, used_memory=p.used_memory)
                    for g in range(gpu_count)
                    for p in backend.processes(g)
                ],
            )
        except Exception:
            log.exception("telemetry failed")
            continue
        event = Telemetry(
            **msgspec.structs.asdict(data),
            seq=seq,
            interval=interval,
            processes=procs,
            regions=list(finished())[-TELEMETRY_REGIONS:],
        )
        notify.publish("telemetry", msgspec.to_builtins(event))
