"""The arbiter's side of its guardian (:mod:`krex_lab.arbiter.guardian`): start it, wait until it is
armed, start a new one when it dies, stop it at shutdown. Called by the arbiter only:
:meth:`GuardianLink.start` before the arbiter binds its socket, :meth:`GuardianLink.keep` as a
background task while it serves, :meth:`GuardianLink.stop` when it stops."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import subprocess
import sys
from pathlib import Path

from ..enforcement.corelock import NodeCoreLock

log = logging.getLogger("krex.arbiter")

#: how long a starting guardian may take to say it is armed (its backend loads first: cuInit, NVML)
READY_S = 10.0


class GuardianLink:
    def __init__(self, journal: Path, backend: str, core_lock: NodeCoreLock) -> None:
        self.journal = journal
        self.backend = backend
        self.core_lock = core_lock
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start a guardian and wait (up to :data:`READY_S`) until it is armed: signals caught,
        backend loaded. A region granted before that would not be undone if the arbiter died
        while the guardian was still starting."""
        cmd = [
            sys.executable,
            "-m",
            "krex_lab.arbiter.guardian",
            "--pid",
            str(os.getpid()),
            "--journal",
            str(self.journal),
            "--backend",
            self.backend,
        ]
        # The guardian holds the core lock's open file too: a lock this arbiter dies holding stays
        # held until the guardian has undone the region (see enforcement/corelock.py).
        fds = (self.core_lock.fd,) if self.core_lock.fd is not None else ()
        if fds:
            cmd += ["--core-lock-fd", str(fds[0])]
        proc = subprocess.Popen(
            cmd, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, pass_fds=fds
        )
        self.proc = proc
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], READY_S)[0]
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        if line.strip() != b"ready":
            log.error(
                "the guardian (pid %d) did not say it was ready within %.0f s: a crash now may leave "
                "processes stopped until the next arbiter or `krex supervise` replays the journal",
                proc.pid,
                READY_S,
            )

    async def keep(self) -> None:
        """Start a new guardian whenever the current one has exited."""
        while True:
            await asyncio.sleep(0.5)
            if self.proc is not None and self.proc.poll() is not None:
                log.error("guardian exited with %s: starting a new one", self.proc.returncode)
                # Off the loop: waiting for the new guardian's "ready" must not stall every client.
                await asyncio.get_running_loop().run_in_executor(None, self.start)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
