"""The node arbiter: one per node, the only process that signals, locks or re-pins others.

asyncio + pyzmq: a ROUTER socket answers requests (exactly one reply each, see
:mod:`krex_lab.protocol`) and sends control messages to sessions; a PUB socket publishes
events (sessions, gates, regions) for pools and dashboards. Before it serves, it takes the
runtime directory's lock, undoes whatever an earlier arbiter left in the journal, and starts
its guardian (:mod:`krex_lab.arbiter.guardian`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from traitlets import Bool, Enum, Float, Int, Unicode
from traitlets.config import LoggingConfigurable

from .. import __version__, paths, protocol
from ..errors import InvalidRequest, KrexError, NotHolder, PermissionDenied, ProtocolError
from ..gpu import BACKENDS, GpuBackend, make_backend
from ..procutil import ancestors, proc_uid
from ..regions.cgroups import CgroupPlacer
from ..regions.drain import Locker
from ..regions.freeze import Freezer
from ..regions.gate import Gate
from ..regions.isolate import CoreBook
from .journal import Journal, undo_outstanding
from .scheduler import Scheduler
from .sessions import Session, SessionTable

log = logging.getLogger("krex.arbiter")


class Arbiter(LoggingConfigurable):
    endpoint = Unicode("", help="ROUTER endpoint to bind (default: $KREX_ENDPOINT, else ipc:// in the "
                       "runtime dir). Events go to the matching PUB endpoint.").tag(config=True)
    runtime_dir = Unicode("", help="Directory for the socket, journal and lock "
                          "(default: $KREX_RUNTIME_DIR, else $XDG_RUNTIME_DIR/krex or /tmp/krex-UID).").tag(config=True)
    backend_name = Enum(list(BACKENDS), default_value="auto", help="GPU backend: auto picks nvidia, then amd, "
                        "then the simulated fake backend.").tag(config=True)
    fake_gpus = Int(1, help="Number of simulated GPUs of the fake backend.").tag(config=True)
    max_hold = Float(60.0, help="Default lease of a region in seconds; at expiry it is force-released "
                     "and the holder told.").tag(config=True)
    max_hold_limit = Float(3600.0, help="Largest max_hold a client may ask for.").tag(config=True)
    drain_timeout = Float(1.0, help="Seconds to wait for KREX-aware sessions to confirm a drain.").tag(config=True)
    lock_timeout = Float(5.0, help="Deadline of one driver lock (it waits for the target's queued GPU "
                         "work).").tag(config=True)
    lock_foreign = Bool(True, help="Lock GPU processes that are not KREX sessions too.").tag(config=True)
    isolate_cores = Int(1, help="Cores reserved for a region's holder (never core 0 while others exist).").tag(
        config=True)
    poll_interval = Float(0.1, help="How often a held GPU is checked for new processes to lock.").tag(config=True)
    history = Int(200, help="How many finished regions (with reports) to keep for status and the API.").tag(
        config=True)
    multi_user = Bool(False, help="Let other users reach the socket (runtime dir 0755, socket 0666). A "
                      "multi-user arbiter runs as root.").tag(config=True)
    cgroups = Enum(["off", "auto"], default_value="off", help="Place each session in a cgroup v2 of its own "
                   "(<v2 root>/krex/<session>) so that freezing is cgroup.freeze, which catches every fork; "
                   "'auto' uses it where the machine allows, else SIGSTOP. Off by default: moving processes "
                   "between cgroups can fight a host's own cgroup management.").tag(config=True)
    guardian = Bool(True, help="Start a guardian process that undoes every lock, freeze and re-pin if "
                    "the arbiter dies.").tag(config=True)
    telemetry_interval = Float(1.0, help="Seconds between `krex.telemetry` events (the node status with the GPU "
                               "readings, holders, queues and sessions, the GPU processes' memory and the recent "
                               "regions), computed once per period however many dashboards subscribe; 0 disables."
                               ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started = time.time()
        self.backend: GpuBackend = make_backend(self.backend_name, self.fake_gpus)
        self.gpu_count = self.backend.gpu_count()
        self.backend_info = self.backend.describe()
        self.root = Path(self.runtime_dir) if self.runtime_dir else paths.runtime_dir()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.multi_user:
            os.chmod(self.root, 0o755)
        self.bound = self.endpoint or os.environ.get(paths.ENDPOINT_ENV) or f"ipc://{self.root / 'arbiter.sock'}"
        self.events = paths.events_endpoint(self.bound)
        self._guardian: subprocess.Popen[bytes] | None = None
        self._stopping: asyncio.Event | None = None

    # -- shared by the scheduler --------------------------------------------------------
    def own_pids(self) -> set[int]:
        pids = {os.getpid()}
        if self._guardian is not None:
            pids.add(self._guardian.pid)
        return pids

    def publish(self, topic: str, data: dict[str, Any]) -> None:
        data.setdefault("time", time.time())
        self._send(self._pub_sync, [f"krex.{topic}".encode(), protocol.encode(data)])

    def send_control(self, session: Session, kind: str, region: Any) -> None:
        if session.control is not None:
            msg = protocol.Control(kind=kind, region=region.id, gpu=region.gpu)  # type: ignore[arg-type]
            self._send(self._router_sync, [session.control, protocol.encode(msg)])

    def cgroup_of_session(self, pid: int) -> str:
        return next((s.cgroup for s in self.sessions if s.pid == pid and s.cgroup), "")

    # -- lifecycle ------------------------------------------------------------------------
    def _take_lock(self) -> None:
        self._lockfile = open(self.root / "arbiter.lock", "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise KrexError(f"another arbiter is running on {self.root} (see its arbiter.lock)") from None
        self._lockfile.seek(0)
        self._lockfile.truncate()
        self._lockfile.write(f"{os.getpid()}\n")
        self._lockfile.flush()

    def unlock_journaled(self, backend: str, procs: list[tuple[int, int]]) -> list[str]:
        if backend != self.backend.name or not self.backend.capabilities.lock:
            return [f"cannot unlock {len(procs)} processes of backend {backend} from {self.backend.name}"]
        return self.locker.unlock_sync(procs)

    def _start_guardian(self) -> None:
        cmd = [sys.executable, "-m", "krex_lab.arbiter.guardian", "--pid", str(os.getpid()),
               "--journal", str(self.journal_path), "--backend", self.backend.name]
        self._guardian = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)

    async def _keep_guardian(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if self._guardian is not None and self._guardian.poll() is not None:
                log.error("guardian exited with %s: starting a new one", self._guardian.returncode)
                self._start_guardian()

    def _bind(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        # zmq drops (without a reply) what exceeds this; up to it, we answer with an error.
        self.router.setsockopt(zmq.MAXMSGSIZE, 4 * 1024 * 1024)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.bound)
        self.pub.bind(self.events)
        self._router_sync: zmq.Socket[bytes] = zmq.Socket.shadow(self.router.underlying)
        self._pub_sync: zmq.Socket[bytes] = zmq.Socket.shadow(self.pub.underlying)
        if self.multi_user:
            for ep in (self.bound, self.events):
                if ep.startswith("ipc://"):
                    os.chmod(ep[len("ipc://"):], 0o666)

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        self._take_lock()
        self.journal_path = self.root / "journal.jsonl"
        self.locker = Locker(self.backend, self.lock_timeout)
        summary = undo_outstanding(self.journal_path, self.unlock_journaled)
        if any(summary[k] for k in ("restored", "thawed", "unlocked")):
            log.warning("replayed the journal of an earlier arbiter: %s", summary)
        self.journal = Journal(self.journal_path)
        self.placer = CgroupPlacer(self.cgroups == "auto")
        self.freezer = Freezer(self.journal.record, self.cgroup_of_session,
                               self.placer.relative if self.placer.enabled else None)
        self.cores = CoreBook()
        self._bind()
        self.gate = Gate(self.publish)
        self.sessions = SessionTable(paths.proof_dir(self.root), self._session_died)
        self.scheduler = Scheduler(self)
        if self.guardian:
            self._start_guardian()
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        kind = "SIMULATED GPUs (fake backend)" if self.backend.simulated else self.backend.name
        log.info("krex arbiter %s on %s: %d GPU(s), %s", __version__, self.bound, self.gpu_count, kind)
        tasks = [asyncio.ensure_future(self._recv_loop())]
        if self.guardian:
            tasks.append(asyncio.ensure_future(self._keep_guardian()))
        if self.telemetry_interval > 0:
            tasks.append(asyncio.ensure_future(self._telemetry()))
        if ready is not None:
            ready.set()
        try:
            await self._stopping.wait()
        finally:
            for t in tasks:
                t.cancel()
            await self.scheduler.shutdown()
            self.sessions.close()
            self.placer.sweep()
            self.journal.close()
            self.locker.shutdown()
            self.router.close()
            self.pub.close()
            self.ctx.term()
            # A socket file left behind would make clients wait for a hello that never comes.
            for ep in (self.bound, self.events):
                if ep.startswith("ipc://"):
                    with contextlib.suppress(OSError):
                        os.unlink(ep[len("ipc://"):])
            if self._guardian is not None:
                self._guardian.terminate()
                self._guardian.wait()
            self.backend.close()
            log.info("krex arbiter stopped")

    async def _telemetry(self) -> None:
        """Publish ``krex.telemetry`` every ``telemetry_interval`` s for dashboards: one backend query per
        period, whatever the number of subscribers (``seq`` numbers the events)."""
        from .status import node_status

        loop = asyncio.get_running_loop()
        for seq in itertools.count(1):
            await asyncio.sleep(self.telemetry_interval)
            try:
                data = node_status(self)
                # Per-process GPU memory (NVML lists it; the fake backend has none), off the loop.
                procs = await loop.run_in_executor(
                    None, lambda: [{"gpu": g, "pid": p.pid, "used_memory": p.used_memory}
                                   for g in range(self.gpu_count) for p in self.backend.processes(g)])
            except Exception:
                log.exception("telemetry failed")
                continue
            self.publish("telemetry", {**data, "seq": seq, "interval": self.telemetry_interval,
                                       "processes": procs, "regions": list(self.scheduler.history)[-20:]})

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    # -- requests -------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        # After each wake-up, take whatever else is queued without going back to the loop:
        # the drain acks of many sessions arrive together.
        sync = self._router_sync
        while True:
            batch = [await self.router.recv_multipart(copy=True)]
            for _ in range(256):
                try:
                    batch.append(sync.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            for frames in batch:
                try:
                    self._handle(frames)
                except Exception:  # the arbiter never dies of a message
                    log.exception("unexpected error handling a message")

    def _handle(self, frames: list[bytes]) -> None:
        identity, body = frames[0], frames[1:]
        envelope: list[bytes] = []
        if len(body) == 2 and body[0] == b"":  # a REQ client's delimiter
            envelope, body = [b""], body[1:]
        if len(body) != 1:
            self._reply(identity, envelope, None, None,
                        ProtocolError(f"expected one message frame, got {len(body)}"))
            return
        data = body[0]
        try:
            request = protocol.decode_request(data)
        except ProtocolError as exc:
            self._reply(identity, envelope, protocol.request_id(data), None, exc)
            return

        def reply(result: Any, error: KrexError | None = None) -> None:
            self._reply(identity, envelope, request.id, result, error)

        handler = getattr(self, f"_op_{type(request).__name__.lower()}")
        try:
            result = handler(request, identity, reply)
        except KrexError as exc:
            reply(None, exc)
            return
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(lambda t: self._finish_async(t, reply))
        elif result is not _DEFERRED:
            reply(result)

    @staticmethod
    def _finish_async(task: asyncio.Task[Any], reply: Any) -> None:
        if task.cancelled():
            reply(None, KrexError("the arbiter is shutting down"))
        elif isinstance(task.exception(), KrexError):
            reply(None, task.exception())
        elif task.exception() is not None:
            log.error("request failed", exc_info=task.exception())
            reply(None, KrexError(f"internal error: {task.exception()}"))
        else:
            reply(task.result())

    def _reply(self, identity: bytes, envelope: list[bytes], rid: int | None, result: Any,
               error: KrexError | None) -> None:
        if error is not None:
            body = protocol.Reply(id=rid, ok=False,
                                  error=protocol.ErrorBody(type(error).__name__, str(error)))
        else:
            body = protocol.Reply(id=rid, result=result)
        self._send(self._router_sync, [identity, *envelope, protocol.encode(body)])

    @staticmethod
    def _send(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        # Plain non-blocking sends: ROUTER and PUB never block (they drop for a gone or slow
        # peer), and the asyncio socket's per-send futures cost more than the message itself.
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a message to a peer that is not reading")

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < self.gpu_count:
            raise InvalidRequest(f"GPU {gpu} does not exist: this node has GPUs 0..{self.gpu_count - 1}")

    def _op_hello(self, req: protocol.Hello, identity: bytes, reply: Any) -> Any:
        return {"version": __version__, "protocol": protocol.VERSION, "pid": os.getpid(),
                "gpus": self.gpu_count, "proof_dir": str(self.sessions.proof_dir),
                "events": self.events, **self.backend_info}

    def _op_status(self, req: protocol.Status, identity: bytes, reply: Any) -> Any:
        from .status import node_status

        return node_status(self)

    def _op_regions(self, req: protocol.Regions, identity: bytes, reply: Any) -> Any:
        return list(self.scheduler.history)[-max(0, req.limit):]

    def place(self) -> int:
        """Fewest sessions, then most free memory."""
        inventory = {g.index: g for g in self.backend.inventory()}
        counts = {g: len(self.sessions.on_gpu(g)) for g in range(self.gpu_count)}

        def key(g: int) -> tuple[int, int, int]:
            info = inventory.get(g)
            free = (info.memory_total - info.memory_used) if info else 0
            return (counts[g], -free, g)

        return min(range(self.gpu_count), key=key)

    def _op_place(self, req: protocol.Place, identity: bytes, reply: Any) -> Any:
        return {"gpu": self.place()}

    def _op_register(self, req: protocol.Register, identity: bytes, reply: Any) -> Any:
        if req.role not in protocol.ROLES:
            raise InvalidRequest(f"unknown role {req.role!r}; one of {', '.join(protocol.ROLES)}")
        if len(req.name) > 200:
            raise InvalidRequest("a session name has at most 200 characters")
        gpu = self.place() if req.gpu is None else req.gpu
        self._check_gpu(gpu)
        self.sessions.verify_uid(req.uid, req.proof)
        within = ""
        if req.within:
            region = self.scheduler.find(req.within)
            # Only a descendant of a live region's holder is part of it; a stale or false
            # claim (an inherited KREX_REGION) just makes an ordinary session.
            if region is not None and region.session.pid in ancestors(req.pid):
                within = req.within
        session = self.sessions.add(req.pid, req.uid, req.role, req.name, gpu,
                                    identity if req.control else None, within)
        session.cgroup = self.placer.place(session.id, session.pid)
        self.publish("session", {"event": "joined", **session.public()})
        self.scheduler.intruder_session(session)
        return {"session": session.id, "token": session.token, "gpu": gpu, **self.backend_info}

    def _op_unregister(self, req: protocol.Unregister, identity: bytes, reply: Any) -> Any:
        session = self.sessions.get(req.session, req.token)
        self.sessions.remove(session.id)
        self._session_gone(session, "session ended")
        return {"session": session.id}

    def _session_died(self, session: Session) -> None:
        self._session_gone(session, "holder process exited")

    def _session_gone(self, session: Session, reason: str) -> None:
        self.scheduler.session_gone(session, reason)
        self.placer.remove(session.cgroup)
        self.publish("session", {"event": "left", **session.public()})

    def _op_acquire(self, req: protocol.Acquire, identity: bytes, reply: Any) -> Any:
        session = self.sessions.get(req.session, req.token)
        gpu = session.gpu if req.gpu is None else req.gpu
        self._check_gpu(gpu)
        max_hold = self.max_hold if req.max_hold is None else req.max_hold
        if not 0 < max_hold <= self.max_hold_limit:
            raise InvalidRequest(f"max_hold must be in (0, {self.max_hold_limit:g}] seconds, not {max_hold}")
        cores = self.isolate_cores if req.cores is None else req.cores
        if not 0 <= cores <= 1024:
            raise InvalidRequest(f"cores must be between 0 and 1024, not {cores}")
        parent = self.scheduler.active[gpu]
        if parent is not None and session.within == parent.id and parent.state == "held":
            # Started by the holder inside its region (krex exclusive -- CMD): the region is
            # already theirs; queueing behind it would wait for ourselves.
            return {"region": parent.id, "gpu": gpu, "report": {**parent.report(self.backend_info), "nested": True}}
        mine = [r for r in [self.scheduler.active[gpu], *self.scheduler.queues[gpu]]
                if r is not None and r.session.id == session.id]
        if mine:
            raise InvalidRequest(f"session {session.id} already holds or waits for {mine[0].id} on GPU {gpu}")
        if len(req.exempt) > 16:
            raise InvalidRequest("at most 16 exempt processes")
        for pid in req.exempt:
            owner = proc_uid(pid)
            if owner is None:
                raise InvalidRequest(f"exempt process {pid} does not exist")
            if session.uid != 0 and owner != session.uid:
                raise PermissionDenied(f"process {pid} belongs to uid {owner}: a region may only exempt its own user's")
        region = self.scheduler.request(session, gpu, max_hold, req.freeze, req.isolate, cores, reply)
        region.asked_exempt = list(req.exempt)
        return _DEFERRED

    def _op_release(self, req: protocol.Release, identity: bytes, reply: Any) -> Any:
        session = self.sessions.get(req.session, req.token)
        region = self.scheduler.find(req.region)
        if region is None:
            past = self.scheduler.past(req.region)
            if past is not None and past["session"] == session.id:
                return past  # already released (lease expiry): the report says why
            raise NotHolder(f"region {req.region!r} is not held or requested by session {session.id}")
        if session.within == region.id and region.session.id != session.id:
            return {**region.report(self.backend_info), "nested": True}  # the holder releases it
        if region.session.id != session.id:
            raise NotHolder(f"region {req.region} belongs to another session; only its holder can release it")
        return self.scheduler.release(region, "released by holder")

    def _op_drainack(self, req: protocol.DrainAck, identity: bytes, reply: Any) -> Any:
        session = self.sessions.get(req.session, req.token)
        region = self.scheduler.find(req.region)
        fut = region.acks.get(session.id) if region is not None else None
        if fut is not None and not fut.done():
            fut.set_result(None)
        return {}


_DEFERRED = object()
