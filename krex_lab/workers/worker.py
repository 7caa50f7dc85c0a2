"""A context worker: one process, one GPU, warm frameworks, runs jobs one at a time.

Started by the pool (:mod:`krex_lab.workers.nanny`) as ``python -u -m krex_lab.workers.worker FD``
where FD is its end of a socketpair. Its stdout and stderr are pipes the pool reads (so the
output of a job, C-level prints and a segfault's faulthandler dump included, reach the
client live). Sequence: read ``init`` -> die with the pool (``PR_SET_PDEATHSIG``) -> register with
the arbiter as a ``worker`` session and make it this process's default session (so
``krex_lab.exclusive()`` in a job makes this worker the holder) -> preload frameworks, creating
their context on a real GPU -> take the baseline -> ``ready``. Then, per job: ``run`` ->
``done`` (the result) -> reset unless a lease keeps the namespace -> ``ready``.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import socket
import sys
import time
from typing import Any

from .wire import EncodeError, pack, recv_frame

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
    def __init__(self, sock: socket.socket, init: dict[str, Any]) -> None:
        from .runner import Runner

        self.sock = sock
        self.init = init
        self.gpu: int = init["gpu"]
        self.runner = Runner()
        self.session: Any = None
        self.jobs = 0

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(pack(msg))

    def start(self) -> None:
        from .reset import Baseline, preload
        from .runner import install_sigint

        t0 = time.perf_counter()
        ready: dict[str, Any] = {"op": "ready", "first": True, "pid": os.getpid(), "clean": True}
        if self.init.get("arbiter"):
            try:
                from ..client import attach

                self.session = attach(gpu=self.gpu, name=self.init.get("name", ""), role="worker",
                                      endpoint=self.init["arbiter"])
                ready["session"] = self.session.id
            except Exception as exc:
                ready["session_error"] = f"{type(exc).__name__}: {exc}"
        t1 = time.perf_counter()
        loaded, skipped, seconds = preload(list(self.init.get("preload", ())), bool(self.init.get("real")),
                                           bool(self.init.get("warmup", True)))
        install_sigint()
        self.baseline = Baseline(int(self.init.get("memory_slack", 256 << 20)))
        ready.update(preloaded=loaded, skipped=skipped, import_s=seconds,
                     register_s=round(t1 - t0, 4), start_s=round(time.perf_counter() - t0, 4),
                     memory=self.baseline.memory)
        self.send(ready)

    def serve(self) -> None:
        while True:
            msg = recv_frame(self.sock)
            if msg is None or msg.get("op") == "exit":
                return
            op = msg.get("op")
            if op == "run":
                self._run(msg)
            elif op == "reset":
                self._reset()

    def _run(self, msg: dict[str, Any]) -> None:
        from .runner import clear_tracebacks

        self.jobs += 1
        result = self.runner.run(msg)
        recycle = result.pop("recycle", None)
        try:
            self.send({"op": "done", "job": msg["job"], "result": result, "recycle": recycle})
        except (TypeError, ValueError, OverflowError, EncodeError) as exc:  # unencodable: report
            self.send({"op": "done", "job": msg["job"], "recycle": recycle,
                       "result": {"ok": False, "status": "exception",
                                  "error": f"the result could not be sent: {exc}"}})
        del result
        clear_tracebacks()
        if msg.get("lease"):
            self.send({"op": "ready", "clean": True})
        else:
            self._reset()

    def _reset(self) -> None:
        from .runner import clear_tracebacks, flush_output

        t0 = time.perf_counter()
        self.runner.clear()
        clear_tracebacks()
        problems = self.baseline.restore()
        flush_output()
        self.send({"op": "ready", "clean": not problems, "reason": "; ".join(problems) or None,
                   "reset_s": round(time.perf_counter() - t0, 4),
                   "reset_parts_s": {k: round(v, 4) for k, v in self.baseline.timings.items()}})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[0])
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    init = recv_frame(sock)
    if init is None:
        return
    _die_with_parent(int(init["parent"]))
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


if __name__ == "__main__":
    main()
