"""Hostile or broken candidates get a verdict, never a hang, never harm to the next evaluation.
Each case on the whole path (real arbiter, real pool, real worker processes and signals); after
each, a correct candidate still evaluates correctly on the same pool."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from krex_lab.evaluate import Evaluation
from tests.support.pool import PoolProc

Run = Callable[..., Evaluation]


@pytest.fixture
def healthy_after(run: Run, eval_pool: PoolProc) -> Iterator[None]:
    """After the test: the pool is whole again and an honest candidate is still correct."""
    yield
    eval_pool.wait_ready(60)
    ev = run("kb_scaled_add", "correct.py", measure=False)
    assert ev.verdict == "correct", ev.summary


pytestmark = pytest.mark.usefixtures("healthy_after")


def test_python_compile_error_is_a_verdict_with_the_message(run: Run) -> None:
    ev = run("kb_scaled_add", "syntax_error.py")
    assert ev.verdict == "compile_error" and not ev.compiled and not ev.correctness
    assert "SyntaxError" in ev.metadata["compilation_error"] and "line 10" in ev.metadata["compilation_error"]


def test_a_candidate_without_modelnew_does_not_compile(run: Run) -> None:
    ev = run("kb_scaled_add", "no_modelnew.py")
    assert ev.verdict == "compile_error" and "ModelNew" in ev.metadata["compilation_error"]


@pytest.mark.timeout(900)
def test_cpp_load_inline_builds_once_per_source_and_a_compiler_error_is_trimmed(run: Run) -> None:
    """A C++ kernel through torch's load_inline (the CPU twin of a CUDA candidate): built in the
    candidate's own directory, found again the second time (the compile cache); a kernel that
    does not compile gets the compiler's error lines, not the whole build log."""
    long = {"load": 600.0, "check": 60.0, "time": 60.0}
    first = run("kb_scaled_add", "cpp_inline.py", timeouts=long, measure=False)
    assert first.verdict == "correct", first.summary + str(first.metadata)
    second = run("kb_scaled_add", "cpp_inline.py", timeouts=long, measure=False)
    assert second.verdict == "correct"
    assert second.phases["load"] < first.phases["load"] / 5, (first.phases, second.phases)
    broken = run("kb_scaled_add", "cpp_compile_error.py", timeouts=long)
    assert broken.verdict == "compile_error" and not broken.compiled
    message = broken.metadata["compilation_error"]
    assert "undeclared_tensor" in message and "error" in message.lower()
    assert len(message) < 4000


def test_segfault_kills_only_its_worker(run: Run, eval_pool: PoolProc) -> None:
    before = set(eval_pool.worker_pids())
    ev = run("kb_row_sum", "segfault.py")
    assert ev.verdict == "crashed" and ev.compiled and not ev.correctness
    assert "SIGSEGV" in ev.metadata["worker_died"] and "check phase" in ev.metadata["worker_died"]
    assert ev.worker_pid in before
    eval_pool.wait_ready(60)
    assert ev.worker_pid in eval_pool.worker_pids()  # its own process died: the judge's worker serves on


def test_abort_in_a_gpumode_submission_is_a_crash(run: Run) -> None:
    ev = run("gm_vector_scale", "abort.py")
    assert ev.verdict == "crashed" and "SIGABRT" in ev.metadata["worker_died"]


def test_python_infinite_loop_is_stopped_at_the_phase_limit(run: Run, eval_pool: PoolProc) -> None:
    t0 = time.monotonic()
    ev = run("kb_softmax", "loop_python.py", timeouts={"load": 60, "check": 3, "time": 30})
    assert time.monotonic() - t0 < 20
    assert ev.verdict == "timeout" and "check phase ran past its limit of 3 s" in ev.metadata["timeout"]
    assert "killed" not in ev.metadata["timeout"]  # an interrupt was enough: the worker lives on
    assert ev.worker_pid in eval_pool.worker_pids()


def test_a_loop_that_ignores_interrupts_costs_only_its_process(run: Run, eval_pool: PoolProc) -> None:
    t0 = time.monotonic()
    ev = run("kb_softmax", "loop_uninterruptible.py", timeouts={"load": 60, "check": 3, "time": 30})
    assert time.monotonic() - t0 < 25
    assert ev.verdict == "timeout" and "check phase" in ev.metadata["timeout"]
    eval_pool.wait_ready(60)
    assert ev.worker_pid in eval_pool.worker_pids()  # the judge was interrupted; the candidate killed


def test_memory_exhaustion_is_a_verdict_not_the_oom_killer(run: Run) -> None:
    ev = run("kb_matmul", "memory_hog.py", memory_limit_mb=512)
    assert ev.verdict == "out_of_memory", ev.summary
    assert "MemoryError" in ev.metadata["out_of_memory"]


def test_writing_into_inputs_is_rejected(run: Run) -> None:
    ev = run("kb_scaled_add", "writes_input.py")
    assert ev.verdict == "rejected" and "inputs_modified" in ev.metadata["rejected"]


def test_returning_an_input_is_rejected(run: Run) -> None:
    ev = run("kb_clamp", "returns_input.py")
    assert ev.verdict == "rejected"
    assert set(ev.metadata["rejected"]) == {"aliased_output"}  # it wrote nothing: aliasing alone


def test_gpumode_in_place_on_a_read_only_input_is_rejected_but_its_output_buffer_is_allowed(run: Run) -> None:
    ev = run("gm_vector_scale", "in_place.py")
    assert ev.verdict == "rejected"
    assert {"inputs_modified", "aliased_output"} <= set(ev.metadata["rejected"])
    assert run("gm_vector_scale", "correct.py", measure=False).verdict == "correct"  # writes `out`: allowed


def test_work_left_in_another_thread_is_rejected(run: Run) -> None:
    ev = run("kb_matmul", "thread_tail.py")
    assert ev.verdict == "rejected" and "tail-work" in ev.metadata["rejected"]["threads_left"]


@pytest.mark.parametrize("candidate", ["caches_first_result.py", "caches_by_address.py"])
def test_caching_results_across_calls_is_not_correct(run: Run, candidate: str) -> None:
    ev = run("kb_softmax", candidate)
    # fresh inputs every trial: a kept result is a wrong one (or stale once its buffers are refilled)
    assert ev.verdict in ("incorrect", "rejected"), ev.metadata


def test_a_wrong_answer_on_refilled_buffers_is_wrong_not_stale(run: Run) -> None:
    # right in its three trials and the refilled trial's first call, then a new wrong answer: a
    # stale one is what it returned before the refill (caches_last_by_address.py), this is not
    ev = run("kb_softmax", "wrong_after_refill.py", trials=3, measure=False)
    assert ev.verdict == "incorrect" and "rejected" not in ev.metadata, ev.metadata
    assert "a trial refilled in place with new values" in str(ev.metadata["correctness_issue"]), ev.metadata
    stale = run("kb_softmax", "caches_last_by_address.py", trials=3, measure=False)
    assert stale.verdict == "rejected" and "cached_results" in stale.metadata["rejected"], stale.metadata


def test_a_flood_of_output_is_capped_and_never_reaches_the_caller_whole(run: Run) -> None:
    capped = run("kb_scaled_add", "floods_output.py", measure=False)
    assert capped.verdict == "rejected" and "output_limit" in capped.metadata
    allowed = run("kb_scaled_add", "floods_output.py", measure=False, output_limit_mb=1024)
    assert allowed.verdict == "correct"
    assert allowed.metadata["output_bytes"] >= 6 * 100 * (1 << 20)  # 6 calls of 100 MiB each
    assert allowed.output is not None and len(allowed.output) < 20000 and "bytes of output left out" in allowed.output


@pytest.mark.parametrize(("name", "where"), [("kb_matmul", "forward"), ("gm_row_max", "ref_kernel")])
def test_calling_the_reference_gets_no_speedup_it_did_not_earn(run: Run, name: str, where: str) -> None:
    ev = run(name, "calls_reference.py")
    # the candidate may import the reference's file (it is the user's): what it gains is the
    # reference's own time, measured honestly, and nothing the judge holds
    assert ev.verdict != "correct" or (ev.speedup is not None and ev.speedup < 3.0), (ev.summary, where)


def test_a_raising_candidate_is_a_runtime_error(run: Run) -> None:
    ev = run("kb_matmul", "raises.py")
    assert ev.verdict == "runtime_error" and "cannot be multiplied" in ev.metadata["runtime_error"]
