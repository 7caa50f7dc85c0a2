"""Admission by GPU memory in a batch, on the fake backend's simulated memory: a real arbiter
reads it (as NVML would), a real pool's judges and candidates allocate from it, and real
processes stand in for foreign GPU processes."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from krex_lab.evaluate import Evaluation
from krex_lab.evaluate.admission import MemoryPolicy, oom_cause
from krex_lab.evaluate.batch import BatchRecord, Pair
from krex_lab.evaluate.many import run_pairs
from krex_lab.evaluate.options import EvaluateOptions
from krex_lab.evaluate.pairs import Progress
from krex_lab.gpu.fake import SimulatedMemory

from .helpers import LIMITS, problem
from .memory_node import Terminal, memory_node

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    yield from memory_node(tmp_path_factory, 8 * GiB)


def _foreign(memory: SimulatedMemory, nbytes: int, seconds: float = 600.0) -> subprocess.Popen[bytes]:
    """A process that is no KREX session holding ``nbytes`` of GPU 0 (NVML would list it)."""
    code = (
        "import sys, time\n"
        "from krex_lab.gpu.fake import SimulatedMemory\n"
        f"SimulatedMemory({str(memory.dir)!r}).hold(0, {nbytes})\n"
        "print('holding', flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"holding\n"
    return proc


def _grabber(memory: SimulatedMemory, seconds: float) -> subprocess.Popen[bytes]:
    """A neighbour that, once any other process holds memory on GPU 0 (an evaluation began),
    takes the whole GPU for ``seconds`` (an allocation of its own
    mid-way through the evaluation), then exits."""
    code = (
        "import os, time\n"
        "from krex_lab.gpu.fake import SimulatedMemory\n"
        f"m = SimulatedMemory({str(memory.dir)!r})\n"
        "print('watching', flush=True)\n"
        "while not any(p != os.getpid() for p in m.processes(0)):\n"
        "    time.sleep(0.002)\n"
        "m.hold(0, m.total(0, 0))\n"
        "print('grabbed', flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"watching\n"
    return proc


def _pairs(candidates: list[str]) -> list[Pair]:
    ref = str(problem("kb_sim_memory"))
    return [
        Pair(index=i, line=i, reference=ref, candidate=str(problem("kb_sim_memory", c)), id=f"{c}-{i}")
        for i, c in enumerate(candidates)
    ]


def _run(
    node: SimpleNamespace, pairs: list[Pair], jobs: int, policy: MemoryPolicy, stream: io.StringIO | None = None
) -> list[BatchRecord]:
    out: list[BatchRecord] = []
    run_pairs(
        pairs,
        jobs=jobs,
        defaults=EvaluateOptions.of({"measure": False, "trials": 2, "timeouts": LIMITS}),
        pool=node.pool.client,
        emit=out.append,
        progress=stream or Terminal(),
        memory=policy,
    )
    return out


def test_little_memory_many_evaluations_none_fails_some_wait(node: SimpleNamespace) -> None:
    # 3 GiB of the GPU: 1 GiB held by a foreign process, 256 MiB kept free; an evaluation of this
    # problem counts about 1 GiB (its reference's 256 MiB peak twice, its small input sets, a
    # candidate's 512 MiB): one at a time fits, never two
    node.memory.set_total(0, 3 * GiB)
    foreign = _foreign(node.memory, 1 * GiB)
    stream = Terminal()
    try:
        records = _run(
            node,
            _pairs(["correct.py"] * 4),
            jobs=3,
            policy=MemoryPolicy(reserve_mb=256, unknown_footprint_mb=1024, poll_s=0.1),
            stream=stream,
        )
    finally:
        foreign.kill()
        foreign.wait()
    assert sorted(r.index for r in records) == [0, 1, 2, 3]  # one result per pair
    assert [r.verdict for r in records] == ["correct"] * 4, [r.summary for r in records]
    admissions = [r.metadata["admission"] for r in records]
    assert all(a["attempts"] == 1 for a in admissions), admissions
    assert all(a["gpu"] == 0 for a in admissions)
    assert int(records[0].metadata["memory"]["reference_peak"]) == 256 * MiB
    # the judge's side as it ran: the reference's peak at least (its answers are computed again)
    assert int(records[0].metadata["memory"]["judge_peak"]) >= 256 * MiB, records[0].metadata["memory"]
    waited = [a["waited_for_memory_s"] for a in admissions]
    assert sum(w > 0.2 for w in waited) >= 2, waited  # the rest waited in the queue
    said = stream.getvalue()
    assert "waiting for GPU memory (the first needs " in said and " GiB free; waited " in said, said


def test_in_a_log_the_progress_is_plain_lines_a_few_and_the_last() -> None:
    """Not a terminal (a pipe, a CI log): no carriage returns; a line when the state changes, at
    most every ``every_s``, and the last one always (a long batch's log says where it stands)."""
    log = io.StringIO()
    bar = Progress(3, log)
    bar.every_s = 0.0
    bar.update("correct")
    bar.waiting(2, "the first needs 2.00 GiB, at most 0.50 GiB free; waited 3 s of 120")
    bar.every_s = 3600.0
    bar.update("correct")  # within every_s of the line before: not said
    bar.waiting(0)
    bar.update("incorrect")  # the last: said
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    assert lines == [
        "krex eval: 1/3 done (correct 1)",
        "krex eval: 1/3 done (correct 1; 2 waiting for GPU memory (the first needs 2.00 GiB, at most 0.50 GiB "
        "free; waited 3 s of 120))",
        "krex eval: 3/3 done (correct 2, incorrect 1)",
    ], lines
    # before any result: the waits alone, no stray separator
    log = io.StringIO()
    bar = Progress(2, log)
    bar.every_s = 0.0
    bar.waiting(2, "the first needs 1.00 GiB")
    assert log.getvalue().splitlines() == ["krex eval: 0/2 done (2 waiting for GPU memory (the first needs 1.00 GiB))"]


def test_out_of_memory_caused_by_a_neighbour_is_requeued_not_blamed(node: SimpleNamespace) -> None:
    node.memory.set_total(0, 8 * GiB)
    grabber = _grabber(node.memory, seconds=3.0)
    try:
        records = _run(node, _pairs(["correct.py"]), jobs=1, policy=MemoryPolicy(reserve_mb=0, poll_s=0.1))
        assert grabber.stdout is not None and grabber.stdout.readline() == b"grabbed\n"
    finally:
        grabber.kill()
        grabber.wait()
    (record,) = records
    admission = record.metadata["admission"]
    assert record.verdict == "correct", record.summary
    assert admission["attempts"] == 2, admission
    assert "out of memory" in admission["requeued"][0].lower()


def test_a_candidate_beyond_its_allowance_is_out_of_memory_with_figures(node: SimpleNamespace) -> None:
    node.memory.set_total(0, 8 * GiB)
    (record,) = _run(node, _pairs(["greedy.py"]), jobs=1, policy=MemoryPolicy(reserve_mb=0, poll_s=0.1))
    assert record.verdict == "out_of_memory", record.summary
    assert record.metadata["admission"]["attempts"] == 1  # its own: not run again
    figures = record.metadata["out_of_memory_figures"]
    assert "asked for 64.00 GiB" in figures and "beyond its allowance of 0.50 GiB" in figures, figures


def test_an_out_of_memory_the_candidate_only_says_is_its_own(node: SimpleNamespace) -> None:
    """Its words are not the device's: with the memory it says it lacked free on the device when
    the judge looked, it is the candidate's verdict, not run again, never blamed on others."""
    node.memory.set_total(0, 8 * GiB)
    (record,) = _run(node, _pairs(["forged_oom.py"]), jobs=1, policy=MemoryPolicy(reserve_mb=0, poll_s=0.1))
    assert record.verdict == "out_of_memory", record.summary
    assert record.metadata["admission"]["attempts"] == 1, record.metadata["admission"]
    assert "out_of_memory_elsewhere" not in record.metadata
    assert "GiB of the device was free" in record.metadata["out_of_memory_figures"], record.metadata


def test_the_fake_memory_is_what_the_arbiter_reports(node: SimpleNamespace, tmp_path: Path) -> None:
    from krex_lab.evaluate.admission import arbiter_memory

    node.memory.set_total(0, 5 * GiB)
    read = arbiter_memory(node.pool.client)
    assert read is not None
    before = read()[0]
    foreign = _foreign(node.memory, 2 * GiB)
    try:
        during = read()[0]
    finally:
        foreign.kill()
        foreign.wait()
    after = read()[0]
    assert before.total == during.total == 5 * GiB
    assert during.used - before.used == 2 * GiB
    assert after.used == before.used  # an exited process holds nothing


def test_an_evaluation_that_never_fits_is_an_error_after_its_attempts_never_the_candidates(
    node: SimpleNamespace,
) -> None:
    node.memory.set_total(0, 8 * GiB)
    ref = str(problem("kb_sim_memory_big"))
    pair = Pair(index=0, line=0, reference=ref, candidate=str(problem("kb_sim_memory_big", "correct.py")))
    (record,) = _run(node, [pair], jobs=1, policy=MemoryPolicy(reserve_mb=0, attempts=2, poll_s=0.1))
    assert record.verdict == "error", record.summary
    assert record.metadata["admission"]["attempts"] == 2
    assert "not the candidate" in record.metadata["out_of_memory_elsewhere"]


def _ev(verdict: str, **metadata: str) -> Evaluation:
    return Evaluation(
        format="kernelbench", verdict=verdict, summary="", reference="r", candidate="c", metadata=metadata
    )


def test_who_ran_out_of_memory() -> None:
    torch_oom = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
        "of which 1.06 GiB is free. Process 4242 has 16.82 GiB memory in use. Of the allocated memory 1.00 GiB is "
        "allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated."
    )
    assert oom_cause(_ev("out_of_memory", out_of_memory=torch_oom), allowance=4 * GiB) == "elsewhere"
    assert oom_cause(_ev("out_of_memory", out_of_memory=torch_oom), allowance=2 * GiB) == "candidate"
    assert oom_cause(_ev("out_of_memory", out_of_memory="OSError: [Errno 12] Cannot allocate memory"), GiB) == (
        "candidate"  # the host's: its RLIMIT_DATA allowance, no neighbour's
    )
    assert oom_cause(_ev("out_of_memory", out_of_memory="CUDA error: out of memory"), GiB) == "elsewhere"
    judge_side = "the reference fails: OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"
    assert oom_cause(_ev("error", reference_error=judge_side), GiB) == "elsewhere"
    assert oom_cause(_ev("runtime_error", runtime_error="ValueError: out of memory?"), GiB) is None
    assert oom_cause(_ev("correct"), GiB) is None
