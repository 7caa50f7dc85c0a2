"""Step 2 of a region: close the GPU's gate.

While the gate of a GPU is closed, KREX-aware processes start no new GPU job there: the
arbiter publishes a ``gate`` event (the pool service and dashboards subscribe), sends
``drain`` to each KREX-aware session of that GPU (:mod:`krex_lab.enforcement.drain`), and calls
the in-process hooks registered with :meth:`Gate.add_hook`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

log = logging.getLogger("krex.gate")


class GateEvent(msgspec.Struct, kw_only=True):
    """A ``krex.gate`` event: :class:`Gate` publishes it when a GPU's gate closes or opens; the pool
    (:mod:`krex_lab.workers.pool.gates`) and dashboards read it. A private arbiter leaves
    ``holder_pid`` out of what it publishes; the publisher adds ``time`` (epoch seconds)."""

    gpu: int
    closed: bool = False
    #: the region that closed the gate (or, opening it, the one that ended)
    region: str | None = None
    holder_pid: int | None = None


Hook = Callable[[int, bool, "str | None"], None]


class Gate:
    def __init__(self, publish: Callable[[str, dict[str, Any]], None]) -> None:
        """``publish(topic, body)``: the arbiter's event socket, which takes an event's JSON body."""
        self._publish = publish
        self._closed: dict[int, str] = {}
        self._hooks: list[Hook] = []

    def add_hook(self, hook: Hook) -> None:
        """``hook(gpu, closed, region)`` runs on every change (in the arbiter's loop: keep it quick)."""
        self._hooks.append(hook)

    def is_open(self, gpu: int) -> bool:
        return gpu not in self._closed

    def close(self, gpu: int, region: str, holder_pid: int) -> None:
        self._closed[gpu] = region
        self._notify(gpu, True, region, holder_pid)

    def open(self, gpu: int) -> None:
        region = self._closed.pop(gpu, None)
        if region is not None:
            self._notify(gpu, False, region, None)

    def _notify(self, gpu: int, closed: bool, region: str, holder_pid: int | None) -> None:
        event = GateEvent(gpu=gpu, closed=closed, region=region, holder_pid=holder_pid)
        self._publish("gate", msgspec.to_builtins(event))
        for hook in self._hooks:
            try:
                hook(gpu, closed, region)
            except Exception:
                log.exception("gate hook failed")
