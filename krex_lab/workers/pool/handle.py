"""The pool's side of one worker process: start it, talk to it, notice its death at once.

A worker's death is seen through a pidfd registered with the event loop (readable the moment
the process exits; ``Popen.poll`` every 50 ms where pidfds are missing), never through a
heartbeat timeout. Its stdout and stderr are pipes read as data arrives; the last lines of
stderr are kept, so that a worker that dies can say how (faulthandler's dump of a segfault).

Containment (:mod:`..contain`): the worker is a child subreaper, so a daemon a job started is
among its descendants and :meth:`WorkerHandle.kill` takes it with the worker's tree; the pool is
one too, so the orphans of a worker that died first land on the pool, and :func:`sweep_orphans`
(at each worker's exit, every housekeeping tick and at shutdown) kills every child of the pool
that is not a live worker (:data:`worker_pids`).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from typing import Any, Protocol

from ...errors import ProtocolError
from ...procutil import tree
from ..contain import ProcId, sweep_until_clean
from ..contain import sweep_orphans as _sweep
from ..wire import HEADER, FromWorker, Init, ToWorker, WorkerRow, decode_from_worker, pack

log = logging.getLogger("krex.pool")

TAIL_CHARS = 8000
#: lines of a faulthandler dump that show the worker's machinery, not the job
_INTERNAL_FRAMES = (f"{os.sep}krex_lab{os.sep}workers{os.sep}", 'File "<frozen runpy>"')


#: pids of this process's worker children not yet reaped (every other child is a stray)
worker_pids: set[int] = set()
#: children this process had before it served (a host's own): never swept
spared_children: list[ProcId] = []


def sweep_orphans() -> list[int]:
    """Kill every child of the pool that is not a live worker (a dead worker's orphans), and reap."""
    return _sweep(worker_pids, spared_children)


def sweep_orphans_until_clean(timeout: float = 3.0) -> list[int]:
    """:func:`sweep_orphans` until none is left (shutdown); the stray pids that survived."""
    return sweep_until_clean(worker_pids, spared_children, timeout)


class Events(Protocol):
    """Who hears of a worker's messages, output and death (the dispatcher)."""

    def on_message(self, worker: WorkerHandle, msg: FromWorker) -> None: ...
    def on_output(self, worker: WorkerHandle, stream: str, text: str) -> None: ...
    def on_exit(self, worker: WorkerHandle, returncode: int) -> None: ...


class WorkerHandle:
    """One worker process. ``state``: starting, idle, busy, resetting, dead."""

    def __init__(
        self, wid: int, gpu: int, cmd: list[str], env: dict[str, str], init: Init, events: Events, active: bool
    ) -> None:
        self.id = wid
        self.gpu = gpu
        self.cmd = cmd
        self.env = env
        self.init = init
        self.events = events
        self.active = active
        self.state = "starting"
        #: the one job (of a client inside a region) this worker was started for; None: a pool worker
        self.for_job: Any = None
        self.pid: int | None = None
        self.session: str | None = None
        self.info: Any = None  # its first wire.Ready (what it preloaded, how long it took)
        self.job: Any = None  # the Job it runs (dispatch.Job)
        self.lease: Any = None  # the Lease holding it
        self.reset_pending = False
        self.jobs_run = 0
        self.created = time.time()
        self.ready_at: float | None = None
        self.expected: str | None = None  # why we killed it (None: a death nobody asked for)
        self.returncode: int | None = None
        self.stderr_tail = ""
        self.job_stderr = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._pipes: dict[str, int] = {}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._exit_seen = False
        self.start_task: asyncio.Task[None] | None = None
        self.last_reset: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<worker {self.id} pid {self.pid} gpu {self.gpu} {self.state}{' spare' if not self.active else ''}>"

    # -- start ---------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        parent, child = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [*self.cmd, str(child.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(child.fileno(),),
                env=self.env,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            parent.close()
            raise
        finally:
            child.close()
            os.close(out_w)
            os.close(err_w)
        self.pid = self._proc.pid
        worker_pids.add(self.pid)
        for stream, fd in (("stdout", out_r), ("stderr", err_r)):
            os.set_blocking(fd, False)
            self._pipes[stream] = fd
            loop.add_reader(fd, self._on_pipe, stream)
        try:
            self._pidfd = os.pidfd_open(self.pid)
            loop.add_reader(self._pidfd, self._on_exit)
        except (AttributeError, OSError):
            self._poll_task = loop.create_task(self._poll())
        reader, self._writer = await asyncio.open_unix_connection(sock=parent)
        self._reader_task = loop.create_task(self._read_loop(reader))
        self.send(self.init)

    def send(self, msg: ToWorker) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack(msg))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                msg = await self._read_frame(reader)
            except ProtocolError as exc:  # not our worker's protocol: it cannot be trusted with a job
                log.error("worker %s: %s", self.id, exc)
                self.kill(f"it broke the protocol: {exc}")
                return
            if msg is None:
                return
            try:
                self.events.on_message(self, msg)
            except Exception:
                log.exception("worker %s: handling %s failed", self.id, type(msg).__name__)

    @staticmethod
    async def _read_frame(reader: asyncio.StreamReader) -> FromWorker | None:
        """One message of the worker; None at EOF."""
        try:
            header = await reader.readexactly(HEADER.size)
            body = await reader.readexactly(HEADER.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return decode_from_worker(body)

    # -- output ---------------------------------------------------------------------------------
    def _on_pipe(self, stream: str) -> None:
        self._read_pipe(stream)

    def _read_pipe(self, stream: str) -> None:
        fd = self._pipes.get(stream)
        if fd is None:
            return
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_reader(fd)
                return
            text = self._decoders[stream].decode(data)
            if not text:
                continue
            if stream == "stderr":
                self.stderr_tail = (self.stderr_tail + text)[-TAIL_CHARS:]
                if self.job is not None:
                    self.job_stderr = (self.job_stderr + text)[-TAIL_CHARS:]
            self.events.on_output(self, stream, text)

    def drain_output(self) -> None:
        """Read what is already in the pipes (call before a result is forwarded: output first)."""
        for stream in ("stdout", "stderr"):
            self._read_pipe(stream)

    def last_stderr(self, lines: int = 20) -> str:
        """The last lines of stderr (of the current job if one runs), without the worker's own frames."""
        text = self.job_stderr if self.job is not None else self.stderr_tail
        kept = [line for line in text.rstrip("\n").splitlines() if not any(mark in line for mark in _INTERNAL_FRAMES)]
        return "\n".join(kept[-lines:])

    # -- signals --------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """SIGINT to the worker's process group (as Ctrl-C in a terminal): KeyboardInterrupt in the job."""
        if self.pid is None or self._exit_seen:
            return
        try:
            os.killpg(self.pid, signal.SIGINT)
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGINT)

    def kill(self, reason: str) -> None:
        """SIGKILL the worker and everything it started (its tree and process group)."""
        if self.expected is None:
            self.expected = reason
        if self.pid is None:
            return
        pids = tree(self.pid) if not self._exit_seen else []
        for pid in reversed(pids):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)

    # -- death ------------------------------------------------------------------------------------
    async def _poll(self) -> None:
        while self._proc is not None and self._proc.poll() is None:
            await asyncio.sleep(0.05)
        self._on_exit()

    def _on_exit(self) -> None:
        if self._exit_seen or self._proc is None:
            return
        code = self._proc.poll()
        if code is None:
            return
        self._exit_seen = True
        self.returncode = code
        worker_pids.discard(self._proc.pid)  # reaped by poll(): from now on a child of that pid is a stray
        if self._pidfd is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        asyncio.get_running_loop().create_task(self._after_exit(code))

    async def _after_exit(self, code: int) -> None:
        # Let the reader deliver what the worker sent before it died ("done" of a finished job).
        if self._reader_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._reader_task), 0.5)
            except (asyncio.TimeoutError, Exception):
                self._reader_task.cancel()
        # Processes the job forked may still hold the pipes or the group: they go with the worker.
        with contextlib.suppress(OSError):
            os.killpg(self.pid or 0, signal.SIGKILL)
        # What it started outside its group (daemons) was re-parented to the pool: it goes too.
        sweep_orphans()
        self.drain_output()
        self.close_fds()
        self.state = "dead"
        self.events.on_exit(self, code)

    def close_fds(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self._pipes.values():
            with contextlib.suppress(Exception):
                loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pipes.clear()
        if self._writer is not None:
            self._writer.close()
        if self._poll_task is not None:
            self._poll_task.cancel()

    async def wait_dead(self, timeout: float = 5.0) -> None:
        """After :meth:`kill`: wait until the exit has been handled."""
        deadline = time.monotonic() + timeout
        while self.state != "dead" and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def public(self) -> WorkerRow:
        """This worker's row of the pool's status table."""
        return WorkerRow(
            id=self.id,
            pid=self.pid,
            gpu=self.gpu,
            state=self.state,
            role="region job" if self.for_job is not None else "active" if self.active else "spare",
            session=self.session,
            lease=getattr(self.lease, "key", None),
            job=getattr(self.job, "id", None),
            jobs_run=self.jobs_run,
            since=self.created,
            preloaded=self.info.preloaded if self.info else [],
            skipped=self.info.skipped if self.info else {},
            start_s=self.info.start_s if self.info else None,
            import_s=self.info.import_s if self.info else {},
            last_reset_s=self.last_reset,
        )
