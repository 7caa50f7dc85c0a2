"""A context worker: one process, one GPU, warm frameworks, runs jobs one at a time.

Started by the pool (:mod:`krex_lab.workers.pool.handle`) as
``python -u -m krex_lab.workers.context FD`` where FD is its end of a socketpair (messages:
:mod:`krex_lab.workers.wire`). Its stdout and stderr are pipes the pool reads (so the output of
a job, C-level prints and a segfault's faulthandler dump included, reach the client live).
Sequence: read :class:`Init` -> die with the pool (``PR_SET_PDEATHSIG``) -> register with the
arbiter as a ``worker`` session and make it this process's default session (so
``krex_lab.exclusive()`` in a job makes this worker the holder) -> preload frameworks, creating
their context on a real GPU -> take the baseline -> :class:`Ready`. Then, per job: :class:`Run`
-> every process the job started is killed (the worker is a child subreaper, so daemons that
left with ``setsid`` and a double fork are among its descendants: :mod:`..contain`) ->
:class:`Done` (the result) -> reset unless a lease keeps the namespace -> :class:`Ready`.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import importlib
import os
import signal
import socket
import sys
import time
from typing import Any

import msgspec

from ..contain import ProcId, become_subreaper, end_descendants, ident, kept, live
from ..results import JobResult
from ..wire import Done, EncodeError, Exit, FromWorker, Init, Ready, Reset, Run, pack, recv_to_worker

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent:  # the pool died before prctl took effect
        os._exit(0)


class Worker:
    def __init__(self, sock: socket.socket, init: Init) -> None:
        # The runner imports what jobs need; the worker's own start-up does not wait for it.
        from .runner import Runner

        self.sock = sock
        self.init = init
        self.gpu = init.gpu
        self.runner = Runner()
        self.session: Any = None
        self.jobs = 0
        #: processes of the worker's own start-up (a framework's helper), never a job's
        self.own_children: list[ProcId] = []

    def send(self, msg: FromWorker) -> None:
        self.sock.sendall(pack(msg))

    def start(self) -> None:
        from .reset import Baseline, preload
        from .runner import install_sigint

        t0 = time.perf_counter()
        ready = Ready(first=True, pid=os.getpid(), clean=True)
        if self.init.arbiter:
            # A worker started for one job of a client inside a region registers as part of that
            # region (``Register.within``, read from KREX_REGION by the session) with the client's
            # own identity ticket, which the arbiter checks (the client must be the holder or its
            # descendant, of this user). Ordinary workers never claim one.
            os.environ.pop("KREX_REGION", None)
            if self.init.within:
                os.environ["KREX_REGION"] = self.init.within
            try:
                from ...client import attach

                self.session = attach(
                    gpu=self.gpu,
                    name=self.init.name,
                    role="worker",
                    endpoint=self.init.arbiter,
                    via_ticket=self.init.via_ticket,
                )
                ready.session = self.session.id
            except Exception as exc:
                ready.session_error = f"{type(exc).__name__}: {exc}"
            finally:
                os.environ.pop("KREX_REGION", None)
        t1 = time.perf_counter()
        loaded, skipped, seconds = preload(list(self.init.preload), self.init.real, self.init.warmup)
        if not self.init.real:  # a simulated GPU's context holds its simulated memory, where one is set
            from ...gpu.fake import hold_context

            hold_context(self.gpu)
        install_sigint()
        self.baseline = Baseline(self.init.memory_slack)
        # what the worker holds now (torch's module graph: ~10^6 objects) lives as long as it does:
        # frozen out of the collector's walks, a full collection (each job's end, an evaluation's)
        # takes milliseconds instead of 0.1-0.2 s, and none lands inside a timed call
        gc.freeze()
        ready.preloaded, ready.skipped, ready.import_s = loaded, skipped, seconds
        ready.register_s, ready.start_s = round(t1 - t0, 4), round(time.perf_counter() - t0, 4)
        ready.memory = self.baseline.memory
        from ...procutil import tree

        self.own_children = [ident(p) for p in tree(os.getpid())[1:] if live(p)]
        if "torch" in loaded:
            # e.g. an evaluation's candidates fork from a clean zygote made now, off any job's
            # clock; named by the pool's configuration, so that the worker knows no evaluator
            self._ready_hooks("cuda" if self.init.real else "cpu")
        self.send(ready)

    def _ready_hooks(self, device: str) -> None:
        for hook in self.init.ready_hooks:
            module, _, name = hook.partition(":")
            try:
                getattr(importlib.import_module(module), name)(device)
            except Exception as exc:  # a hook is an optimisation: the worker serves without it
                print(f"krex worker: ready hook {hook} failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    def serve(self) -> None:
        while True:
            msg = recv_to_worker(self.sock)
            if msg is None or isinstance(msg, Exit):
                return
            if isinstance(msg, Run):
                self._run(msg)
            elif isinstance(msg, Reset):
                self._reset()

    def _run(self, msg: Run) -> None:
        from .runner import clear_tracebacks

        self.jobs += 1
        ran = self.runner.run(msg)
        recycle = ran.recycle
        # The job has ended: so has every process it started, daemons included.
        left = end_descendants(self.own_children + kept())
        if left and not recycle:
            recycle = f"processes of the job could not be killed: {left[:5]}"
        try:
            self.send(Done(job=msg.job, result=ran.result, recycle=recycle))
        except (TypeError, ValueError, OverflowError, EncodeError, msgspec.ValidationError) as exc:
            self.send(
                Done(
                    job=msg.job,
                    recycle=recycle,
                    result=JobResult(ok=False, status="exception", error=f"the result could not be sent: {exc}"),
                )
            )
        del ran
        clear_tracebacks()
        if msg.lease:
            self.send(Ready(clean=True))
        else:
            self._reset()

    def _reset(self) -> None:
        from .runner import clear_tracebacks, flush_output

        t0 = time.perf_counter()
        self.runner.clear()
        clear_tracebacks()
        problems = self.baseline.restore()
        flush_output()
        self.send(
            Ready(
                clean=not problems,
                reason="; ".join(problems) or None,
                reset_s=round(time.perf_counter() - t0, 4),
                reset_parts_s={k: round(v, 4) for k, v in self.baseline.timings.items()},
            )
        )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[0])
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    init = recv_to_worker(sock)
    if not isinstance(init, Init):
        return
    _die_with_parent(init.parent)
    become_subreaper()  # orphans of a job (daemons) are re-parented here, and so killed at its end
    faulthandler.enable(all_threads=False)  # a segfault's stack goes to stderr, and so to the error result
    # `python -m` put the pool's cwd first on sys.path: jobs must not import from there.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the job handler is installed
    worker = Worker(sock, init)
    worker.start()
    try:
        worker.serve()
    finally:
        if worker.session is not None:
            try:
                worker.session.close()
            except Exception:
                pass
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: framework atexit hooks can hang on a dying context
