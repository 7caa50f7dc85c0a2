"""The NVIDIA backend against the real driver (marker ``gpu``; skipped without a GPU).

Each test drives a child python that holds a CUDA context (torch) and answers commands on
stdin with timestamps (``time.time()``, one clock for both processes) on stdout.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from krex_lab.gpu.cuda_driver import CtypesCudaDriver, CudaError, ProcessState
from krex_lab.gpu.nvidia import LockOutcome, NvidiaBackend, ProcessStopped

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the CUDA child needs torch"),
]

CHILD = r"""
import sys, time, torch
torch.backends.cuda.matmul.allow_tf32 = False
a = torch.randn(8192, 8192, device="cuda"); b = torch.randn_like(a)
c = a @ b; torch.cuda.synchronize()
t = time.perf_counter(); c = a @ b; torch.cuda.synchronize(); one = time.perf_counter() - t
print(f"ready {one:.6f}", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "work":  # queue about cmd[1] seconds of matmuls, then wait for them
        for _ in range(max(1, round(float(cmd[1]) / one))):
            c = a @ b
        print(f"queued {time.time():.6f}", flush=True)
        torch.cuda.synchronize()
        print(f"synced {time.time():.6f}", flush=True)
    elif cmd[0] == "touch":  # one small CUDA call: it blocks while the process is locked
        t0 = time.time(); x = float((a[0, :8] + 1).sum())
        print(f"touched {t0:.6f} {time.time():.6f}", flush=True)
    elif cmd[0] == "quit":
        break
"""


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self.expect("ready", timeout=90)
        self.one_matmul_s = float(ready[1])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str, timeout: float) -> list[str]:
        try:
            fields = self.lines.get(timeout=timeout).split()
        except queue.Empty:
            raise AssertionError(f"child said nothing in {timeout} s (waiting for {word!r})") from None
        assert fields[0] == word, fields
        return fields

    def silent_for(self, seconds: float) -> bool:
        try:
            self.lines.put(self.lines.get(timeout=seconds))  # keep it for expect()
            return False
        except queue.Empty:
            return True

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def backend() -> Iterator[NvidiaBackend]:
    be = NvidiaBackend()
    if not be.capabilities.lock:
        be.close()
        pytest.skip(f"this driver cannot lock: {be.capabilities.reason}")
    try:
        yield be
    finally:
        be.close()


@pytest.fixture
def child(backend: NvidiaBackend) -> Iterator[Child]:
    c = Child()
    try:
        yield c
    finally:
        # Never leave a locked child behind: unlock (thawed first) before killing it.
        if c.proc.poll() is None:
            os.kill(c.pid, signal.SIGCONT)
            try:
                backend.unlock(c.pid)
            except Exception:
                pass
        c.close()


def test_inventory_processes_and_capabilities(backend: NvidiaBackend, child: Child) -> None:
    inv = backend.inventory()
    assert inv and all(g.name and g.uuid and g.memory_total > 0 and not g.simulated for g in inv)
    assert any(child.pid in [p.pid for p in backend.processes(g.index)] for g in inv)
    caps = backend.capabilities
    assert caps.lock and caps.driver and caps.extra["checkpoint_api"] is True


def test_lock_waits_for_queued_work_and_blocks_the_next_call(backend: NvidiaBackend, child: Child) -> None:
    child.send("work 0.4")
    queued = float(child.expect("queued", timeout=30)[1])
    backend.lock(child.pid, 10.0)
    locked_at = time.time()
    synced = float(child.expect("synced", timeout=30)[1])
    assert locked_at - queued > 0.25, "the lock returned before the queued work could have finished"
    assert locked_at >= synced - 0.05, "the lock returned before the child's work ended"
    assert backend.checkpoint_state(child.pid) is ProcessState.LOCKED

    child.send("touch")
    assert child.silent_for(0.5), "a locked process made a CUDA call"
    unlocked_at = time.time()
    backend.unlock(child.pid)
    _, started, done = child.expect("touched", timeout=30)
    assert float(started) < unlocked_at <= float(done) + 0.01
    assert backend.checkpoint_state(child.pid) is ProcessState.RUNNING


def test_idle_lock_and_unlock_are_fast(backend: NvidiaBackend, child: Child) -> None:
    for _ in range(5):
        t = time.perf_counter()
        backend.lock(child.pid, 5.0)
        t_lock = time.perf_counter() - t
        t = time.perf_counter()
        backend.unlock(child.pid)
        t_unlock = time.perf_counter() - t
        assert t_lock < 0.05 and t_unlock < 0.05, (t_lock, t_unlock)
    child.send("touch")
    child.expect("touched", timeout=30)


def _in_thread(fn: Callable[..., object], *args: object, timeout: float) -> BaseException | None:
    """Run ``fn`` with a deadline: a driver hang must fail the test, not stall the suite."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn(*args)
            box.append(None)
        except BaseException as exc:
            box.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    assert box, f"{fn} did not return within {timeout} s"
    return box[0]


def test_lock_of_a_stopped_child_is_refused_fast(backend: NvidiaBackend, child: Child) -> None:
    os.kill(child.pid, signal.SIGSTOP)
    time.sleep(0.05)
    t = time.monotonic()
    err = _in_thread(backend.lock, child.pid, 5.0, timeout=5.0)
    assert isinstance(err, ProcessStopped)
    assert time.monotonic() - t < 0.5
    os.kill(child.pid, signal.SIGCONT)
    assert backend.checkpoint_state(child.pid) is ProcessState.RUNNING


def test_unlock_waits_for_thaw_then_works(backend: NvidiaBackend, child: Child) -> None:
    backend.lock(child.pid, 5.0)
    os.kill(child.pid, signal.SIGSTOP)
    time.sleep(0.05)
    err = _in_thread(backend.unlock, child.pid, timeout=5.0)
    assert isinstance(err, ProcessStopped)
    os.kill(child.pid, signal.SIGCONT)
    backend.unlock(child.pid)
    child.send("touch")
    child.expect("touched", timeout=30)


def test_unlock_after_sigkill_of_a_locked_child(backend: NvidiaBackend, child: Child) -> None:
    backend.lock(child.pid, 5.0)
    os.kill(child.pid, signal.SIGKILL)
    assert _in_thread(backend.unlock, child.pid, timeout=10.0) is None  # dying or a zombie
    child.proc.wait(timeout=30)
    assert _in_thread(backend.unlock, child.pid, timeout=10.0) is None  # reaped


def test_the_driver_refuses_what_the_backend_no_longer_asks_about(backend: NvidiaBackend, child: Child) -> None:
    # NvidiaBackend locks (and unlocks) first and asks the state only when refused. That is safe
    # only if the driver refuses, quickly and without changing anything, a lock of a process that
    # is already locked or has no CUDA, and an unlock of one that is not locked: were a second
    # lock to succeed, a region would take another region's lock for its own and undo it.
    drv = CtypesCudaDriver()
    drv.checkpoint_lock(child.pid, 5000)
    refused = _in_thread(drv.checkpoint_lock, child.pid, 2000, timeout=5.0)
    assert isinstance(refused, CudaError), f"a second lock was not refused: {refused!r}"
    assert drv.checkpoint_state(child.pid) is ProcessState.LOCKED
    assert backend.lock_pid(child.pid, 2.0) is LockOutcome.ALREADY_LOCKED
    backend.unlock(child.pid)
    assert drv.checkpoint_state(child.pid) is ProcessState.RUNNING
    refused = _in_thread(drv.checkpoint_unlock, child.pid, timeout=5.0)
    assert isinstance(refused, CudaError), f"an unlock of a running process was not refused: {refused!r}"
    backend.unlock(child.pid)  # the backend's unlock of a running process is a no-op
    assert drv.checkpoint_state(child.pid) is ProcessState.RUNNING

    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        refused = _in_thread(drv.checkpoint_lock, plain.pid, 2000, timeout=5.0)
        assert isinstance(refused, CudaError), f"a lock of a process without CUDA was not refused: {refused!r}"
        assert backend.lock_pid(plain.pid, 2.0) is LockOutcome.NOT_CUDA, refused
    finally:
        plain.kill()
        plain.wait()
    child.send("touch")
    child.expect("touched", timeout=30)
