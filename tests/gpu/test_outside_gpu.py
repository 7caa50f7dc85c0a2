"""A round's end seen from outside the candidate's process on an NVIDIA GPU
(krex_lab.evaluate.judge.outside): the driver's checkpoint lock waits for every piece of work a
process queued, whatever the stream, and a stopped process is refused at once, never locked."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from krex_lab.evaluate.judge.outside import CheckpointDrain, DrainFailed, NoDrain, drain_for
from tests.gpu.test_nvidia_driver import Child

pytestmark = pytest.mark.gpu


@pytest.fixture
def drain() -> Iterator[CheckpointDrain]:
    d = drain_for("cuda")
    if not isinstance(d, CheckpointDrain):
        pytest.skip(f"no checkpoint lock here: {d.what}")
    yield d


@pytest.fixture
def child(drain: CheckpointDrain) -> Iterator[Child]:
    c = Child()
    try:
        yield c
    finally:
        if c.proc.poll() is None:
            os.kill(c.pid, signal.SIGCONT)
            drain.release([c.pid])
        c.close()


def test_a_cpu_has_no_lock_and_says_so() -> None:
    d = drain_for("cpu")
    assert isinstance(d, NoDrain) and not d.available and "answer" in d.what
    assert d.settle([os.getpid()], 1.0) == []


def test_settle_returns_only_once_the_queued_work_is_done(drain: CheckpointDrain, child: Child) -> None:
    child.send("work 1.0")  # about a second of matmuls queued, not yet waited for
    queued = float(child.expect("queued", timeout=30)[1])
    held = drain.settle([child.pid], timeout_s=30.0)
    settled = time.time()
    try:
        assert held == [child.pid]
        assert settled - queued >= 0.6, settled - queued  # it waited for the queued work
    finally:
        drain.release(held)
    synced = float(child.expect("synced", timeout=30)[1])
    assert synced <= settled + 0.05  # the work was done when the lock returned
    child.send("touch")
    child.expect("touched", timeout=10)  # released: the child works on


def test_a_stopped_process_is_refused_at_once(drain: CheckpointDrain, child: Child) -> None:
    os.kill(child.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(DrainFailed) as err:
            drain.settle([child.pid], timeout_s=5.0)
        assert err.value.kind == "stopped" and time.monotonic() - t0 < 1.0
    finally:
        os.kill(child.pid, signal.SIGCONT)
    child.send("touch")
    child.expect("touched", timeout=10)  # never locked: it works on
