"""The dashboard's connection to the arbiter: one SUB socket, in a background thread.

On (re)connect the feed subscribes first, then reads one snapshot (the ``status`` and
``regions`` requests), so nothing published in between is lost; from then on it only listens
to the arbiter's events. The arbiter publishes a ``krex.telemetry`` event every
``telemetry_interval`` seconds (the whole node status, computed once per period for every
subscriber), so a dashboard never queries the GPUs itself. When nothing, not even telemetry,
arrives for a few periods, one ``hello`` request tells whether the arbiter is still there; if it
is not, the feed reports ``lost`` and tries again every ``retry`` seconds, taking a fresh
snapshot when the arbiter answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from .. import discovery, protocol
from ..client import Connection, hello
from ..errors import KrexError
from .model import Event

log = logging.getLogger("krex.dashboard")

#: how many finished regions the snapshot asks for
SNAPSHOT_REGIONS = 200


class Feed:
    """Calls ``on_event(Event)`` for everything the arbiter says and ``on_tick()`` at least every ``tick`` s,
    both from its own daemon thread."""

    def __init__(
        self,
        on_event: Callable[[Event], None],
        on_tick: Callable[[], None] | None = None,
        endpoint: str | None = None,
        tick: float = 0.1,
        retry: float = 1.0,
        silence: float = 3.0,
    ) -> None:
        self.endpoint = endpoint or discovery.default_endpoint()
        self.on_event = on_event
        self.on_tick = on_tick or (lambda: None)
        self.tick = tick
        self.retry = retry
        #: seconds without any message (at least this, and 3 telemetry periods) before asking ``hello``
        self.silence = silence
        self.connects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="krex-dashboard-feed", daemon=True)

    def start(self) -> Feed:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        lost_reported = False
        while not self._stop.is_set():
            try:
                self._tick()
                self._session()
                lost_reported = False
            except KrexError as exc:
                if not lost_reported:
                    self._emit("lost", {"reason": f"arbiter lost: {exc}"})
                    lost_reported = True
            except Exception:  # the dashboard must not die of one bad message
                log.exception("dashboard feed failed; reconnecting")
            deadline = time.monotonic() + self.retry
            while not self._stop.is_set() and time.monotonic() < deadline:
                self._tick()
                self._stop.wait(min(self.tick, self.retry))

    def _session(self) -> None:
        """One connection: subscribe, snapshot, listen until the arbiter is gone (raises KrexError) or stop."""
        raw = hello(self.endpoint, timeout=1.0)
        info = msgspec.convert(raw, protocol.Info, strict=False)
        sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"krex.")
        sub.connect(info.events)
        try:
            conn = Connection(self.endpoint)
            conn.arbiter_pid = info.pid
            try:
                status = conn.call(protocol.Status(ticket=conn.ticket()), timeout=5.0)
                regions = conn.call(protocol.Regions(limit=SNAPSHOT_REGIONS, ticket=conn.ticket()), timeout=5.0)
                self.connects += 1
                self._emit("snapshot", {"hello": raw, "status": status, "regions": regions})
                self._listen(sub, info, conn)
            finally:
                conn.close()
        finally:
            sub.close(linger=0)

    def _own_view(self, conn: Connection, event: Event) -> Event:
        """A shared private arbiter publishes one anonymous telemetry view to every subscriber; this
        user's own sessions and regions come from a status request with an identity ticket."""
        if not any("other_sessions" in g for g in event.data.get("gpus") or ()):
            return event
        status = conn.call(protocol.Status(ticket=conn.ticket()), timeout=5.0)
        return Event(event.topic, {**event.data, **status}, event.at)

    def _listen(self, sub: zmq.Socket[bytes], info: protocol.Info, conn: Connection) -> None:
        last = time.monotonic()
        interval = 0.0
        while not self._stop.is_set():
            self._tick()
            if sub.poll(int(self.tick * 1000)):
                while True:
                    try:
                        topic, data = sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except ValueError:  # not two frames: not ours
                        continue
                    event = self._decode(topic, data)
                    if event is None:
                        continue
                    if event.topic == "telemetry":
                        interval = float(event.data.get("interval", 0.0))
                        pid = (event.data.get("arbiter") or {}).get("pid")
                        if pid is not None and pid != info.pid:
                            return  # another arbiter on this endpoint: snapshot it afresh
                        event = self._own_view(conn, event)
                    self._emit_event(event)
                last = time.monotonic()
                continue
            if time.monotonic() - last > max(self.silence, 3 * interval):
                # Silence: is the arbiter still there? (Telemetry may be off; hello costs no GPU query.)
                again = hello(self.endpoint, timeout=1.0)
                if msgspec.convert(again, protocol.Info, strict=False).pid != info.pid:
                    return
                last = time.monotonic()

    def _decode(self, topic: bytes, data: bytes) -> Event | None:
        try:
            body = protocol.decode_event(data)
        except KrexError:
            return None
        name = topic.decode(errors="replace").removeprefix("krex.")
        return Event(name, body, float(body.get("time", time.time())))

    def _emit(self, topic: str, data: dict[str, Any]) -> None:
        self._emit_event(Event(topic, data, time.time()))

    def _emit_event(self, event: Event) -> None:
        try:
            self.on_event(event)
        except Exception:
            log.exception("dashboard event handler failed")

    def _tick(self) -> None:
        try:
            self.on_tick()
        except Exception:
            log.exception("dashboard refresh failed")
