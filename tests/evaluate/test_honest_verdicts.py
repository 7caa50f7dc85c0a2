"""Honest work gets honest verdicts: a torch.compile candidate is correct (its framework's threads
and compile workers are not work left running), a time without a region says so, and a problem
of many inputs is timed over its sets."""

from __future__ import annotations

from collections.abc import Callable

from krex_lab.evaluate import Evaluation

Run = Callable[..., Evaluation]


def test_a_torch_compile_candidate_is_correct(run: Run) -> None:
    ev = run("kb_scaled_add", "compiled.py", timeouts={"load": 300.0, "check": 300.0, "time": 120.0})
    assert ev.verdict == "correct", (ev.summary, ev.metadata)
    assert not any(f.startswith("rejected:") for f in ev.flags), ev.flags


def test_a_time_without_a_region_says_so_first_and_is_compared_with_a_reference_timed_alike(run: Run) -> None:
    protected = run("kb_matmul", "correct.py")  # a region's reference time now cached in that judge
    bare = run("kb_matmul", "correct.py", exclusive=False)
    assert protected.verdict == bare.verdict == "correct"
    assert "UNPROTECTED" in bare.summary.splitlines()[0] and "unprotected" in bare.flags
    assert "UNPROTECTED" not in protected.summary and "unprotected" not in protected.flags
    refs = [p for p in bare.regions if p.program == "reference"]
    assert refs and not refs[0].cached  # timed now, as the candidate was, never a region's figure


def test_a_problem_of_three_inputs_is_timed_over_a_hundred_sets(run: Run) -> None:
    # 300 shared arrays: one memfd each once made a message of more descriptors than a socket
    # carries (EINVAL), and every such problem crashed in its time phase on a CPU
    ev = run("kb_add3", "correct.py")
    assert ev.verdict == "correct", (ev.summary, ev.metadata)
    assert ev.metadata["input_sets"] == "100" and ev.runtime > 0
