"""Published GPU MODE problems: a directory with task.yml, its files laid out beside the submission.

The problems of ``problems/gm_tasks/`` are in the published layout: each ``task.yml`` lists
``../utils.py`` (shared), its ``task.py`` (the types), ``reference.py`` and the submission, with
its cases, time limits and ranking. The job a call makes carries every file and case; the files
laid out import as GPU MODE's runner would import them; the end-to-end verdicts run on the tests'
pool once its worker lays the files out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.evaluate.job import build_job
from krex_lab.evaluate.options import Job
from krex_lab.evaluate.task import TaskError, files_digest, lay_out, layout_on_path, read_task
from tests.support.pool import PoolProc

from .helpers import LIMITS, PROBLEMS

TASKS = PROBLEMS / "gm_tasks"
SCALE, ROWSUM = TASKS / "gm_task_scale", TASKS / "gm_task_rowsum"


def job(reference: Path | str, candidate: Path | str, **kw: Any) -> Job:
    return build_job(str(reference), str(candidate), **kw)


def test_a_problem_directory_makes_a_job_with_every_laid_out_file() -> None:
    j = job(SCALE, SCALE / "correct.py")
    assert j.format == "gpumode" and j.task is not None
    assert set(j.files) == {"submission.py", "task.py", "utils.py", "reference.py"}
    assert j.files["utils.py"] == (TASKS / "utils.py").read_text()  # "../utils.py", relative to the task
    assert j.files["submission.py"] == (SCALE / "correct.py").read_text() == j.candidate.text
    assert j.files["reference.py"] == j.reference.text == (SCALE / "reference.py").read_text()
    assert j.reference.label == str(SCALE / "reference.py")
    assert (j.task.submission, j.task.reference, j.task.ranking_by) == ("submission.py", "reference.py", "geom")
    assert j.tests == [{"size": 127, "seed": 4242}, {"size": 1024, "seed": 5236}]
    assert j.benchmarks == [{"size": 4096, "seed": 31232}, {"size": 65536, "seed": 4052}]  # geom: all of them
    # the same job from the reference's own path, or from the task.yml
    for ref in (SCALE / "reference.py", SCALE / "task.yml"):
        other = job(ref, SCALE / "correct.py")
        assert other.files == j.files and other.tests == j.tests and other.reference.sha256 == j.reference.sha256


def test_the_task_time_limit_of_the_mode_bounds_each_phase_the_caller_left_open() -> None:
    assert job(SCALE, SCALE / "correct.py").options.timeouts == {"load": 90.0, "check": 90.0, "time": 90.0}
    assert job(SCALE, SCALE / "correct.py", mode="test").options.limit("check") == 60.0
    leader = job(SCALE, SCALE / "correct.py", mode="leaderboard", timeouts={"load": 500})
    assert leader.options.timeouts == {"load": 500.0, "check": 120.0, "time": 120.0}
    # none given in the task: GPU MODE's 180 s
    assert job(ROWSUM, ROWSUM / "correct.py").options.timeouts == {"load": 180.0, "check": 180.0, "time": 180.0}
    # no task: the evaluator's own defaults
    lone = job(PROBLEMS / "gm_vector_scale" / "reference.py", PROBLEMS / "gm_vector_scale" / "correct.py")
    assert lone.options.timeouts == {} and lone.files == {} and lone.task is None


def test_ranked_by_last_only_the_last_benchmark_is_timed_unless_the_caller_names_cases() -> None:
    j = job(ROWSUM, ROWSUM / "correct.py")
    assert j.task is not None and j.task.ranking_by == "last"
    assert len(j.tests) == 3 and j.benchmarks == [{"rows": 1024, "cols": 512, "seed": 22}]
    given = job(ROWSUM, ROWSUM / "correct.py", benchmarks="rows: 4; cols: 4; seed: 1\nrows: 8; cols: 8; seed: 2")
    assert given.benchmarks == [{"rows": 4, "cols": 4, "seed": 1}, {"rows": 8, "cols": 8, "seed": 2}]
    assert job(ROWSUM, ROWSUM / "correct.py", tests=[{"rows": 2, "cols": 2, "seed": 3}]).tests == [
        {"rows": 2, "cols": 2, "seed": 3}
    ]


def test_a_laid_out_problem_imports_as_the_runner_lays_it_out(tmp_path: Path) -> None:
    """In a fresh interpreter: the directory first on sys.path, the reference and each submission
    import their task.py and utils.py; the right one passes the reference's check, the wrong one not."""
    out = {}
    for name in ("correct.py", "wrong.py", "uses_utils.py"):
        j = job(SCALE, SCALE / name)
        where = tmp_path / name
        lay_out(j.files, where)
        script = textwrap.dedent(
            """
            import sys
            sys.path.insert(0, sys.argv[1])
            from reference import check_implementation, generate_input
            from submission import custom_kernel
            data = generate_input(size=300, seed=7)
            print(check_implementation(data, custom_kernel(data))[0])
            """
        )
        res = subprocess.run([sys.executable, "-c", script, str(where)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        out[name] = res.stdout.split()[-1]
    assert out == {"correct.py": "True", "wrong.py": "False", "uses_utils.py": "True"}


def test_lay_out_writes_privately_skips_and_refuses_names_outside(tmp_path: Path) -> None:
    files = {"a.py": "A = 1\n", "pkg/b.py": "B = 2\n", "submission.py": "secret\n"}
    where = tmp_path / "lay"
    written = lay_out(files, where, skip=["submission.py"])
    assert sorted(Path(p).relative_to(where).as_posix() for p in written) == ["a.py", "pkg/b.py"]
    assert not (where / "submission.py").exists() and (where.stat().st_mode & 0o777) == 0o700
    lay_out({"a.py": "A = 3\n"}, where)  # changed text replaces the file
    assert (where / "a.py").read_text() == "A = 3\n"
    for bad in ("../escape.py", "/abs.py", "x/../../y.py", ""):
        with pytest.raises(ValueError, match="outside"):
            lay_out({"fine.py": "", bad: "x"}, tmp_path / "refused")
        assert not (tmp_path / "refused").exists(), "nothing is written for a layout refused"
    assert files_digest(files) != files_digest({**files, "a.py": "A = 4\n"})


def test_lay_out_writes_through_no_link_or_pipe_found_in_its_directory(tmp_path: Path) -> None:
    """Links at a file's own name and at its partial's, and a pipe, left in the directory by
    whoever could write it: each is replaced, nothing outside is written, nothing waits."""
    victim = tmp_path / "victim.py"
    victim.write_text("ORIGINAL = True\n")
    where = tmp_path / "layout"
    where.mkdir()
    (where / "a.py").symlink_to(victim)
    (where / f".b.py.{os.getpid()}.part").symlink_to(victim)
    os.mkfifo(where / "c.py")
    lay_out({"a.py": "A = 1\n", "b.py": "B = 2\n", "c.py": "C = 3\n"}, where)
    assert victim.read_text() == "ORIGINAL = True\n"
    for name, text in (("a.py", "A = 1\n"), ("b.py", "B = 2\n"), ("c.py", "C = 3\n")):
        assert not (where / name).is_symlink() and (where / name).read_text() == text


def test_layout_on_path_finds_this_problems_utils_not_one_left_in_sys_modules(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    lay_out({"utils.py": "WHO = 'one'\n"}, first)
    lay_out({"utils.py": "WHO = 'two'\n"}, second)
    with layout_on_path(first, ["utils.py"]):
        import utils  # type: ignore[import-not-found]

        assert utils.WHO == "one"
    assert "utils" not in sys.modules and str(first) not in sys.path
    with layout_on_path(second, ["utils.py"]):
        import utils  # type: ignore[import-not-found, no-redef]

        assert utils.WHO == "two"
    assert "utils" not in sys.modules


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("files: [{name: s.py, source: '@SUBMISSION@'}]\nlang: cu\n", "only Python tasks"),
        ("files: [{name: s.py, source: '@SUBMISSION@'}]\nmulti_gpu: true\n", "multi_gpu"),
        ("files: [{name: r.py, source: r.py}]\n", "no entry has source @SUBMISSION@"),
        ("files: [{name: s.py, source: '@SUBMISSION@'}, {name: s.py, source: '@SUBMISSION@'}]\n", "listed twice"),
        ("files: [{name: ../s.py, source: '@SUBMISSION@'}]\n", "outside the problem's directory"),
        ("files: [{name: s.py, source: '@SUBMISSION@'}]\ntest_timeout: -1\n", "test_timeout: seconds > 0"),
        ("files: [{name: s.py, source: '@SUBMISSION@'}]\nranking_by: best\n", "ranking_by 'best'"),
        ("files: [{name: s.py, source: '@SUBMISSION@'}]\ntests: [3]\n", "tests: a list of mappings"),
        ("- just a list\n", "a task.yml is a mapping"),
        ("files: [{name: s.py, source: '@SUBMISSION@'}, {name: u.py, source: ../nope.py}]\n", "not a file"),
    ],
)
def test_a_task_yml_that_cannot_run_is_a_clear_error(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "task.yml").write_text(text)
    (tmp_path / "r.py").write_text("")
    with pytest.raises((TaskError, FileNotFoundError), match=error) as info:
        read_task(tmp_path / "task.yml", "def custom_kernel(d): return d\n")
    assert str(tmp_path / "task.yml") in str(info.value)


def test_a_directory_without_task_yml_or_of_another_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"without a task\.yml"):
        job(tmp_path, SCALE / "correct.py")
    with pytest.raises(ValueError, match=r"gpumode pair|is a GPU MODE task, but the format asked for is 'kernelbench'"):
        job(SCALE, SCALE / "correct.py", format="kernelbench")


# -- end to end, on the tests' pool ---------------------------------------------------------------


def _evaluate(pool: PoolProc, reference: Path, candidate: Path, **kw: Any) -> Evaluation:
    kw.setdefault("timeouts", LIMITS)
    return evaluate(reference, candidate, pool=pool.client, **kw)


def test_a_published_problem_gets_its_verdicts(eval_pool: PoolProc) -> None:
    ok = _evaluate(eval_pool, SCALE, SCALE / "correct.py", seed=5)
    assert ok.verdict == "correct", ok.summary
    assert [c.spec for c in ok.tests] == ["size: 127; seed: 4242", "size: 1024; seed: 5236"]
    assert len(ok.benchmarks) == 2 and ok.runtime > 0 and ok.speedup is not None
    assert _evaluate(eval_pool, SCALE, SCALE / "uses_utils.py", measure=False).verdict == "correct"
    wrong = _evaluate(eval_pool, SCALE, SCALE / "wrong.py")
    assert wrong.verdict == "incorrect" and any(c.passed is False for c in wrong.tests), wrong.summary
    slow = _evaluate(eval_pool, SCALE, SCALE / "slow.py", seed=5)
    assert slow.verdict == "correct" and slow.speedup is not None and slow.speedup < 0.5, slow.summary
    last = _evaluate(eval_pool, ROWSUM / "reference.py", ROWSUM / "correct.py")
    assert last.verdict == "correct" and [c.spec for c in last.benchmarks] == ["rows: 1024; cols: 512; seed: 22"]
    assert _evaluate(eval_pool, ROWSUM, ROWSUM / "wrong.py").verdict == "incorrect"


# -- a problem gathered into one directory, as a runner lays it out -------------------------------


def _gather(into: Path, task: Path, *, with_utils: bool = True) -> Path:
    """``task``'s files in one directory (task.yml, reference.py, task.py and, unless told not to,
    utils.py beside them), its task.yml unchanged: it still says ``../utils.py``."""
    into.mkdir()
    for f in task.iterdir():
        if f.is_file():
            (into / f.name).write_text(f.read_text())
    if with_utils:
        (into / "utils.py").write_text((TASKS / "utils.py").read_text())
    return into


def test_a_problem_gathered_into_one_directory_reads_utils_from_beside_it(tmp_path: Path) -> None:
    flat = _gather(tmp_path / "rowsum", ROWSUM)
    j = job(flat, flat / "correct.py")
    assert j.files["utils.py"] == (TASKS / "utils.py").read_text()
    assert set(j.files) == {"submission.py", "task.py", "utils.py", "reference.py"}
    # the published layout still reads ../utils.py first, where it is
    assert job(ROWSUM, ROWSUM / "correct.py").files == j.files


def test_utils_neither_published_nor_beside_is_a_clear_error(tmp_path: Path) -> None:
    flat = _gather(tmp_path / "rowsum", ROWSUM, with_utils=False)
    with pytest.raises(FileNotFoundError, match=r"'utils\.py' comes from '\.\./utils\.py'.*no utils\.py lies beside"):
        job(flat, flat / "correct.py")


def test_the_runners_own_harness_may_be_missing_any_other_listed_file_may_not(tmp_path: Path) -> None:
    numerics = TASKS / "gm_task_numerics"
    j = job(numerics, numerics / "correct.py")  # eval.py (config: main) is nowhere: left out
    assert "eval.py" not in j.files and "reference.py" in j.files
    flat = _gather(tmp_path / "numerics", numerics)
    (flat / "task.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"'task\.py' comes from 'task\.py'"):
        job(flat, flat / "correct.py")


def test_a_gathered_problem_gets_the_verdicts_of_the_published_one(eval_pool: PoolProc, tmp_path: Path) -> None:
    flat = _gather(tmp_path / "rowsum", ROWSUM)
    ok = _evaluate(eval_pool, flat, flat / "correct.py", measure=False)
    assert ok.verdict == "correct", ok.summary
    assert _evaluate(eval_pool, flat / "reference.py", flat / "wrong.py", measure=False).verdict == "incorrect"


# -- the numerics GPU MODE decides under ---------------------------------------------------------


def test_both_sides_compute_in_ieee_fp32_as_gpu_mode_decides(eval_pool: PoolProc) -> None:
    """The reference's check passes only if the judge (its reference and check) and the candidate
    run with cuDNN's and cuBLAS's TF32 off and float32 matmuls at their highest precision."""
    numerics = TASKS / "gm_task_numerics"
    ok = _evaluate(eval_pool, numerics, numerics / "correct.py")
    assert ok.verdict == "correct", ok.summary
    # a submission may still set a switch for itself, as under GPU MODE's runner
    tf32 = _evaluate(eval_pool, numerics, numerics / "tf32.py", measure=False)
    assert tf32.verdict == "incorrect" and "(1.0, 0.0, 1.0)" in (tf32.metadata.get("correctness_issue") or ""), (
        tf32.summary
    )
    # and the judge's worker keeps its own switches for the next job (a KernelBench pair: torch's)
    kb = _evaluate(eval_pool, PROBLEMS / "kb_scaled_add" / "reference.py", PROBLEMS / "kb_scaled_add" / "correct.py")
    assert kb.verdict == "correct", kb.summary


def test_numerics_applied_for_a_block_are_put_back_after_it() -> None:
    import torch

    from krex_lab.evaluate.numerics import applied, current, settings_for

    assert settings_for("kernelbench") is None
    before = current()
    torch.backends.cudnn.allow_tf32 = True
    try:
        with applied(settings_for("gpumode")):
            now = current()
            assert now is not None and now["cudnn_allow_tf32"] is False
            assert now["float32_matmul_precision"] == "highest"
        after = current()
        assert after is not None and after["cudnn_allow_tf32"] is True
    finally:
        assert before is not None
        torch.backends.cudnn.allow_tf32 = before["cudnn_allow_tf32"]


@pytest.mark.parametrize(
    ("answer", "passed"),
    [
        ("", True),
        ("mismatch found! 3 elements", False),
        ([], True),
        (["Number of mismatched elements: 2", "ERROR AT (0,)"], False),
        (None, True),
        (False, True),
        (True, False),
        ((True, ""), True),
        ((False, "off by 1"), False),
    ],
)
def test_check_implementations_answer_is_read_as_gpu_modes_harness_reads_it(answer: Any, passed: bool) -> None:
    """reference-kernels' eval.py: a tuple is (good, message); anything else is the error itself,
    passed when falsy (pmpp's match_reference answers '' or a message; a bare True is an error)."""
    from krex_lab.evaluate.judge.problems import _verdict

    ok, message = _verdict(answer)
    assert ok is passed
    assert bool(message) is (not passed)
