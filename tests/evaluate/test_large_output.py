"""A large output is judged inside the candidate's memory allowance: compared where it is, in
chunks, without host float64 copies, and each trial's output let go before the next."""

from __future__ import annotations

from collections.abc import Callable

from krex_lab.evaluate import Evaluation

Run = Callable[..., Evaluation]


def test_a_64_mib_output_is_judged_within_a_200_mib_allowance(run: Run) -> None:
    # float64 copies of the output and the reference's (256 MiB) would not fit, nor would the
    # outputs of two trials beside the one being made (3 x 64 MiB)
    limits = {"load": 120.0, "check": 240.0, "time": 240.0}
    ev = run("kb_outer_large", "correct.py", memory_limit_mb=200, perf_trials=3, retime_reference=True, timeouts=limits)
    assert ev.verdict == "correct", (ev.summary, ev.metadata)
    assert ev.metadata["max_difference"] == [0.0]
