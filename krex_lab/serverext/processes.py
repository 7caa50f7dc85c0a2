"""The processes the server extension runs: the embedded arbiter and this user's pool service.

:class:`Services` finds the arbiter (``KREX_ENDPOINT`` or the default ipc socket), starts an
embedded one when none answers, starts the pool service, exports both endpoints into
``os.environ`` (kernels inherit them) and, at server stop, ends what it started: the arbiter
first (its shutdown thaws and unlocks everything it did), then the pool and every process
left under it. Children run under :mod:`krex_lab.launcher`'s guard, so they also end when
the server itself is killed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .. import discovery, launcher, paths, protocol
from ..errors import KrexError
from ..gpu import FAKE_GPUS
from . import arbiter_kind
from .arbiter_watch import ArbiterWatch, gone_message, replaceable

Logger = logging.Logger | logging.LoggerAdapter[Any]

POOL_MODULE = "krex_lab.workers.pool"
#: how often a child that died is started again before the extension gives up on it
MAX_RESTARTS = 5


@dataclass
class Options:
    """What :class:`Services` needs from the extension's traitlets."""

    endpoint: str = ""
    #: the node's root arbiter, tried when no endpoint is given explicitly ("" : none)
    node_endpoint: str = arbiter_kind.NODE_ENDPOINT
    embedded: bool = True
    backend: str = "auto"
    fake_gpus: int = FAKE_GPUS
    runtime_dir: str = ""
    arbiter_args: list[str] = field(default_factory=list)
    start_pool: bool = True
    pool_endpoint: str = ""
    pool_args: list[str] = field(default_factory=list)
    startup_timeout: float = 20.0
    stop_timeout: float = 10.0


def pool_available() -> bool:
    """Whether this installation has the pool service (``krex_lab.workers.pool``)."""
    try:
        return importlib.util.find_spec(POOL_MODULE) is not None
    except (ImportError, ValueError):
        return False


class ServicesInfo(msgspec.Struct, kw_only=True):
    """This server's KREX services, as ``/krex/api/status`` shows them (``server``)."""

    endpoint: str
    #: which arbiter: "node", "embedded" or "user" (see arbiter_kind)
    arbiter: str
    arbiter_description: str
    pool_endpoint: str
    #: the embedded arbiter's pid while it runs
    embedded_arbiter: int | None
    #: the pool's pid while it runs
    pool: int | None
    pool_installed: bool
    problems: list[str]


class Services:
    """Finds or starts the arbiter, starts the pool, exports the endpoints; :meth:`stop` undoes it."""

    def __init__(
        self,
        options: Options,
        logger: Logger | None = None,
        hello: Callable[[str, float], object] | None = None,
    ) -> None:
        from ..client import hello as client_hello

        self.log: Logger = logger or logging.getLogger("krex.serverext")
        self.options = options
        self._hello = hello or client_hello
        self.endpoint = ""
        self.pool_endpoint = ""
        self.runtime: Path | None = None
        self.private_runtime: Path | None = None
        self.arbiter: launcher.ManagedProcess | None = None
        self.pool: launcher.ManagedProcess | None = None
        #: who the arbiter in use is (None: none answered)
        self.info: protocol.Info | None = None
        #: which arbiter this server uses: "node", "embedded" or "user" (see arbiter_kind)
        self.kind = "user"
        self.problems: list[str] = []
        self._saved_env: dict[str, str | None] = {}
        self._stopped = False
        self._restarts: dict[str, int] = {}
        #: this server's record of the arbiter it uses, for the `krex` commands of this user (discovery)
        self.record: Path | None = None
        self._watch: ArbiterWatch | None = None
        self._gone_problem = ""

    # -- start ----------------------------------------------------------------------------
    def start(self) -> None:
        o = self.options
        try:  # before KREX_RUNTIME_DIR is exported (a private runtime's)
            record_dir: Path | None = paths.own_runtime_dir()  # where `krex` looks for labs' records
        except (OSError, KrexError) as exc:
            record_dir = None
            self.log.warning("KREX: the `krex` commands of this user will not find this server's arbiter: %s", exc)
        explicit = o.endpoint or os.environ.get(paths.ENDPOINT_ENV) or ""
        candidates: list[tuple[str, str]] = []  # (endpoint, kind) in the order they are tried
        if explicit:
            kind = "node" if explicit == o.node_endpoint or self._root_listener(explicit) else "user"
            candidates.append((explicit, kind))
        else:
            if o.node_endpoint:
                candidates.append((o.node_endpoint, "node"))
            own = discovery.own_endpoint()
            if own != o.node_endpoint:
                candidates.append((own, "user"))
        for endpoint, kind in candidates:
            info = self._probe(endpoint, 1.0)
            if info is not None:
                self.endpoint, self.kind, self.info = endpoint, kind, info
                self._say_using()
                self._watch = ArbiterWatch(endpoint, self._probe)
                break
        else:
            self.endpoint = explicit
            if o.embedded:
                self._start_arbiter()
            else:
                self.endpoint = explicit or o.node_endpoint or discovery.own_endpoint()
                self.kind = "node" if self.endpoint == o.node_endpoint else "user"
                self._problem(
                    f"no KREX arbiter answers at {' or '.join(e for e, _ in candidates)} and the embedded one "
                    "is off (KrexExtensionApp.embedded): kernels start without a GPU placement"
                )
        if record_dir is not None:
            self._write_record(record_dir)
        self._export(paths.ENDPOINT_ENV, self.endpoint)
        self._export(arbiter_kind.KIND_ENV, self.kind)
        if self.private_runtime is not None:
            self._export(paths.RUNTIME_DIR_ENV, str(self.private_runtime))
        self.pool_endpoint = (
            o.pool_endpoint or os.environ.get(paths.POOL_ENDPOINT_ENV) or f"ipc://{self._runtime() / 'pool.sock'}"
        )
        self._export(paths.POOL_ENDPOINT_ENV, self.pool_endpoint)
        if o.start_pool:
            self.start_pool()

    def _say_using(self, log: str = "") -> None:
        """The one line that says which arbiter this server uses (and, loudly, a simulated GPU)."""
        level, line = arbiter_kind.using_line(self.arbiter_description, self.endpoint, self.info, log)
        self.log.log(level, "KREX: %s", line)

    def _write_record(self, directory: Path) -> None:
        try:
            self.record = discovery.write_lab_record(directory, self.endpoint, self.kind)
        except OSError as exc:
            self.log.warning("KREX: the `krex` commands of this user will not find this server's arbiter: %s", exc)

    @property
    def arbiter_description(self) -> str:
        """``node arbiter (root, ipc:///run/krex/arbiter.sock)``, ``embedded arbiter (this
        server's own)`` or ``arbiter of this user (ENDPOINT)``: the log and the REST status say it."""
        return arbiter_kind.describe(self.kind, self.endpoint)

    @staticmethod
    def _root_listener(endpoint: str) -> bool:
        """A root-owned listener seen by a non-root server: the node's arbiter."""
        return os.geteuid() != 0 and arbiter_kind.listener_uid(endpoint) == 0

    def _probe(self, endpoint: str, timeout: float) -> protocol.Info | None:
        try:
            return msgspec.convert(self._hello(endpoint, timeout), protocol.Info, strict=False)
        except KrexError:
            return None

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        self.log.warning("KREX: %s", message)

    def _runtime(self) -> Path:
        if self.runtime is None:
            if self.options.runtime_dir:
                self.runtime = Path(self.options.runtime_dir)
            else:
                self.runtime = paths.runtime_dir()
                if _owner(self.runtime) != os.geteuid():
                    # KREX_RUNTIME_DIR names the node arbiter's (root's) dir: the pool, this
                    # user's, keeps its socket and logs in a private dir of its own.
                    self.runtime = paths.own_runtime_dir()
        return self.runtime

    def _start_arbiter(self) -> None:
        o = self.options
        runtime = self._runtime()
        if _lock_held(runtime / "arbiter.lock"):
            # An arbiter owns that runtime dir but does not answer here: do not fight it, use our own.
            self.private_runtime = Path(tempfile.mkdtemp(prefix="krex-lab-"))
            self._problem(
                f"an arbiter holds {runtime} but does not answer at "
                f"{self.endpoint or 'its socket'}: the embedded arbiter uses {self.private_runtime}"
            )
            runtime = self.runtime = self.private_runtime
        endpoint = self.endpoint or f"ipc://{runtime / 'arbiter.sock'}"
        args = [
            "arbiter",
            "--backend",
            o.backend,
            "--fake-gpus",
            str(o.fake_gpus),
            "--endpoint",
            endpoint,
            "--runtime-dir",
            str(runtime),
            *o.arbiter_args,
        ]
        env = {**os.environ, paths.RUNTIME_DIR_ENV: str(runtime), paths.ENDPOINT_ENV: endpoint}
        self.arbiter = launcher.ManagedProcess(
            "embedded arbiter", "krex_lab.cli", args, env, runtime / "arbiter-embedded.log", self.log
        )
        self.arbiter.start(say=False)  # said with what it is, once it answers
        self.endpoint = endpoint
        self.kind = "embedded"
        info = self._wait_ready(self.arbiter, lambda: self._probe(endpoint, 0.5))
        if info is None:
            self._problem(f"the embedded arbiter did not answer at {endpoint}:\n{self.arbiter.log_tail()}")
            return
        self.info = info
        self._say_using(str(self.arbiter.log_path))

    def _wait_ready(self, proc: launcher.ManagedProcess, probe: Callable[[], Any]) -> Any:
        return launcher.wait_until(probe, proc.alive, self.options.startup_timeout)

    def start_pool(self) -> None:
        if not pool_available():
            self._problem(f"the pool service ({POOL_MODULE}) is not installed: %%krex cells cannot run until it is")
            return
        served = _pool_gpus(self.pool_endpoint)
        if served is not None and not self._reuse_pool(served):  # it lacks GPUs this lab places kernels on
            self.pool_endpoint = f"ipc://{self._runtime() / f'pool-lab-{os.getpid()}.sock'}"
            self._export(paths.POOL_ENDPOINT_ENV, self.pool_endpoint)
        elif served is not None:
            return
        env = {**os.environ, paths.ENDPOINT_ENV: self.endpoint, paths.POOL_ENDPOINT_ENV: self.pool_endpoint}
        # --step-aside: a pool of this user that starts serving meanwhile is used (see check()).
        args = [
            f"--endpoint={self.pool_endpoint}",
            f"--arbiter={self.endpoint}",
            "--step-aside",
            *self.options.pool_args,
        ]
        self.pool = launcher.ManagedProcess(
            "pool service", POOL_MODULE, args, env, self._runtime() / "pool-embedded.log", self.log
        )
        self.pool.start()
        if not self._wait_ready(self.pool, lambda: _pool_answers(self.pool_endpoint)):
            self._problem(f"the pool service did not answer at {self.pool_endpoint}:\n{self.pool.log_tail()}")

    def _reuse_pool(self, found: tuple[list[int], bool]) -> bool:
        """Whether the pool already serving (a second `krex lab`, one after `krex run`) serves every
        GPU this lab places kernels on; said in one line either way. A pool started before any
        arbiter answered assumed the GPUs it found alone: it serves the arbiter's once it finds it
        (within its resync, waited for here); one that follows an arbiter already keeps what it
        serves, and this lab starts a pool of its own."""
        wanted = list(range(self.info.gpus)) if self.info is not None else []
        deadline = time.monotonic() + min(self.options.startup_timeout, 5.0)
        first, (served, follows) = found[0], found
        while not set(wanted) <= set(served) and not follows and time.monotonic() < deadline:
            time.sleep(0.1)
            served, follows = _pool_gpus(self.pool_endpoint) or ([], True)
        if set(wanted) <= set(served):
            resized = f" (it served GPUs {first}; it now serves this lab's arbiter's)" if served != first else ""
            self.log.info("KREX: using the pool already serving at %s, GPUs %s%s", self.pool_endpoint, served, resized)
            return True
        self.log.warning(
            "KREX: the pool already serving at %s serves GPUs %s, not all of %s that this lab places kernels "
            "on: this lab starts a pool of its own",
            self.pool_endpoint,
            served,
            wanted,
        )
        return False

    def _export(self, name: str, value: str) -> None:
        if name not in self._saved_env:
            self._saved_env[name] = os.environ.get(name)
        os.environ[name] = value

    # -- watch and stop -------------------------------------------------------------------
    def check(self) -> None:
        """Restart a child that died while the server runs (called periodically, at most
        ``MAX_RESTARTS`` times each: a child that keeps dying is reported, not looped on)."""
        if self._stopped:
            return
        if self._watch is not None:
            self._check_joined(self._watch)
        for name, child in (("arbiter", self.arbiter), ("pool", self.pool)):
            if child is None or child.alive() or self._restarts.get(name, 0) >= MAX_RESTARTS:
                continue
            assert child.proc is not None
            if name == "pool" and child.proc.returncode == 0 and _pool_answers(self.pool_endpoint):
                # Another pool of this user already serves the endpoint (one `krex run` started on
                # demand): ours stepped aside, as a second pool does. Use that one; nothing to restart.
                self.log.info("KREX: using the pool already serving at %s", self.pool_endpoint)
                self.pool = None
                continue
            self._restarts[name] = self._restarts.get(name, 0) + 1
            give_up = self._restarts[name] >= MAX_RESTARTS
            self.log.error(
                "KREX: the %s (pid %d) exited with status %s; %s:\n%s",
                child.name,
                child.proc.pid,
                child.proc.returncode,
                "giving up" if give_up else "starting it again",
                child.log_tail(),
            )
            if give_up:
                self._problem(f"the {child.name} keeps exiting: see {child.log_path}")
            elif name == "arbiter":
                self.endpoint = child.env[paths.ENDPOINT_ENV]
                self._start_arbiter()
            else:
                self.start_pool()

    def _check_joined(self, watch: ArbiterWatch) -> None:
        """The arbiter this server joined (not its own): replace it when it is this user's own and
        gone, else say loudly when it is gone, and when it is back (arbiter_watch says why)."""
        change = watch.check()
        runtime = self._runtime()
        if (
            watch.lost_since is not None
            and self.options.embedded
            and replaceable(self.kind, self.endpoint, runtime, _lock_held)
        ):
            self.log.warning(
                "KREX: the %s is gone: this server starts its embedded arbiter in its place, at the same endpoint",
                self.arbiter_description,
            )
            self._watch = None
            if self._gone_problem in self.problems:
                self.problems.remove(self._gone_problem)
            self._start_arbiter()
            self._export(arbiter_kind.KIND_ENV, self.kind)
            if self.record is not None:
                self._write_record(self.record.parent)
            return
        if change == "gone":
            self._gone_problem = gone_message(self.arbiter_description, self.endpoint, self.kind)
            self.problems.append(self._gone_problem)
            self.log.error("KREX: %s", self._gone_problem)
        elif change == "back":
            info = self._probe(self.endpoint, 2.0)
            if self._gone_problem in self.problems:
                self.problems.remove(self._gone_problem)
            self.log.warning(
                "KREX: the %s is back (pid %s): regions are granted again",
                self.arbiter_description,
                info.pid if info else "?",
            )

    def describe(self) -> ServicesInfo:
        return ServicesInfo(
            endpoint=self.endpoint,
            arbiter=self.kind,
            arbiter_description=self.arbiter_description,
            pool_endpoint=self.pool_endpoint,
            embedded_arbiter=self.arbiter.pid if self.arbiter and self.arbiter.alive() else None,
            pool=self.pool.pid if self.pool and self.pool.alive() else None,
            pool_installed=pool_available(),
            problems=list(self.problems),
        )

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _sockets(self) -> list[Path]:
        """The ipc sockets of what this server started (the embedded arbiter's three, the pool's)."""
        out: list[Path] = []
        if self.arbiter is not None and self.endpoint.startswith("ipc://"):
            path = Path(self.endpoint[len("ipc://") :])
            out += [path, Path(paths.events_endpoint(self.endpoint)[len("ipc://") :]), path.parent / "identity.sock"]
        if self.pool is not None and self.pool_endpoint.startswith("ipc://"):
            out.append(Path(self.pool_endpoint[len("ipc://") :]))
        return out

    def leftovers(self) -> list[Path]:
        """Sockets of what this server started that still exist (after :meth:`stop`: none)."""
        return [p for p in self._sockets() if os.path.lexists(p)]

    def stopped_description(self) -> str:
        """What :meth:`stop` stopped, in words (for the server's last line)."""
        done = [f"the {c.name} (pid {c.pid})" for c in (self.arbiter, self.pool) if c is not None and c.pid is not None]
        return " and ".join(done) if done else "nothing of KREX's (it started no arbiter or pool)"

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        # The arbiter first: its shutdown releases every region, thaws and unlocks, so nothing
        # (kernels, workers) stays frozen while the rest stops.
        if self.arbiter is not None:
            await self.arbiter.stop(self.options.stop_timeout)
        if self.pool is not None:
            await self.pool.stop(self.options.stop_timeout)
        for path in self.leftovers():  # a child that had to be killed could not remove its own
            try:
                path.unlink()
                self.log.info("KREX: removed the stale socket %s", path)
            except OSError as exc:
                self.log.warning("KREX: could not remove the stale socket %s: %s", path, exc)
        if self.record is not None:
            with contextlib.suppress(OSError):
                self.record.unlink()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.private_runtime is not None:
            shutil.rmtree(self.private_runtime, ignore_errors=True)


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def _lock_held(path: Path) -> bool:
    import fcntl

    try:
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def _pool_gpus(endpoint: str) -> tuple[list[int], bool] | None:
    """The GPUs the pool at ``endpoint`` serves, and whether it follows an arbiter already (None:
    no pool of this user answers there)."""
    try:
        from ..workers.client import PoolClient

        client = PoolClient.connect(endpoint, start=False)
    except Exception:
        return None
    try:
        table = client.status()
        return [g.index for g in table.gpus], table.pool.arbiter is not None
    except Exception:
        return None
    finally:
        client.close()


def _pool_answers(endpoint: str) -> bool:
    try:
        from ..workers.client import PoolClient

        client = PoolClient.connect(endpoint, start=False)
    except Exception:
        return False
    close = getattr(client, "close", None)
    if callable(close):
        close()
    return True
