"""A batch short of GPU memory because the pool's own idle workers hold it (each worker's context):
with ``MemoryPolicy.give_back_workers`` the batch lets the pool keep fewer workers, their memory
comes back, and every evaluation runs; the pool grows back once the batch ends. On the fake
backend's simulated memory, each real worker's context holding ``$KREX_FAKE_CONTEXT_MB``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from krex_lab.evaluate.admission import MemoryPolicy
from krex_lab.evaluate.batch import BatchRecord, Pair
from krex_lab.evaluate.many import run_pairs
from krex_lab.evaluate.options import EvaluateOptions

from .helpers import LIMITS, problem
from .memory_node import Terminal, memory_node

GiB = 1 << 30
WORKERS = 4


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    # each worker's context: 1 GiB while it lives
    yield from memory_node(tmp_path_factory, 5 * GiB, workers=WORKERS, context_mb=1024)


def _run(node: SimpleNamespace, count: int, policy: MemoryPolicy) -> tuple[list[BatchRecord], str]:
    ref = str(problem("kb_sim_memory"))
    pairs = [
        Pair(index=i, line=i, reference=ref, candidate=str(problem("kb_sim_memory", "correct.py")), id=f"c{i}")
        for i in range(count)
    ]
    out: list[BatchRecord] = []
    log = Terminal()
    run_pairs(
        pairs,
        jobs=WORKERS,
        defaults=EvaluateOptions.of({"measure": False, "trials": 2, "timeouts": LIMITS}),
        pool=node.pool.client,
        emit=out.append,
        progress=log,
        memory=policy,
    )
    return out, log.getvalue()


def _workers(node: SimpleNamespace) -> int:
    return sum(1 for g in node.pool.status().gpus for w in g.workers if w.state != "dead")


def test_a_batch_short_of_memory_gives_back_the_idle_workers_and_none_fails(node: SimpleNamespace) -> None:
    # 5 GiB: the 4 workers' contexts hold 4, 256 MiB is kept free, an evaluation counts about
    # 1 GiB: none fits beside the idle workers; with two of them gone, two at a time do
    node.pool.wait_ready(120)
    assert node.memory.used(0) >= WORKERS * GiB, node.memory.processes(0)
    started = time.monotonic()
    records, said = _run(
        node,
        4,
        MemoryPolicy(
            reserve_mb=256,
            unknown_footprint_mb=1024,
            poll_s=0.1,
            max_wait_s=600,
            give_back_after_s=1.0,
            give_back_workers=True,
        ),
    )
    took = time.monotonic() - started
    assert sorted(r.index for r in records) == [0, 1, 2, 3]  # one result per pair
    assert [r.verdict for r in records] == ["correct"] * 4, [r.summary for r in records]
    admissions = [r.metadata["admission"] for r in records]
    assert all(a["attempts"] == 1 for a in admissions), admissions  # no out-of-memory on the way
    assert all(a.get("workers_per_gpu_kept") in (1, 2) for a in admissions), admissions
    # none waited for the policy's long wait (alone, on shrunk sets): the memory came back
    assert max(a["waited_for_memory_s"] for a in admissions) < 120, admissions
    assert took < 300, took
    assert "the others' memory given back" in said, said
    # the batch's cap ends with it: the pool grows back to its own size
    deadline = time.monotonic() + 120
    while _workers(node) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _workers(node) == WORKERS, node.pool.status()


def test_without_the_switch_the_pool_keeps_its_workers(node: SimpleNamespace) -> None:
    """Off (the default): the batch waits for memory and runs alone after ``max_wait_s``; the
    pool's workers are never let go."""
    node.pool.wait_ready(120)
    pids = sorted(node.pool.worker_pids())
    records, said = _run(
        node,
        1,
        MemoryPolicy(
            reserve_mb=256, unknown_footprint_mb=1024, poll_s=0.1, max_wait_s=3.0, attempts=1, give_back_after_s=0.5
        ),
    )
    (record,) = records
    assert record.metadata["admission"]["waited_for_memory_s"] >= 2.5, record.metadata["admission"]
    assert "workers_per_gpu_kept" not in record.metadata["admission"]
    assert "given back" not in said
    assert sorted(node.pool.worker_pids()) == pids
