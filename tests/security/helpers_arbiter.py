"""Helpers for the hostile-neighbour arbiter tests: real users, a real multi-user root arbiter,
and real processes of those users talking to it over its real sockets.

A user's process here is a root-started interpreter that drops to the user (``setgroups([])``,
``setgid``, ``setuid``) before it touches the arbiter: from then on the kernel sees that user in
every respect (real, effective and saved uid; ``SO_PEERCRED``; ``/proc/PID/status``). It is done
that way because the test interpreter may live where an ordinary user cannot read it (under
``/root``): every module such a process needs is imported *before* it drops root.

:class:`Agent` is such a process driven line by line over its stdin/stdout (JSON): it registers
sessions (``krex_lab.client.Session``, control thread included, so drains are acknowledged),
queues and releases regions, forks sleeping children, sends raw requests. Replies carry the
command's ``seq``; asynchronous outcomes (a grant, an error of a queued acquire) are events.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from krex_lab.pytest_plugin import ArbiterProc, subprocess_pythonpath
from tests.support.procs import kill_tree

from .users import User, needs_root_and_useradd

#: What every user process runs first: import everything, then become the user.
PRELUDE = r"""
import sys, os, json, time, socket, threading, subprocess, signal, struct, secrets, select, traceback
import encodings.idna, encodings.utf_8, encodings.ascii
import zmq, zmq.error, msgspec, msgspec.msgpack, psutil
import krex_lab, krex_lab.paths, krex_lab.errors, krex_lab.procutil, krex_lab.devsync
import krex_lab.protocol, krex_lab.client, krex_lab.arbiter.identity
from krex_lab import protocol
from krex_lab.client import Connection, Exclusive, Session
from krex_lab.connection import fetch_ticket
from krex_lab.errors import KrexError
{preimport}
_uid, _gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([])
os.setgid(_gid)
os.setuid(_uid)
assert os.getresuid() == (_uid, _uid, _uid) and os.getresgid() == (_gid, _gid, _gid)
ARGS = sys.argv[3:]
ENDPOINT = os.environ["KREX_ENDPOINT"]
_out_lock = threading.Lock()
def out(**kw):
    with _out_lock:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()
def err(exc):
    return {"type": type(exc).__name__, "message": str(exc)}
"""

#: The interactive agent (after the prelude).
AGENT = r"""
sessions = {}
regions = {}
children = []
def acquire(tag, session, opts):
    try:
        ex = Exclusive(session=sessions[session], **opts)
        regions[tag] = ex
        ex.acquire()
        out(event="granted", tag=tag, region=ex.id, gpu=ex.gpu, report=ex.report.to_dict())
    except BaseException as exc:
        out(event="acquire_failed", tag=tag, error=err(exc))
def handle(cmd):
    op = cmd["op"]
    if op == "register":
        s = Session(gpu=cmd.get("gpu"), pid=cmd.get("pid"), name=cmd.get("name", ""), endpoint=ENDPOINT)
        sessions[cmd["tag"]] = s
        return {"session": s.id, "token": s.token, "gpu": s.gpu, "pid": s.pid}
    if op == "acquire":
        threading.Thread(target=acquire, args=(cmd["tag"], cmd["session"], cmd.get("opts", {})), daemon=True).start()
        return {"sent": True}
    if op == "release":
        ex = regions[cmd["tag"]]
        return {"report": ex.release().to_dict()}
    if op == "call":  # a raw request of a session: {"session": tag, "request": {...}}
        s = sessions[cmd["session"]]
        req = msgspec.convert(cmd["request"], protocol.ArbiterRequest)
        return {"result": msgspec.to_builtins(s.call(req))}
    if op == "fork":  # sleeping children of this user, which it may register
        for _ in range(cmd["n"]):
            children.append(subprocess.Popen(["sleep", "600"]))
        return {"pids": [c.pid for c in children[-cmd["n"]:]]}
    if op == "close":
        sessions.pop(cmd["tag"]).close()
        return {}
    raise ValueError(f"unknown op {op}")
for line in sys.stdin:
    cmd = json.loads(line)
    try:
        out(seq=cmd["seq"], ok=True, **handle(cmd))
    except BaseException as exc:
        out(seq=cmd["seq"], ok=False, error=err(exc))
for c in children:
    c.kill()
"""


def _env(arb: ArbiterProc) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": "/",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        # the test's own path after the tree's: where the dependencies come from PYTHONPATH (the GPU
        # machine's carried wheels), a user process without it dies at its first import
        "PYTHONPATH": subprocess_pythonpath(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "KREX_RUNTIME_DIR": str(arb.runtime),
        "KREX_ENDPOINT": arb.endpoint,
    }


def spawn_as(user: User, arb: ArbiterProc, code: str, *args: str, preimport: str = "") -> subprocess.Popen[bytes]:
    """Start ``code`` (after :data:`PRELUDE`) as ``user``; stdin/stdout are pipes. ``preimport``: more
    statements to run as root before dropping to the user (imports the user could not read)."""
    prelude = PRELUDE.replace("{preimport}", preimport)
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code, str(user.uid), str(user.gid), *args],
        env=_env(arb),
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_as(
    user: User, arb: ArbiterProc, code: str, *args: str, timeout: float = 60, preimport: str = "", check: bool = True
) -> list[dict[str, Any]]:
    """Run ``code`` as ``user`` to its end; returns the JSON lines it printed with ``out(...)``."""
    proc = spawn_as(user, arb, code, *args, preimport=preimport)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{user.name}'s process ran past {timeout} s: {stderr.decode()[-2000:]}") from None
    lines = [json.loads(x) for x in stdout.decode().splitlines() if x.startswith("{")]
    if not check:
        return [{"returncode": proc.returncode, "stdout": stdout.decode(), "stderr": stderr.decode()}]
    assert proc.returncode == 0, f"{user.name}'s process failed ({proc.returncode}): {stderr.decode()[-3000:]}"
    return lines


def read_line(proc: subprocess.Popen[bytes], timeout: float = 30) -> dict[str, Any]:
    """The next JSON line a process started by :func:`spawn_as` printed (one ``out(...)``)."""
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    assert r, f"no output from pid {proc.pid} within {timeout} s"
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise AssertionError(f"pid {proc.pid} exited without output: {err[-3000:]}")
    result: dict[str, Any] = json.loads(line)
    return result


class Agent:
    """An interactive process of ``user`` (see the module docstring)."""

    def __init__(self, user: User, arb: ArbiterProc) -> None:
        self.user = user
        self.proc = spawn_as(user, arb, AGENT)
        self.pid = self.proc.pid
        self._seq = 0
        self._buf = b""
        self.events: list[dict[str, Any]] = []

    def _lines(self, timeout: float) -> list[dict[str, Any]]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            return []
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise AssertionError(f"{self.user.name}'s agent exited: {err[-3000:]}")
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(x) for x in lines if x.strip()]

    def send(self, op: str, **kw: Any) -> int:
        assert self.proc.stdin is not None
        self._seq += 1
        self.proc.stdin.write((json.dumps({"op": op, "seq": self._seq, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        return self._seq

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20) -> dict[str, Any]:
        """The first message (reply or event) that matches, read or already seen."""
        deadline = time.monotonic() + timeout
        while True:
            for i, msg in enumerate(self.events):
                if predicate(msg):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.user.name}'s agent: no matching message within {timeout} s (seen: {self.events[-5:]})"
                )
            self.events.extend(self._lines(min(left, 0.5)))

    def call(self, op: str, timeout: float = 20, **kw: Any) -> dict[str, Any]:
        seq = self.send(op, **kw)
        return self.wait(lambda m: m.get("seq") == seq, timeout)

    def event(self, kind: str, tag: str, timeout: float = 20) -> dict[str, Any]:
        return self.wait(lambda m: m.get("event") in kind.split("|") and m.get("tag") == tag, timeout)

    def poll_event(self, tag: str) -> dict[str, Any] | None:
        """A grant (or failure) of ``tag`` that has arrived by now, else None."""
        self.events.extend(self._lines(0.05))
        return next((m for m in self.events if m.get("tag") == tag and "event" in m), None)

    def close(self) -> None:
        kill_tree(self.pid)
        with contextlib.suppress(Exception):
            self.proc.wait(5)


@contextlib.contextmanager
def agents() -> Iterator[list[Agent]]:
    """A list to put agents in; every one is killed (after SIGCONT) at the end."""
    made: list[Agent] = []
    try:
        yield made
    finally:
        for a in made:
            a.close()


@contextlib.contextmanager
def multi_user_arbiter(*extra: str, gpus: int = 2, multi_user: bool = True) -> Iterator[ArbiterProc]:
    """A root ``krex arbiter --multi-user`` (fake backend) on a root-owned 0755 runtime dir in /tmp."""
    needs_root_and_useradd()
    runtime = Path(tempfile.mkdtemp(prefix="krex-sec-"))
    os.chmod(runtime, 0o755)
    logs = Path(tempfile.mkdtemp(prefix="krex-sec-log-"))  # 0700: the test's other users never see it
    flags = ("--multi-user",) if multi_user else ()
    arb = ArbiterProc(runtime, gpus=gpus, extra=(*flags, *extra), log_path=logs / "arbiter.log")
    try:
        arb.start()
        yield arb
    finally:
        arb.stop()
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


def arbiter_pid(arb: ArbiterProc) -> int:
    assert arb.proc is not None
    return arb.proc.pid


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def stopped_pids(uids: set[int]) -> list[int]:
    """Processes of these users in state T (stopped): after a test, none should be."""
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        with contextlib.suppress(psutil.Error):
            if p.info["uids"].real in uids and p.info["status"] == psutil.STATUS_STOPPED:
                found.append(p.pid)
    return found


def status_latency(arb: ArbiterProc, n: int = 20) -> list[float]:
    """Seconds each of ``n`` status round trips takes (one connection, no ticket: the raw request)."""
    from krex_lab import protocol
    from krex_lab.client import Connection

    conn = Connection(arb.endpoint)
    try:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.call(protocol.Status(), timeout=5)
            times.append(time.perf_counter() - t0)
        return times
    finally:
        conn.close()


def assert_healthy(arb: ArbiterProc, uids: set[int]) -> None:
    """The arbiter lives and answers ``krex status``; no process of these users is left stopped."""
    assert arb.proc is not None and arb.proc.poll() is None, "the arbiter died"
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "status"], env=arb.env(), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, f"krex status failed: {out.stdout}{out.stderr}"
    assert "krex arbiter pid" in out.stdout
    assert not stopped_pids(uids), f"processes left stopped: {stopped_pids(uids)}"
