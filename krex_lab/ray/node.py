"""One KREX node service per Ray node: that node's arbiter and pool, owned or found.

:class:`NodeService` is plain Python (the Ray actor :data:`NodeActor` wraps it; tests can use it
without Ray). On a node whose arbiter already runs as the node's service (systemd, a DaemonSet,
a Slurm prolog) and answers at the runtime dir's endpoint, it is used as it is and never stopped;
otherwise the service starts ``krex arbiter`` there. The same holds for the pool. What it starts
dies with it (``PR_SET_PDEATHSIG``, SIGKILL: a node lost with Ray loses its KREX processes as a
crash would, and the arbiter's guardian undoes what its regions did; see docs/cluster.md).

One actor per node, named :func:`actor_name` in the namespace :data:`NAMESPACE`, pinned there by
``NodeAffinitySchedulingStrategy(soft=False)`` and detached (it outlives the driver or task that
made it: the node's service, until :func:`stop_nodes` or the node's end).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import msgspec

from .. import launcher
from ..arbiter.history import HistoryRow, Recent
from ..gpu.vendors import vendor
from ..node_status import NodeStatus as ArbiterStatus
from ..workers.wire import PoolTable

#: the Ray namespace of the node actors
NAMESPACE = "krex"
#: the custom resource a node declares for each simulated (fake backend) GPU; on real GPUs Ray's own "GPU"
FAKE_RESOURCE = "krex_gpu"


class NodeInfo(msgspec.Struct, kw_only=True):
    """Where a node's KREX services are: made by :meth:`NodeService.info`, read by the evaluation
    tasks on that node (they connect to ``pool_endpoint``) and by ``krex status --ray``.
    ``owned``: per service, whether this node service started it (False: it found it running).
    The places are "" only in a :class:`~krex_lab.ray.cluster.ClusterNode` of a node without a
    service."""

    node: str
    node_id: str
    hostname: str = ""
    runtime_dir: str = ""
    arbiter_endpoint: str = ""
    pool_endpoint: str = ""
    owned: dict[str, bool] = {}
    pids: dict[str, int] = {}
    actor_pid: int | None = None


class NodeStatus(NodeInfo, kw_only=True, omit_defaults=True):
    """:class:`NodeInfo` plus what the node's services answer (:meth:`NodeService.status`): the
    arbiter's status table and the pool's status as their replies give them (or why each did not
    answer)."""

    arbiter: ArbiterStatus | None = None
    arbiter_error: str | None = None
    pool: PoolTable | None = None
    pool_error: str | None = None


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """How a node service starts what is missing on its node (found services are used as they are).

    ``resource``: the Ray resource that marks a KREX node and that each evaluation takes a fraction
    of: :data:`FAKE_RESOURCE` (declared per node, ``ray start --resources='{"krex_gpu": 2}'``) on the
    fake backend, ``"GPU"`` on real GPUs. ``runtime_dir``: None takes the node's own
    (``KREX_RUNTIME_DIR`` in the raylet's environment, else KREX's default: ``/run/krex`` for root).
    ``fake_gpus``: GPUs of a fake-backend arbiter (None: the node's amount of ``resource``).
    ``preload``: modules each context worker imports (None: the pool's default).
    """

    backend: str = "auto"
    resource: str = FAKE_RESOURCE
    runtime_dir: str | None = None
    fake_gpus: int | None = None
    workers_per_gpu: int = 2
    spares_per_gpu: int = 0
    preload: tuple[str, ...] | None = None
    arbiter_args: tuple[str, ...] = ()
    pool_args: tuple[str, ...] = ()
    start_timeout: float = 60.0


def actor_name(node_id: str) -> str:
    return f"krex-node-{node_id}"


class NodeService:
    """This node's arbiter and pool (see the module's docstring)."""

    def __init__(self, config: NodeConfig, node_id: str = "", resources: float | None = None) -> None:
        from krex_lab import paths

        self.config = config
        self.node_id = node_id
        self.hostname = socket.gethostname()
        self.name = f"{self.hostname}/{node_id[:8]}" if node_id else self.hostname
        if config.runtime_dir:
            os.environ[paths.RUNTIME_DIR_ENV] = config.runtime_dir
        self.runtime_dir = paths.runtime_dir()  # created (0700) and checked
        self.arbiter_endpoint = f"ipc://{self.runtime_dir / 'arbiter.sock'}"
        self.pool_endpoint = f"ipc://{self.runtime_dir / 'pool.sock'}"
        self.env = {
            **os.environ,
            paths.RUNTIME_DIR_ENV: str(self.runtime_dir),
            paths.ENDPOINT_ENV: self.arbiter_endpoint,
            paths.POOL_ENDPOINT_ENV: self.pool_endpoint,
        }
        self.env.pop("KREX_REGION", None)
        os.environ.update({k: self.env[k] for k in (paths.ENDPOINT_ENV, paths.POOL_ENDPOINT_ENV)})
        self.gpus = config.fake_gpus or max(1, int(resources or 1))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.owned: dict[str, bool] = {"arbiter": False, "pool": False}
        self.started_at = time.time()
        self._ensure_arbiter()
        self._ensure_pool()

    # -- start or find ------------------------------------------------------------------------------
    def _spawn(self, what: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = self.runtime_dir / f"{what}.log"
        proc = launcher.start(cmd, log, env=self.env, cwd="/", kill_with_parent=True)
        self.procs[what] = proc
        self.owned[what] = True
        return proc

    def _wait(self, what: str, answers: Callable[[], bool]) -> None:
        proc = self.procs[what]
        if not launcher.wait_until(answers, lambda: proc.poll() is None, self.config.start_timeout, 0.1):
            tail = (self.runtime_dir / f"{what}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the {what} of node {self.name} did not start (code {proc.poll()}):\n{tail}")

    def _arbiter_answers(self) -> bool:
        from krex_lab import client
        from krex_lab.errors import KrexError

        try:
            client.hello(self.arbiter_endpoint, timeout=0.5)
            return True
        except KrexError:
            return False

    def _pool_answers(self) -> bool:
        from krex_lab.errors import KrexError
        from krex_lab.workers.client import PoolClient

        try:
            PoolClient.connect(self.pool_endpoint, start=False).close()
            return True
        except KrexError:
            return False

    def _ensure_arbiter(self) -> None:
        if self._arbiter_answers():
            return
        cmd = [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", self.config.backend]
        if self.config.backend != "auto" and vendor(self.config.backend).simulated:
            cmd += ["--fake-gpus", str(self.gpus)]
        self._spawn("arbiter", [*cmd, *self.config.arbiter_args])
        self._wait("arbiter", self._arbiter_answers)

    def _ensure_pool(self) -> None:
        if self._pool_answers():
            return
        c = self.config
        cmd = [
            sys.executable,
            "-m",
            "krex_lab.workers.pool",
            f"--endpoint={self.pool_endpoint}",
            f"--Pool.workers_per_gpu={c.workers_per_gpu}",
            f"--Pool.spares_per_gpu={c.spares_per_gpu}",
        ]
        if c.preload is not None:
            cmd.append(f"--Pool.preload={list(c.preload)!r}")
        self._spawn("pool", [*cmd, *c.pool_args])
        self._wait("pool", self._pool_answers)

    # -- what the actor answers ---------------------------------------------------------------------
    def info(self) -> NodeInfo:
        """Where this node's services are (what an evaluation task on this node connects to)."""
        return NodeInfo(
            node=self.name,
            node_id=self.node_id,
            hostname=self.hostname,
            runtime_dir=str(self.runtime_dir),
            arbiter_endpoint=self.arbiter_endpoint,
            pool_endpoint=self.pool_endpoint,
            owned=dict(self.owned),
            pids={k: p.pid for k, p in self.procs.items()},
            actor_pid=os.getpid(),
        )

    def status(self) -> NodeStatus:
        """The node's arbiter table and its pool's status (an ``error`` per part that did not answer)."""
        from krex_lab import client
        from krex_lab.workers.client import PoolClient

        out = NodeStatus(**msgspec.structs.asdict(self.info()))
        try:
            out.arbiter = ArbiterStatus.of(client.status(self.arbiter_endpoint, timeout=5.0))
        except Exception as exc:
            out.arbiter_error = f"{type(exc).__name__}: {exc}"
        try:
            with PoolClient.connect(self.pool_endpoint, start=False) as pool:
                out.pool = pool.status()
        except Exception as exc:
            out.pool_error = f"{type(exc).__name__}: {exc}"
        return out

    def history(self, since: float | None = None, limit: int = 100000) -> list[HistoryRow]:
        """Finished regions of this node's arbiter (its history database), oldest first."""
        from krex_lab import client, protocol

        conn = client.Connection(self.arbiter_endpoint)
        try:
            reply = conn.call(protocol.History(limit=limit, since=since, ticket=conn.ticket()), timeout=30.0)
        finally:
            conn.close()
        return msgspec.convert(reply, Recent, strict=False).rows

    def stop(self) -> None:
        """Stop what this service started (SIGTERM: the pool ends its jobs, the arbiter undoes its regions)."""
        for what in ("pool", "arbiter"):
            proc = self.procs.pop(what, None)
            if proc is not None:
                launcher.stop(proc, 15)
