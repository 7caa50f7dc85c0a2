"""What the region sequence is configured with, and how it tells the world.

Shared by the :class:`~.scheduler.Scheduler` and the :class:`~.draining.Draining` it owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..protocol import BackendDescription
from .region import Region
from .sessions import Session


@dataclass(frozen=True)
class SchedulerConfig:
    """The arbiter options the region sequence reads (see ``Arbiter`` for their meaning)."""

    drain_timeout: float = 1.0
    lock_foreign: bool = True
    poll_interval: float = 0.1
    history: int = 200
    #: the backend's ``describe()`` (read by :meth:`~.region.BackendInfo.of`): every report carries it
    backend_info: BackendDescription | None = None
    #: seconds a session that registers mid-region runs before it is drained and frozen, so
    #: that it hears its registration and can queue (it is stopped at once when it queues)
    intruder_grace: float = 0.5
    #: seconds the isolation step may take (its per-thread work runs off the event loop);
    #: threads it has not reached by then stay where they are and the report says so
    isolate_deadline: float = 0.5


class Publisher(Protocol):
    """Where events go: ``publish(topic, body)``, the body an event's JSON form."""

    def publish(self, topic: str, data: dict[str, Any]) -> None: ...


class Notifier(Publisher, Protocol):
    """How the scheduler tells the world: events for observers, control messages for sessions."""

    def control(self, session: Session, kind: str, region: Region) -> None: ...
