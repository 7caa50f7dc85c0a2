"""The pool's link to the arbiter: which GPUs exist, and which gates are closed right now.

The arbiter publishes ``krex.gate`` events (``{gpu, closed, region, holder_pid}``) on its PUB
socket when a region starts and ends; the pool subscribes and, while the gate of a GPU is
closed, starts no job (and no worker) there. Events can be missed (a subscription takes a
moment to connect; the arbiter may restart), so the state is also re-read from ``status``
every ``resync`` seconds; an arbiter that stops answering leaves every gate open (its guardian
has undone the regions).

The pool never registers a session of its own: a session belongs to one GPU, and a region
held by someone else on that GPU would freeze the pool, and with it every GPU's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from ... import client, discovery, protocol
from ...enforcement.gate import GateEvent
from ...node_status import NodeStatus

log = logging.getLogger("krex.pool")


class GateWatcher:
    def __init__(self, endpoint: str | None, on_change: Callable[[], None], resync: float = 2.0) -> None:
        self.endpoint = endpoint or discovery.default_endpoint()
        self.on_change = on_change
        self.resync = resync
        #: the arbiter's ``hello`` (None: none has answered yet)
        self.info: protocol.Info | None = None
        #: gpu -> its UUID, as the arbiter's status lists them
        self.uuids: dict[int, str] = {}
        #: gpu -> (region, holder pid) for closed gates
        self.closed: dict[int, tuple[str | None, int | None]] = {}
        self._sub: zmq.asyncio.Socket | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: the last re-read of the arbiter's status failed (it stopped answering)
        self.failing = False

    @property
    def connected(self) -> bool:
        return self.info is not None

    @property
    def arbiter_pid(self) -> int | None:
        return self.info.pid if self.info is not None else None

    def is_open(self, gpu: int) -> bool:
        return gpu not in self.closed

    def holder_pid(self, gpu: int) -> int | None:
        return self.closed.get(gpu, (None, None))[1]

    async def start(self, wait: float = 0.0) -> bool:
        """Connect to the arbiter (trying for up to ``wait`` s); True if it answered. Keeps trying in the
        background otherwise."""
        deadline = time.monotonic() + wait
        ok = await self._connect()
        while not ok and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            ok = await self._connect()
        self._tasks.append(asyncio.ensure_future(self._resync_loop()))
        return ok

    async def _connect(self) -> bool:
        try:
            info = msgspec.convert(await asyncio.to_thread(client.hello, self.endpoint, 2.0), protocol.Info)
        except Exception as exc:
            log.debug("arbiter at %s: %s", self.endpoint, exc)
            return False
        self._ctx = zmq.asyncio.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"krex.gate")
        sub.connect(info.events)
        self._sub = sub
        self.info = info
        self._tasks.append(asyncio.ensure_future(self._event_loop(sub)))
        await self._read_status()
        return True

    async def _read_status(self) -> bool:
        try:
            table = await asyncio.to_thread(client.status, self.endpoint, 5.0)
        except Exception as exc:
            log.debug("arbiter status: %s", exc)
            return False
        node = NodeStatus.of(table)
        self.uuids = {g.index: g.uuid for g in node.gpus}
        pid = node.arbiter.pid or None
        if self.info is not None and pid is not None and pid != self.info.pid:
            log.warning("the arbiter restarted (pid %s, was %s): workers register anew", pid, self.info.pid)
            self.info.pid = pid
            self.on_change()
        closed: dict[int, tuple[str | None, int | None]] = {}
        for g in node.gpus:
            if g.gate == "closed":
                closed[g.index] = (g.holder.region, g.holder.pid) if g.holder else (None, None)
        self._apply(closed)
        return True

    def _apply(self, closed: dict[int, tuple[str | None, int | None]]) -> None:
        changed = set(closed) != set(self.closed)
        self.closed = closed
        if changed:
            self.on_change()

    async def _event_loop(self, sub: zmq.asyncio.Socket) -> None:
        decoder = msgspec.msgpack.Decoder(GateEvent)
        while True:
            _topic, data = await sub.recv_multipart()
            try:
                event = decoder.decode(data)
            except msgspec.DecodeError:  # ValidationError included
                continue
            closed = dict(self.closed)
            if event.closed:
                closed[event.gpu] = (event.region, event.holder_pid)
            else:
                closed.pop(event.gpu, None)
            log.debug("gate of GPU %d %s", event.gpu, "closed" if event.closed else "open")
            self._apply(closed)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync)
            if self.info is None:
                if await self._connect():
                    log.info("arbiter at %s answered: gates honoured from now on", self.endpoint)
                    self.on_change()
                continue
            ok = await self._read_status()
            self.failing = not ok
            if not ok and self.closed:
                log.warning("the arbiter does not answer: treating every gate as open")
                self._apply({})

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                self._sub.close(linger=0)
        if self._ctx is not None:
            with contextlib.suppress(Exception):
                self._ctx.term()
