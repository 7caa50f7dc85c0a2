"""The judge's candidate processes: a zygote kept across evaluations, one spare forked ahead.

The zygote (:mod:`..candidate.zygote`) is a child of the judge's worker, kept by the worker's
end-of-job sweep (:func:`krex_lab.workers.contain.keep`) with the spares it forked. A spare taken
for a candidate is no longer kept: it is killed with every process it started when its evaluation
ends (:meth:`CandidateProc.end`), and what it left behind is reported. The next spare is forked
at once, so it makes its CUDA context while the current candidate compiles and is checked.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from ...procutil import children, proc_state, tree
from ...workers import contain
from ..channel import Channel, ChannelError
from ..messages import Confine, Confined, Ready

__all__ = ["CandidateProc", "Spares", "proc_alive", "spares_for"]


def proc_alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


#: what a framework starts for its own sake, never the candidate's work: torch.compile's pool
_FRAMEWORK_HELPERS = ("torch._inductor.compile_worker", "compile_worker", "triton")


class CandidateProc:
    """One candidate's process: its channel, and its end."""

    def __init__(self, pid: int, chan: Channel, zygote: Spares) -> None:
        self.pid = pid
        self.chan = chan
        self.zygote = zygote
        self.calibration: dict[str, float] = {}
        #: what its sandbox held (:mod:`..candidate.sandbox`), as it said before any candidate
        #: code was in it and as the kernel shows it from outside
        self.sandbox: dict[str, str] = {}
        self.scratch = ""

    def confine(self, build_dir: str, readable: list[str], files: list[str], timeout: float = 60.0) -> None:
        """Its writes to ``build_dir`` (its temporary directory in it) and into ``files`` alone,
        its reads to the system, the Python environment and ``readable``: before any candidate
        code is in it."""
        self.scratch = os.path.join(build_dir, "tmp", str(self.pid))
        self.chan.send(Confine(build_dir=build_dir, scratch=self.scratch, readable=readable, files=files))
        self.chan.sock.settimeout(timeout)
        try:
            env, fds = self.chan.recv()
        finally:
            self.chan.sock.settimeout(None)
        for fd in fds:
            os.close(fd)
        self.sandbox.update(env.read(Confined).sandbox)
        self.sandbox.update(kernel_view(self.pid, self.sandbox))

    def status(self, timeout: float = 1.0) -> int | None:
        """Its wait status once it has exited (read from the zygote), else None."""
        return self.zygote.exit_status(self.pid, timeout)

    def left_behind(self) -> list[str]:
        """Processes it started that are still running, frameworks' helpers left out."""
        out: list[str] = []
        for pid in tree(self.pid)[1:]:
            if proc_state(pid) in (None, "Z"):
                continue
            cmd = _cmdline(pid)
            if any(h in cmd for h in _FRAMEWORK_HELPERS):
                continue
            out.append(f"{pid} ({cmd[:80] or '?'})")
        # daemons that left its tree: re-parented to the worker (setsid and a double fork), or
        # made the zygote's children (clone with CLONE_PARENT)
        for pid in self.strays():
            if proc_state(pid) not in (None, "Z"):
                cmd = _cmdline(pid)
                if not any(h in cmd for h in _FRAMEWORK_HELPERS):
                    out.append(f"{pid} ({cmd[:80] or '?'})")
        return out

    def strays(self) -> list[int]:
        """Processes that left its tree: the worker's children that are neither the zygote nor
        the spare (a daemon's double fork), and the zygote's that it did not fork itself (a
        sibling made with CLONE_PARENT)."""
        worker = [p for p in children(os.getpid()) if p != self.zygote.pid and not self.zygote.is_own(p)]
        siblings = [p for p in children(self.zygote.pid) if p != self.pid and p not in self.zygote.forked]
        return worker + siblings

    def end(self) -> None:
        """Kill it and everything it started (deepest first), daemons that left its tree included;
        its temporary directory goes with it."""
        with _quiet():
            self.chan.sock.close()
        for _ in range(200):
            strays = self.strays()
            pids = [p for p in tree(self.pid) + strays if proc_state(p) not in (None, "Z")]
            for p in reversed(pids):
                with _quiet():
                    os.kill(p, signal.SIGKILL)
            with _quiet():
                os.killpg(self.pid, signal.SIGKILL)
            contain.reap_any_except(self.zygote.popen_pids())
            if not pids and not any(proc_state(p) == "Z" for p in strays) and proc_state(self.pid) is None:
                break
            time.sleep(0.002)
        self.zygote.forget(self.pid)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def sandbox_summary(report: dict[str, str]) -> str:
    """One line for the verdict: what held, and what did not and why."""
    weak = [f"{k} {v}" for k, v in report.items() if not v.startswith("held")]
    held = [k for k, v in report.items() if v.startswith("held")]
    line = "held: " + ", ".join(held) if held else "nothing held"
    if "landlock" in report and report["landlock"].startswith("held"):
        line += f" ({report['landlock'][6:-1]})"
    return line + ("; degraded: " + "; ".join(weak) if weak else "")


def kernel_view(pid: int, said: dict[str, str]) -> dict[str, str]:
    """What ``/proc/PID/status`` shows of a sandbox part said to hold, where it shows otherwise
    (no_new_privs, seccomp, capabilities): the claim is replaced by what the kernel says."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(ln.rstrip("\n").split(":\t", 1) for ln in f if ":\t" in ln)
    except OSError:
        return {}
    out: dict[str, str] = {}
    if said.get("no_new_privs", "").startswith("held") and status.get("NoNewPrivs") != "1":
        out["no_new_privs"] = "failed: the kernel shows it unset"
    if said.get("seccomp", "").startswith("held") and status.get("Seccomp") != "2":
        out["seccomp"] = "failed: the kernel shows no filter"
    caps = [int(status.get(k, "0"), 16) for k in ("CapEff", "CapPrm", "CapInh", "CapAmb")]
    if said.get("capabilities", "").startswith("held") and any(caps):
        out["capabilities"] = "failed: the kernel shows capabilities held"
    return out


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Spares:
    """The zygote of one judge and its spare."""

    def __init__(self, device: str) -> None:
        self.device = device
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # -S: no sitecustomize/usercustomize (see krex_lab.workers.pool.spawn.import_path)
        self.popen = subprocess.Popen(
            [sys.executable, "-S", "-m", "krex_lab.evaluate.candidate.zygote", str(theirs.fileno()), device],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=_clean_env(),
            # A session (and group) of its own: the SIGINT that interrupts a job goes to the
            # worker's group, and the zygote (kept across jobs) must neither die of it nor print a
            # KeyboardInterrupt traceback into that job's stderr. It dies with its judge all the
            # same (PDEATHSIG).
            start_new_session=True,
        )
        theirs.close()
        self.pid = self.popen.pid
        self.ctl = ctl
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.spare: tuple[int, socket.socket] | None = None
        #: the spare once it said ``ready`` while lent as a calibration twin (taken as it is next)
        self.ready: CandidateProc | None = None
        self.forked: set[int] = set()
        self.buf = b""
        self._expect("ready", timeout=120.0)
        contain.keep(contain.ident(self.pid))
        self.fork_spare()

    def popen_pids(self) -> set[int]:
        return {self.pid}

    def is_own(self, pid: int) -> bool:
        return (self.spare is not None and pid == self.spare[0]) or (self.ready is not None and pid == self.ready.pid)

    def alive(self) -> bool:
        return proc_state(self.pid) not in (None, "Z")

    def _line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the candidate zygote did not answer")
            self.ctl.settimeout(left)
            part = self.ctl.recv(4096)
            if not part:
                raise ChannelError("the candidate zygote is gone")
            self.buf += part
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def _expect(self, word: str, timeout: float) -> str:
        while True:
            line = self._line(timeout)
            if line.startswith("exit "):
                _, pid, status = line.split()
                self.exits[int(pid)] = int(status)
                continue
            if line.startswith(word):
                return line

    def fork_spare(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with self.lock:
            socket.send_fds(self.ctl, [b"fork"], [theirs.fileno()])
            theirs.close()
            pid = int(self._expect("forked", timeout=30.0).split()[1])
        self.forked.add(pid)
        self.spare = (pid, mine)
        contain.keep(contain.ident(pid))

    def take(self, timeout: float = 300.0) -> CandidateProc:
        """The spare, once its context is made; the next one is forked at once. A spare that died
        before it was ready (its context could not be made) is replaced once."""
        try:
            return self._take(timeout)
        except (ChannelError, OSError):
            self.spare = self.ready = None
            return self._take(timeout)

    def _take(self, timeout: float) -> CandidateProc:
        proc = self._ready(timeout)
        self.ready = None
        contain.unkeep(proc.pid)
        self.fork_spare()
        return proc

    def _ready(self, timeout: float) -> CandidateProc:
        """The spare, once it has said ``ready`` (its context made)."""
        if self.ready is not None:
            return self.ready
        if self.spare is None:
            self.fork_spare()
        assert self.spare is not None
        pid, sock = self.spare
        self.spare = None
        chan = Channel(sock)
        sock.settimeout(timeout)
        try:
            env, _ = chan.recv()
        finally:
            sock.settimeout(None)
        ready = env.read(Ready)
        self.ready = CandidateProc(pid, chan, self)
        self.ready.sandbox = ready.sandbox
        return self.ready

    def twin(self, timeout: float = 120.0) -> CandidateProc:
        """The spare, lent as it is (kept as the spare): no candidate code has run in it, so the
        judge times its harness on a no-op there (the round trip it subtracts). Its next use is as
        a candidate's process, as any spare's."""
        try:
            return self._ready(timeout)
        except (ChannelError, OSError):
            self.spare = self.ready = None
            return self._ready(timeout)

    def drop_twin(self) -> None:
        """The twin failed (it may have been killed): a fresh spare replaces it."""
        if self.ready is not None:
            self.ready.end()
        self.ready = self.spare = None
        self.fork_spare()

    def exit_status(self, pid: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while pid not in self.exits:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    self._expect("exit", left)
                except (TimeoutError, OSError, ChannelError):
                    return self.exits.get(pid)
            return self.exits[pid]

    def forget(self, pid: int) -> None:
        self.forked.discard(pid)

    def close(self) -> None:
        with _quiet():
            self.ctl.close()
        with _quiet():
            self.popen.kill()
            self.popen.wait(5)


def _clean_env() -> dict[str, str]:
    """The zygote's environment: the worker's, with this process's import path."""
    from ...workers.pool.spawn import import_path

    # OpenMP threads that spin between a candidate's calls would steal the core the harness and
    # the judge's bound need (and count as the candidate's CPU time): they sleep instead
    return {**os.environ, "PYTHONPATH": import_path(), "OMP_WAIT_POLICY": "PASSIVE"}


_SPARES: dict[str, Spares] = {}


def spares_for(device: str) -> Spares:
    """This judge's zygote for ``device`` (started on first use, kept across evaluations)."""
    current = _SPARES.get(device)
    if current is None or not current.alive():
        if current is not None:
            current.close()
        current = _SPARES[device] = Spares(device)
    return current


def prestart(device: str) -> Any:
    """Start the zygote ahead of the first evaluation (a worker that preloads torch)."""
    try:
        return spares_for(device)
    except Exception:
        return None
