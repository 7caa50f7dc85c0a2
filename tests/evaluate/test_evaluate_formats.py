"""krex_lab.evaluate on both formats, end to end: a real arbiter (fake backend), a real pool of
torch-warm workers, the example problems of ``problems/`` (elementwise, reduction, softmax,
matmul, init inputs, several outputs, a problem without torch)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import krex_lab
from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.evaluate.cases import parse_cases
from krex_lab.evaluate.source import detect_format, read_source
from tests.support.pool import PoolProc

from .helpers import problem

Run = Callable[..., Evaluation]

CORRECT = [
    ("kb_scaled_add", "correct.py"),  # elementwise, an init input
    ("kb_row_sum", "correct.py"),  # reduction
    ("kb_softmax", "correct.py"),  # softmax
    ("kb_matmul", "correct.py"),  # matmul
    ("kb_norm_stats", "correct.py"),  # two outputs
    ("kb_linear_relu", "correct.py"),  # init inputs that size parameters (same seed as the reference)
    ("kb_clamp", "correct.py"),
]


@pytest.mark.parametrize(("name", "candidate"), CORRECT)
def test_a_correct_kernelbench_candidate_is_correct_and_timed(run: Run, name: str, candidate: str) -> None:
    ev = run(name, candidate)
    assert ev.verdict == "correct", ev.summary + "\n" + json.dumps(ev.metadata)
    assert ev.format == "kernelbench" and ev.compiled and ev.correctness
    assert ev.metadata["correctness_trials"] == "(5 / 5)"
    assert ev.runtime > 0 and ev.ref_runtime > 0 and ev.speedup == pytest.approx(ev.ref_runtime / ev.runtime, rel=1e-3)
    assert ev.runtime_stats is not None and ev.runtime_stats.num_trials == 100
    assert ev.runtime_stats.min <= ev.runtime_stats.mean <= ev.runtime_stats.max
    # no GPU here: the times are the host clock's, and the result says so
    assert ev.gpu_timed is False and ev.timing_method == "host-clock" and ev.simulated is True
    assert any("no GPU was timed" in w for w in ev.warnings)
    # timed inside a region, whose report is carried for the candidate and the reference
    assert ev.regions[0].program == "candidate" and ev.regions[0].region is not None
    assert ev.regions[0].region["gpu"] == 0 and ev.region_reports()[0].summary().startswith("KREX region")
    assert set(ev.phases) >= {"load", "check", "time", "total", "job"}


@pytest.mark.parametrize(
    ("name", "candidate", "issue"),
    [
        ("kb_softmax", "wrong_dim.py", "elements differ"),
        ("kb_norm_stats", "wrong_second_output.py", "output 1"),  # the second of two outputs is wrong
    ],
)
def test_a_wrong_candidate_is_incorrect_and_says_where(run: Run, name: str, candidate: str, issue: str) -> None:
    ev = run(name, candidate)
    assert ev.verdict == "incorrect" and ev.compiled and not ev.correctness
    assert issue in ev.metadata["correctness_issue"]
    assert ev.runtime == -1.0 and ev.regions == []  # nothing wrong is timed


def test_gpumode_problem_with_case_files_checks_tests_and_times_benchmarks(run: Run) -> None:
    ev = run("gm_vector_scale", "correct.py")
    assert ev.format == "gpumode" and ev.verdict == "correct", ev.summary
    assert [c.spec for c in ev.tests] == ["size: 1000; seed: 1", "size: 4096; seed: 2", "size: 17; seed: 3"]
    assert all(c.passed for c in ev.tests)
    assert [c.spec for c in ev.benchmarks] == ["size: 65536; seed: 10", "size: 262144; seed: 11"]
    for case in ev.benchmarks:
        assert case.passed and 3 <= case.runs <= 100
        assert case.best <= case.mean <= case.worst and case.err is not None and case.ref_mean
    # the format's figure: geometric mean of the benchmark means
    assert ev.runtime == pytest.approx((ev.benchmarks[0].mean * ev.benchmarks[1].mean) ** 0.5, rel=1e-6)


def test_gpumode_cases_from_the_reference_and_several_outputs(run: Run) -> None:
    ok = run("gm_minmax", "correct.py")
    assert ok.verdict == "correct" and len(ok.tests) == 2 and len(ok.benchmarks) == 1
    bad = run("gm_minmax", "wrong.py")
    assert bad.verdict == "incorrect" and "maxima differ" in bad.metadata["correctness_issue"]
    assert bad.tests[0].passed is False and bad.tests[0].message == "maxima differ"


def test_gpumode_test_mode_checks_only_and_leaderboard_rechecks(run: Run) -> None:
    ev = run("gm_row_max", "correct.py", mode="test")
    assert ev.verdict == "correct" and ev.runtime == -1.0 and ev.benchmarks == []
    board = run("gm_row_max", "correct.py", mode="leaderboard")
    assert board.verdict == "correct" and board.benchmarks[0].runs >= 3
    wrong = run("gm_row_max", "wrong.py", mode="leaderboard")
    assert wrong.verdict == "incorrect"


def test_gpumode_problem_without_torch_runs_in_a_worker(run: Run) -> None:
    ev = run("gm_cumsum_numpy", "correct.py", tests="size: 5; seed: 9\nsize: 50; seed: 10")
    assert ev.verdict == "correct", ev.summary
    assert [c.spec for c in ev.tests] == ["size: 5; seed: 9", "size: 50; seed: 10"]


def test_gpumode_phases_run_without_torch_installed(tmp_path: Path) -> None:
    """A GPU MODE problem that does not use torch needs no torch: the judge runs it in a process
    where importing torch fails."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # "import torch" raises ImportError from here on
        import krex_lab.evaluate
        from krex_lab.evaluate.orchestrate import build_job
        from krex_lab.evaluate.judge import session
        ref = {str(problem("gm_cumsum_numpy"))!r}
        job = build_job(ref, {str(problem("gm_cumsum_numpy", "correct.py"))!r}, format="auto", timing="format",
                        measure=True, trials=None, perf_trials=None, mode="benchmark", tests=None, benchmarks=None,
                        atol=None, rtol=None, seed=42, retime_reference=False, time_reference=True, timeouts=None,
                        memory_limit_mb=None, output_limit_mb=None, exclusive=False)
        out = session.run(job)
        torch = "torch" in sys.modules and sys.modules["torch"]
        print(out.check.verdict, out.time.parts[0].method, torch)
        """
    )
    env = {"KREX_EVAL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1].split() == ["None", "host-clock", "None"]


def test_reference_time_is_cached_per_problem_and_retimed_on_request(run: Run) -> None:
    """Reference times live in each judge's memory: a later evaluation on the same worker reads it."""
    first = run("kb_matmul", "correct.py", retime_reference=True)
    again = run("kb_matmul", "correct.py")
    for _ in range(6):  # the pool has two workers: until one lands where the first did
        if again.worker_pid == first.worker_pid:
            break
        again = run("kb_matmul", "correct.py")
    refs = [p for p in again.regions if p.program == "reference"]
    assert (
        refs
        and refs[0].cached
        and refs[0].timed_at == next(p for p in first.regions if p.program == "reference").timed_at
    )
    assert again.ref_runtime == first.ref_runtime  # the cached figure, not a new measurement
    assert "ref_runtime_cached" in again.metadata
    fresh = run("kb_matmul", "correct.py", retime_reference=True)
    assert not next(p for p in fresh.regions if p.program == "reference").cached


def test_bench_method_on_request_says_so(run: Run) -> None:
    ev = run("kb_scaled_add", "correct.py", timing="bench", retime_reference=True)
    assert ev.verdict == "correct" and ev.timing == "bench"
    assert ev.timing_method == "bench-host-clock" and ev.runtime > 0


def test_check_only_and_sources_given_as_text(run: Run, eval_pool: PoolProc) -> None:
    ref = problem("kb_scaled_add").read_text()
    cand = problem("kb_scaled_add", "correct.py").read_text()
    ev = evaluate(ref, cand, pool=eval_pool.client, measure=False)
    assert ev.verdict == "correct" and ev.runtime == -1.0 and ev.reference == "<string>"
    assert krex_lab.evaluate is not None and callable(krex_lab.evaluate)
    assert krex_lab.evaluate(ref, cand, pool=eval_pool.client, measure=False).verdict == "correct"


def test_the_result_is_json_and_reads_back(run: Run) -> None:
    ev = run("gm_row_max", "correct.py")
    text = ev.to_json()
    back = Evaluation.from_json(text)
    assert back == ev and json.loads(text)["benchmarks"][0]["spec"] == "rows: 512; cols: 512; seed: 3"


def test_bad_calls_raise_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate(tmp_path / "missing.py", problem("kb_scaled_add", "correct.py"))
    with pytest.raises(ValueError, match="unknown format"):
        evaluate(problem("kb_scaled_add"), problem("kb_scaled_add", "correct.py"), format="triton")
    with pytest.raises(ValueError, match="cannot tell the format"):
        evaluate("x = 1\n", "y = 2\n")
    with pytest.raises(ValueError, match="unknown phase"):
        evaluate(problem("kb_scaled_add"), problem("kb_scaled_add", "correct.py"), timeouts={"compile": 5})


def test_format_is_told_by_the_names_defined() -> None:
    kb = (read_source(problem("kb_softmax"), "r"), read_source(problem("kb_softmax", "correct.py"), "c"))
    gm = (read_source(problem("gm_row_max"), "r"), read_source(problem("gm_row_max", "correct.py"), "c"))
    assert detect_format(*kb) == "kernelbench" and detect_format(*gm) == "gpumode"
    assert parse_cases("size: 8; seed: 1; name: big; fast: true\n# comment\n\nscale: 0.5") == [
        {"size": 8, "seed": 1, "name": "big", "fast": True},
        {"scale": 0.5},
    ]
    with pytest.raises(ValueError, match="line 1"):
        parse_cases("size 8")


def test_importing_krex_lab_stays_cheap() -> None:
    code = (
        "import sys, krex_lab; krex_lab.Evaluation; print([m for m in ('torch', 'zmq', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_krex_modules_a_job_imports_stay_imported_after_the_reset(eval_pool: PoolProc) -> None:
    """The worker's reset forgets modules from outside the installed packages (an edited
    candidate is imported afresh), but never KREX's own, wherever the package lies: an editable
    install re-imported krex_lab.evaluate's worker side after every evaluation (0.1-0.3 s each)."""
    client = eval_pool.client
    first = client.run_code("import sys, krex_lab.evaluate.cases\n'krex_lab.evaluate.cases' in sys.modules", gpu=0)
    assert first.ok and first.value == "True"
    same = []
    for _ in range(12):  # later jobs on the same worker (after its reset) still have it
        r = client.run_code("import sys\n'krex_lab.evaluate.cases' in sys.modules", gpu=0)
        if r.worker_pid == first.worker_pid:
            same.append(r.value)
    assert same and set(same) == {"True"}


def test_cpu_timing_fits_torch_threads_to_the_cores_a_region_leaves() -> None:
    """More torch threads than the cores a region pins the holder to spin-wait on each other (a
    50 us reduction read 50 ms): inside a region on the CPU the threads fit the cores."""
    import os

    import torch

    from krex_lab.evaluate.judge.rounds import _fit_threads

    saved_mask, saved_threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        os.sched_setaffinity(0, {min(saved_mask)})
        assert _fit_threads() == 4 and torch.get_num_threads() == 1
        assert _fit_threads() is None  # already fitting: nothing to restore
    finally:
        os.sched_setaffinity(0, saved_mask)
        torch.set_num_threads(saved_threads)
