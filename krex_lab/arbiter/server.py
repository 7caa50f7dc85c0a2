"""The node arbiter: one per node, the only process that signals, locks or re-pins others.

The arbiter is its parts, built when it is constructed: a :class:`~krex_lab.rpc_server.Service`
(ROUTER for requests, each answered exactly once, and PUB for events, :mod:`.events`), the session
table, the enforcement steps and the journal bundled for the :class:`~.scheduler.Scheduler`, the
region history and metrics (:mod:`.records`), and a handler per request type. :meth:`Arbiter.serve`
takes the runtime directory's lock, undoes whatever an earlier arbiter left in the journal, binds,
starts its guardian (:mod:`krex_lab.arbiter.guardian`) and serves until it is stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from traitlets import Bool, Enum, Float, Int, Unicode, default
from traitlets.config import LoggingConfigurable

from .. import paths, protocol
from ..connguard import raise_fd_limit
from ..enforcement.cgroups import CgroupPlacer
from ..enforcement.corelock import NodeCoreLock
from ..enforcement.drain import Locker
from ..enforcement.freeze import Freezer
from ..enforcement.gate import Gate
from ..enforcement.isolate import CoreBook
from ..enforcement.shield import MODES as SHIELD_MODES
from ..enforcement.shield import Shield
from ..enforcement.watch import AffinityWatch
from ..errors import KrexError
from ..gpu import FAKE_GPUS, GpuBackend, make_backend
from ..gpu.traits import BackendName
from ..node_status import NodeStatus
from ..procfiles import KEPT
from ..rpc_server import Peer, check_socket_path, lock_holder
from .enforcement import Enforcement
from .events import EventNotifier, publish_telemetry
from .fairshare import FairShare
from .guardian_link import GuardianLink
from .identity import IdentityServer, Tickets
from .journal import Journal
from .queries import NodeQueries
from .quotas import Quotas, kept_files_limit, node_session_capacity
from .records import RegionRecords
from .requests import RequestLimits, SessionRequests
from .scheduler import Scheduler, SchedulerConfig
from .sessions import SessionTable
from .slurm_jobs import SlurmJobs
from .startup import another_arbiter, arbiter_service, claim_runtime_dir, refuse_unprivileged, replay_journal
from .status import arbiter_row, hello_info, node_table

log = logging.getLogger("krex.arbiter")


class Arbiter(LoggingConfigurable):
    endpoint = Unicode(
        "",
        help="ROUTER endpoint to bind (default: $KREX_ENDPOINT, else ipc:// in the "
        "runtime dir). Events go to the matching PUB endpoint.",
    ).tag(config=True)
    runtime_dir = Unicode(
        "",
        help="Directory for the socket, journal and lock (default: $KREX_RUNTIME_DIR; else /run/krex for root, "
        "$XDG_RUNTIME_DIR/krex or /tmp/krex-UID for other users).",
    ).tag(config=True)
    backend_name = BackendName(
        "auto",
        help="GPU backend: auto picks nvidia, then amd, then the simulated fake backend.",
    ).tag(config=True)
    fake_gpus = Int(
        FAKE_GPUS, help="Number of simulated GPUs of the fake backend (the same default as krex lab's)."
    ).tag(config=True)
    max_hold = Float(
        60.0, help="Default lease of a region in seconds; at expiry it is force-released and the holder told."
    ).tag(config=True)
    max_hold_limit = Float(3600.0, help="Largest max_hold a client may ask for.").tag(config=True)
    drain_timeout = Float(1.0, help="Seconds to wait for KREX-aware sessions to confirm a drain.").tag(config=True)
    lock_timeout = Float(5.0, help="Deadline of one driver lock (it waits for the target's queued GPU work).").tag(
        config=True
    )
    lock_foreign = Bool(True, help="Lock GPU processes that are not KREX sessions too.").tag(config=True)
    lock_threads = Int(
        16,
        min=1,
        help="Threads that make a drain's driver locks at once (1: one after another). Fewer threads "
        "lock idle siblings faster (15 of them: 3.3 ms in 4 threads, 5.5 ms in 16 on the H200), but "
        "a sibling not yet locked keeps queueing GPU work: with 15 busy siblings the drain took 542 ms "
        "in 4 threads against 348 ms in 16 (benchmarks/probes/lock_cost.py, arbiter_latency.py, 2026-12-01).",
    ).tag(config=True)
    isolate_cores = Int(1, help="Cores reserved for a region's holder (never core 0 while others exist).").tag(
        config=True
    )
    guard_neighbours = Bool(
        help="Hold a region against what its neighbours do while it runs (on by default; "
        "KREX_GUARD_NEIGHBOURS=0 or --Arbiter.guard_neighbours=False turns it off). It changes the "
        "region sequence in three ways: the shield's default becomes 'auto' "
        "(a cpuset partition where the arbiter may make one); where affinities shield a region, a "
        "watch every shield_watch_interval seconds puts back any thread that widened its affinity "
        "onto the reserved cores, and the report names each intruder with its time there "
        "(degraded past shield_intrusion_bound); and the SIGSTOP freezer journals the running "
        "parents of the sessions it stops before it stops them, so that the guardian or a "
        "restarted arbiter continues a runuser, su or sudo that stopped itself.",
    ).tag(config=True)
    shield = Enum(
        list(SHIELD_MODES),
        help="What keeps everyone but a region's holder off its reserved cores: 'affinity' (every "
        "process's threads, one by one; restored exactly), 'cpuset' (a cgroup v2 partition: one "
        "operation, the kernel moves every process), 'auto' (cpuset where the arbiter may make "
        "partitions: root, a cgroup v2 hierarchy with the cpuset controller at its root; else "
        "affinity), 'sessions' (KREX sessions' threads only). Default: 'auto' with guard_neighbours, "
        "else 'affinity'.",
    ).tag(config=True)
    shield_watch_interval = Float(
        0.01,
        help="With guard_neighbours and an affinity shield: seconds between two looks for threads "
        "that put themselves back on a region's reserved cores.",
    ).tag(config=True)
    shield_intrusion_bound = Float(
        0.1,
        help="With guard_neighbours: a process whose threads sat on a region's reserved cores for "
        "longer than this in all (seconds) makes the region's report degraded.",
    ).tag(config=True)

    @default("guard_neighbours")
    def _guard_neighbours_default(self) -> bool:
        return os.environ.get("KREX_GUARD_NEIGHBOURS", "1") not in ("0", "false", "False", "no")

    @default("shield")
    def _shield_default(self) -> str:
        return "auto" if self.guard_neighbours else "affinity"

    shield_linger = Float(
        0.05,
        help="Seconds an affinity shield stays up after its region ends (only the holder gets its "
        "cores back), for a region that starts meanwhile to adopt instead of walking the node again: "
        "the next region of a timing loop or a queue. Everyone else's affinities come back when it "
        "is over (journaled like a region's). 0: restore at once. Off with shield_irqs.",
    ).tag(config=True)
    core_lock = Unicode(
        "",
        help="The node-wide lock under which regions reserve cores (default: /run/krex-cores.lock for "
        "root, else in $XDG_RUNTIME_DIR or the temporary directory). Arbiters on one node must share "
        "it: a region of one that finds it taken gets no cores and says so (see enforcement/corelock.py).",
    ).tag(config=True)
    shield_irqs = Bool(
        False,
        help="Also narrow IRQ affinities that include a region's reserved cores (where /proc/irq is "
        "writable; journaled and restored). Opt-in: not yet run on a real host's interrupts.",
    ).tag(config=True)
    poll_interval = Float(0.1, help="How often a held GPU is checked for new processes to lock.").tag(config=True)
    history = Int(200, help="How many finished regions (with reports) to keep for status and the API.").tag(config=True)
    multi_user = Bool(
        False,
        help="Let other users reach the socket (runtime dir 0755, socket 0666). A "
        "multi-user arbiter runs as root: without root it refuses to start (see "
        "allow_unprivileged_multi_user).",
    ).tag(config=True)
    allow_unprivileged_multi_user = Bool(
        False,
        help="Let a non-root arbiter serve other users anyway. Other "
        "users can then stop this user's processes in their regions, and this "
        "user's regions cannot freeze or lock theirs (every region is "
        "degraded). For trusted test setups only.",
    ).tag(config=True)
    cgroups = Enum(
        ["off", "auto"],
        default_value=None,
        allow_none=True,
        help="Place each session in a cgroup v2 of its own "
        "(<v2 root>/krex/<session>) so that freezing is cgroup.freeze, which catches every fork and "
        "sends no stop signal (a parent that waits for its child, runuser, su, sudo or a job-control "
        "shell, notices nothing); 'auto' uses it where the machine allows, else SIGSTOP. Default: "
        "'auto' for a root --multi-user arbiter, 'off' otherwise (moving an ordinary user's processes "
        "between cgroups can fight a desktop's own cgroup management). `krex status` says which "
        "freezer is in use.",
    ).tag(config=True)
    slurm = Bool(
        False,
        help="Record the Slurm job, step and account of every session and region (in `krex status`, "
        "region reports and the history: `krex history --slurm-job N`, `--usage --by job|account`). A "
        "session's job is believed only if the node's Slurm prolog (`krex slurm prolog`) admitted that "
        "job for the session's user; see docs/cluster.md.",
    ).tag(config=True)
    guardian = Bool(
        True, help="Start a guardian process that undoes every lock, freeze and re-pin if the arbiter dies."
    ).tag(config=True)
    privacy = Enum(
        ["private", "open"],
        default_value="private",
        help="What users see of each other's work: "
        "'private' shows other users' sessions and regions as user names and counts (no pids, names or "
        "reports) in status, regions and, on a multi-user arbiter, in events; 'open' shows everything "
        "(a trusted lab). Root and the admin group always see everything.",
    ).tag(config=True)
    intruder_grace = Float(
        0.5,
        help="Seconds a session that registers during another's region runs before it is "
        "drained and frozen: it hears its registration and may queue (queueing stops it at "
        "once).",
    ).tag(config=True)
    isolate_deadline = Float(
        0.5,
        help="Seconds the isolation step may spend moving other sessions' threads "
        "(it runs off the event loop); threads not reached by then are reported and the "
        "region is degraded.",
    ).tag(config=True)
    telemetry_interval = Float(
        1.0,
        help="Seconds between `krex.telemetry` events (the node status with the GPU "
        "readings, holders, queues and sessions, the GPU processes' memory and the recent "
        "regions), computed once per period however many dashboards subscribe; 0 disables.",
    ).tag(config=True)

    history_db = Unicode(
        None,
        allow_none=True,
        help="SQLite file that keeps every finished region (user, GPU, wait, hold, degraded, what was "
        "drained and frozen) across restarts, for `krex history` and the admin page. Default (None): "
        "history.sqlite in the runtime dir, which is a tmpfs for a system arbiter (/run/krex): point "
        "it at persistent storage, e.g. /var/lib/krex/history.sqlite. Its directory is created "
        "(0700) or must be the arbiter user's and writable by no one else. '' disables the history.",
    ).tag(config=True)
    history_per_user = Int(
        10_000,
        help="Finished regions history_db keeps per user: the oldest beyond it are deleted as regions "
        "are added (a user's loop of short regions adds thousands a minute; the default database sits "
        "in the runtime dir, a tmpfs for a system arbiter). 0: no cap.",
    ).tag(config=True)
    history_retention_days = Float(
        90.0, help="Days a finished region stays in history_db; older rows are deleted (0: keep forever)."
    ).tag(config=True)
    metrics_port = Int(
        0,
        help="Serve Prometheus metrics (regions, hold seconds, waits, sessions, queues, labelled by user "
        "and GPU) at http://<metrics_addr>:<port>/metrics; 0: off. Needs prometheus_client. No token: "
        "every local user may read them (user names and totals, as krex status shows them).",
    ).tag(config=True)
    metrics_addr = Unicode(
        "127.0.0.1", help="Address the metrics endpoint binds (metrics_port); 0.0.0.0 exposes it to the network."
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Built in steps, each on the parts of the ones before (as ServerApp's initialize()):
        endpoint = self.init_runtime_dir()
        self.init_backend(endpoint)
        steps, config = self.init_enforcement()
        self.init_history()
        self.init_requests(steps, config)

    def init_runtime_dir(self) -> str:
        """Refuse what must not start (an ordinary user's multi-user arbiter, a second arbiter
        here), prepare the runtime dir; the endpoint to serve."""
        refuse_unprivileged(self.multi_user, self.allow_unprivileged_multi_user)
        self.started = time.time()
        self.root, endpoint = claim_runtime_dir(self.runtime_dir, self.endpoint, self.multi_user)
        return endpoint

    def init_backend(self, endpoint: str) -> None:
        """The GPUs, the quotas and the service (its sockets and connection limits; no handler yet)."""
        # quiet: the start-up line says which backend this is and why (auto falling back to fake)
        self.backend: GpuBackend = make_backend(self.backend_name, self.fake_gpus, quiet=True)
        self.gpu_count = self.backend.gpu_count()
        self.backend_info = self.backend.describe()
        self.bound = endpoint
        self.events = paths.events_endpoint(endpoint)
        self.quotas = Quotas(parent=self)
        # Handlers are registered once the parts they call exist (init_requests).
        self.service = arbiter_service(endpoint, self.events, self.root, self.multi_user, self.quotas)

    def init_enforcement(self) -> tuple[Enforcement, SchedulerConfig]:
        """The region's steps: gate, driver locks, freezer, cores and shield, journaled."""
        self.notify = EventNotifier(self.service, private=self.multi_user and self.privacy == "private")
        self.journal_path = self.root / "journal.jsonl"
        self.journal = Journal(self.journal_path, open=False)
        self.locker = Locker(self.backend, self.lock_timeout, threads=self.lock_threads)
        cgroups = self.cgroups or ("auto" if self.multi_user and os.geteuid() == 0 else "off")
        self.placer = CgroupPlacer(cgroups == "auto")
        self.gate = Gate(self.notify.publish)
        self.sessions = SessionTable(lambda session: self.requests.session_died(session))
        self.tickets = Tickets()
        self.identity = IdentityServer(
            str(self.root / "identity.sock"), self.tickets, mode=0o666 if self.multi_user else 0o600
        )
        self.freezer = Freezer(
            self.journal.record,
            # Without placed cgroups there is nothing to look up (a scan of every session per root).
            self.sessions.cgroup_of if self.placer.enabled else None,
            self.placer.relative if self.placer.enabled else None,
            journal_kin=self.guard_neighbours,
        )
        #: what keeps others off a region's reserved cores (the ``shield`` option, resolved)
        self.shielding = Shield(self.shield, irqs=self.shield_irqs)
        #: the node's core reservation lock; its open file is shared with the guardian
        self.node_lock = NodeCoreLock(Path(self.core_lock) if self.core_lock else None)
        cores = CoreBook(node_lock=self.node_lock)
        steps = Enforcement(
            gate=self.gate,
            locker=self.locker,
            freezer=self.freezer,
            cores=cores,
            watch=AffinityWatch(cores, self.journal.record, self.shield_watch_interval)
            if self.guard_neighbours
            else None,
            intrusion_bound=self.shield_intrusion_bound,
            shield=self.shielding,
            # An adopted shield narrows no IRQs (what the region before narrowed was given back).
            linger=self.shield_linger if self.shielding.mode != "sessions" and not self.shield_irqs else 0.0,
            journal=self.journal,
            gpu_processes=self.backend.processes,
            backend_name=self.backend.name,
            own_pids=self.own_pids,
        )
        config = SchedulerConfig(
            drain_timeout=self.drain_timeout,
            lock_foreign=self.lock_foreign,
            poll_interval=self.poll_interval,
            history=self.history,
            backend_info=self.backend_info,
            intruder_grace=self.intruder_grace,
            isolate_deadline=self.isolate_deadline,
        )
        return steps, config

    def init_history(self) -> None:
        """Descriptor limits, the region history database and the metrics."""
        #: the last SIGHUP's quota reload, as `krex status` shows it (ArbiterApp.reload_quotas)
        self.quotas_note = ""
        fd_limit = raise_fd_limit()
        self.capacity = node_session_capacity(fd_limit, placed=self.placer.enabled)
        KEPT.limit = kept_files_limit(fd_limit)
        db = self.root / "history.sqlite" if self.history_db is None else self.history_db
        self.records = RegionRecords(
            db,
            retention_days=self.history_retention_days,
            arbiter=f"{os.getpid()}@{self.started:.3f}",
            per_user=self.history_per_user,
            metrics=bool(self.metrics_port),
            live=lambda: (self.scheduler.active, self.scheduler.queues, self.sessions),
        )

    def init_requests(self, steps: Enforcement, config: SchedulerConfig) -> None:
        """The scheduler, the request handlers on it, and their registration with the service."""
        self.scheduler = Scheduler(
            self.gpu_count,
            self.sessions,
            steps,
            self.notify,
            config,
            FairShare(self.quotas.half_life, self.quotas.region_overhead),
            on_finish=self.records.region_finished,
        )
        #: the handlers of the session and region requests, on the parts built above
        self.requests = SessionRequests(
            self.backend,
            self.sessions,
            self.scheduler,
            self.quotas,
            self.tickets,
            self.placer,
            self.notify,
            RequestLimits(self.max_hold, self.max_hold_limit, self.isolate_cores, self.capacity),
            slurm=SlurmJobs(self.root) if self.slurm else None,
        )
        self.queries = NodeQueries(
            self.status,
            self.scheduler,
            self.tickets,
            self.quotas,
            self.records.database,
            self.multi_user,
            self.privacy,
        )
        self.guardian_link = GuardianLink(self.journal_path, self.backend.name, self.node_lock)
        self.service.handlers.update(
            {protocol.Hello: self._hello, **self.queries.handlers(), **self.requests.handlers()}
        )

    def own_pids(self) -> set[int]:
        pids = {os.getpid()}
        if self.guardian_link.pid is not None:
            pids.add(self.guardian_link.pid)
        return pids

    # -- lifecycle ------------------------------------------------------------------------
    async def serve(self, ready: asyncio.Event | None = None) -> None:
        for path in (self.service.endpoint, self.events or "", self.identity.path):
            check_socket_path(path)  # first: a socket that cannot be made refuses the start, and nothing is made
        if not self.service.take_lock(note=f"{os.getpid()}\n", wait=5.0):
            raise KrexError(another_arbiter(lock_holder(self.root / "arbiter.lock") or "", self.root, self.bound))
        self.records.serve_metrics(self.metrics_port, self.metrics_addr)
        replay_journal(self.journal_path, self.backend, self.locker)
        self.journal.open()
        last = self.records.open()
        if last is not None:
            self.scheduler.number_after(last)
        why = self.node_lock.open()
        if why:  # every region will say so too (it gets no cores)
            log.warning("%s: regions will reserve no cores", why)
        background = []
        if self.guardian:
            self.guardian_link.start()  # armed before the first client can be served
            background.append(self.guardian_link.keep())
        self.service.bind()
        await self.identity.start()
        if self.telemetry_interval > 0:
            background.append(
                publish_telemetry(
                    self.notify,
                    self.telemetry_interval,
                    self.status,
                    self.backend,
                    self.gpu_count,
                    lambda: self.scheduler.history,
                )
            )
        if self.records.metrics is not None:
            # the gauges' snapshot every telemetry period (1 s when telemetry is off)
            background.append(
                self.records.refresh_metrics(self.telemetry_interval if self.telemetry_interval > 0 else 1.0)
            )
        try:
            await self.service.run(background, ready)
        finally:
            await self.scheduler.shutdown()
            self.sessions.close()
            self.placer.sweep()
            self.journal.close()
            self.locker.shutdown()
            self.service.close()
            self.identity.close()
            self.guardian_link.stop()
            self.node_lock.close()
            self.backend.close()
            self.records.close()
            log.info("krex arbiter stopped")

    def stop(self) -> None:
        self.service.stop()

    def status(self) -> NodeStatus:
        """The node table (``krex status``)."""
        me = arbiter_row(
            self.backend_info,
            pid=os.getpid(),
            endpoint=self.bound,
            events=self.events,
            started=self.started,
            shield=self.shielding.describe(),
            guard_neighbours=self.guard_neighbours,
            shield_linger_s=self.scheduler.steps.linger,
            cgroups=self.placer.reason,
            quotas=self.quotas_note,
        )
        return node_table(self.backend.inventory(), self.scheduler, self.gate, self.sessions, me)

    # -- requests -------------------------------------------------------------------------
    def _hello(self, req: protocol.Hello, peer: Peer) -> protocol.Info:
        return hello_info(self.gpu_count, self.identity.path, self.events, self.backend_info)
