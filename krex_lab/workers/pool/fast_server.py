"""The pool's plain UNIX socket for the short way of ``krex run`` (:mod:`..client.fast_run`).

It sits next to the ZeroMQ socket (its path plus ``.run``), made under a 0077 umask and chmod
0600 in the pool's own runtime directory, and it serves only this pool's user: each connection's
credentials (``SO_PEERCRED``) are read before anything else, and a connection of any other uid
(root included) is closed unread and unanswered. A served connection carries one script job:
the pool sends its :class:`~..wire.PoolInfo`, reads a :class:`~..wire.FastRun`, and the job then
goes the way every submit goes (``Pool._submit``: the same checks, queue, workers, one result),
its messages written back as JSON frames. The submitting process is the connection's peer
(``SO_PEERCRED``'s pid), watched as the ZeroMQ path's clients are: its job ends when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable
from typing import Any

import msgspec

from ...errors import KrexError, ProtocolError
from ...peercred import peer_credentials
from ..client.fast_run import MAX_FRAME, SUFFIX
from ..wire import (
    FastError,
    FastInterrupt,
    FastResult,
    FastRun,
    Interrupt,
    Output,
    Ping,
    PoolInfo,
    Submit,
)

log = logging.getLogger("krex.pool")

_encode = msgspec.json.Encoder().encode
_decode_run = msgspec.json.Decoder(FastRun).decode
_decode_interrupt = msgspec.json.Decoder(FastInterrupt).decode


def _frame(message: Any) -> bytes:
    body = _encode(message)
    return len(body).to_bytes(4, "big") + body


async def _read(reader: asyncio.StreamReader) -> bytes | None:
    """One frame's body; None at EOF. :class:`ProtocolError` for one over the limit."""
    try:
        header = await reader.readexactly(4)
        size = int.from_bytes(header, "big")
        if size > MAX_FRAME:
            raise ProtocolError(f"a frame of {size} bytes is over the limit of {MAX_FRAME}")
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class FastPeer:
    """How the pool answers a job that came over the plain socket (what ``rpc_server.Peer`` is
    for a ZeroMQ one): ``send`` for its messages while it runs, ``reply`` for its one result."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.job: str | None = None  # the pool's id of the job, once accepted
        self.done = asyncio.Event()

    def send(self, message: Any) -> None:
        if not isinstance(message, Output):  # Accepted: the job's id, for an interrupt
            self.job = getattr(message, "job", self.job)
        self._write(message)

    def reply(self, result: Any = None, error: KrexError | None = None) -> None:
        if error is not None:
            self._write(FastError(type=type(error).__name__, message=str(error)))
        else:
            self._write(FastResult(result=result))
        self.done.set()

    def _write(self, message: Any) -> None:
        if self.done.is_set() or self.writer.is_closing():
            return  # the client has gone: its pid's watch ends the job
        self.writer.write(_frame(message))


class FastServer:
    """Serves ``path`` (the pool's ipc socket plus ``.run``) with the pool's handlers."""

    def __init__(
        self,
        path: str,
        ping: Callable[[Ping, Any], PoolInfo],
        submit: Callable[[Submit, Any], Any],
        interrupt: Callable[[Interrupt, Any], None],
    ) -> None:
        self.path = path + SUFFIX
        self._ping, self._submit, self._interrupt = ping, submit, interrupt
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen (the pool holds its endpoint's lock: a socket file left there is a dead pool's)."""
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        old = os.umask(0o077)
        try:
            self._server = await asyncio.start_unix_server(self._serve, self.path, limit=1 << 20)
        except OSError as exc:  # a path too long for a UNIX socket, a file in the way: the full path serves
            log.warning("no plain socket for `krex run` at %s (%s): it goes the ZeroMQ way", self.path, exc)
            return
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._one_job(reader, writer)
        except Exception as exc:  # one connection's trouble is its own: the pool serves on
            log.warning("krex run (plain socket): %s", exc)
        finally:
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()

    async def _one_job(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, _ = peer_credentials(writer.get_extra_info("socket"))
        if uid != os.getuid():
            log.warning(
                "refused a `krex run` connection of uid %d (pid %d): this pool serves uid %d", uid, pid, os.getuid()
            )
            return
        peer = FastPeer(writer)
        writer.write(_frame(self._ping(Ping(), peer)))
        body = await _read(reader)
        if body is None:
            return  # it went the full way (a GPU this pool does not serve), or away
        try:
            run = _decode_run(body)
            if run.job.kind != "script" or run.job.exclusive:
                raise ProtocolError("the plain socket runs scripts, without --exclusive")
            rid = int.from_bytes(os.urandom(8), "big") >> 1  # as a ZeroMQ client picks its ids
            self._submit(Submit(id=rid, pid=pid, job=run.job), peer)
        except (KrexError, ValueError, msgspec.DecodeError) as exc:  # refused: said, nothing runs
            error = exc if isinstance(exc, KrexError) else ProtocolError(f"bad message: {exc}")
            peer.reply(error=error)
            return
        while not peer.done.is_set():
            read = asyncio.ensure_future(_read(reader))
            finished = asyncio.ensure_future(peer.done.wait())
            await asyncio.wait({read, finished}, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            if not read.done():
                read.cancel()
                break
            body = read.result()
            if body is None:
                await peer.done.wait()  # the client closed its end; its pid's watch ends the job
                break
            try:
                self._interrupt(Interrupt(job=peer.job, force=_decode_interrupt(body).force), peer)
            except msgspec.DecodeError as exc:
                log.warning("krex run (plain socket): a bad interrupt: %s", exc)
            await writer.drain()
