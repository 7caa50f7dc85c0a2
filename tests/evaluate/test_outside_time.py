"""The figure is the judge's, measured from outside the candidate's process (CPU, fake backend):
an honest candidate's figure is its cgroup's CPU time, and a candidate that renices its judge
and the judge's zygote changes nothing for later candidates. Cheats that move their work where a
clock of their own, or an accounting of their live threads, does not see it (a thread that
exits, a child process, a finalizer, a slowed calibration, a cgroup escape) are judged with the
red-team corpus (tests/evaluate/test_redteam.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.procutil import children
from tests.evaluate.helpers import LIMITS
from tests.evaluate.redteam import twin
from tests.evaluate.redteam.harness import SLACK, Baselines, forged_speed, make_judge
from tests.support.pool import PoolProc

HERE = Path(__file__).parent / "redteam"
PROBLEM = "kb_mm_tanh"
PERF_TRIALS = 30


@pytest.fixture(scope="module")
def baselines() -> Baselines:
    return Baselines()


def _judged(name: str, eval_pool: PoolProc, baselines: Baselines) -> tuple[Evaluation, Evaluation]:
    judge = make_judge(eval_pool, LIMITS, perf_trials=PERF_TRIALS)
    honest = baselines.get(judge, PROBLEM, "honest")
    path = HERE / f"{name}.py"
    honest_twin = judge(PROBLEM, twin(path.read_text()), retime_reference=True)
    assert honest_twin.verdict == "correct", honest_twin.summary
    assert honest.runtime / SLACK <= honest_twin.runtime <= honest.runtime * SLACK, (
        honest_twin.summary,
        honest.summary,
    )
    return honest_twin, judge(PROBLEM, path)


@pytest.mark.timeout(600)
def test_an_honest_candidates_figure_is_its_cgroups_cpu_time(eval_pool: PoolProc, baselines: Baselines) -> None:
    judge = make_judge(eval_pool, LIMITS, perf_trials=PERF_TRIALS)
    ev = baselines.get(judge, PROBLEM, "honest")
    meta = ev.metadata
    assert "cgroup" in str(meta["timing_accounting"]), meta  # root on this machine: a cgroup was made
    assert meta["timing_bound_us"] == [ev.runtime], meta  # the verdict's figure is the judge's
    assert isinstance(meta["timing_roundtrip_us"], list) and meta["timing_roundtrip_us"][0] > 0, meta
    # where each bracket's time went: the candidate's rounds and the twin's, each to its answer and after
    split = str(meta["timing_split_us"])
    rounds = int(str(meta["timed_rounds"]))
    assert "; twin, 1 calls: " in split, split
    shown = re.findall(r"candidate, (\d+) round\(s\) of (\d+) calls: (\d+) \+ (\d+)", split)
    assert sum(int(n) for n, *_ in shown) == rounds and all(int(ask) > 0 for *_, ask, _ in shown), split
    # beside them, what each harness says its calls' host time went to (shown, never a figure)
    said = re.findall(r"its harness says, a call: call ([0-9.]+), deliver ([0-9.]+)", split)
    assert len(said) >= 2 and all(float(c) > 0 for c, _ in said), split
    # and the harness thread's own CPU time over its calls, and its preemptions (where a part
    # slower in one process than in the other went: waiting, or not being run)
    used = re.findall(r"deliver [0-9.]+, cpu ([0-9.]+), preempted ([0-9.]+)", split)
    assert len(used) == len(said) and all(float(c) > 0 for c, _ in used), split
    # the candidate's own figure may sit a few percent off its cgroup's on a loaded host (the verdict
    # then says so in timing_bound): on a CPU the figure is the cgroup's either way, asserted above
    assert ev.verdict == "correct" and "rejected" not in meta, meta
    # no candidate cgroup is left behind
    leftovers = [p for p in Path("/sys/fs/cgroup").rglob("krex-cand-*") if p.is_dir()]
    assert not leftovers, leftovers


@pytest.mark.timeout(600)
def test_a_candidate_that_renices_the_judge_changes_nothing(eval_pool: PoolProc, baselines: Baselines) -> None:
    judge = make_judge(eval_pool, LIMITS, perf_trials=PERF_TRIALS)
    honest = baselines.get(judge, PROBLEM, "honest")
    honest_twin, ev = _judged("judge_renice_zygote", eval_pool, baselines)
    assert forged_speed(ev, honest_twin) is None, ev.summary
    # the sandbox refuses the renice (seccomp: priority of itself alone); where it could not, the
    # judge finds it and rejects the candidate: either way nothing of it is left
    sandboxed = "seccomp" in str(ev.metadata.get("sandbox", "")).split("degraded")[0]
    if not sandboxed:
        assert ev.verdict == "rejected" and "judge_rescheduled" in ev.metadata["rejected"], ev.metadata
    # the judge's nice value is its own again, and so is its zygote's (the next spares' parent)
    for worker in eval_pool.worker_pids():
        for pid in [worker, *children(worker)]:
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert os.getpriority(os.PRIO_PROCESS, int(tid)) == 0, (worker, pid, tid)
    for _ in range(2):  # on both workers: an honest reference time, never the slowed one
        after = judge(PROBLEM, HERE / "problems" / PROBLEM / "honest.py")
        assert after.verdict == "correct", after.summary
        assert after.ref_runtime <= honest.ref_runtime * SLACK, (after.summary, honest.summary)


@pytest.mark.timeout(600)
def test_a_large_case_is_calibrated_on_sets_of_its_own_size(eval_pool: PoolProc) -> None:
    """The reference's own kernel as the candidate, on a benchmark case of 4 Mi values whose test
    cases are tiny: the twin's harness cost (the case's fresh pages touched, its output copied) is
    measured on sets of the timed case's size. Calibrated on the first test case's sets instead
    (1000 values), the twin's delivery of an output cost a thousandth of the candidate's, and that
    cost stayed in the candidate's figure: 0.15-0.22x of its own reference."""
    from tests.evaluate.helpers import PROBLEMS

    scale = PROBLEMS / "gm_vector_scale"
    ev = evaluate(
        scale / "reference.py",
        scale / "same_as_reference.py",
        pool=eval_pool.client,
        benchmarks=["size: 4194304; seed: 12"],
        timeouts={"load": 120.0, "check": 60.0, "time": 120.0},
    )
    assert ev.verdict == "correct", ev.summary
    # What each harness says its delivery of an output (16 MiB copied into the judge's buffers)
    # took, a call: the same work in both, so within a small factor. The figure itself is not
    # held: on the 2-core machine it still carries the candidate's write faults on its output,
    # which the twin's reads do not pay (0.13-0.28x of its own reference in
    # benchmarks/probes/cpu_figures.py's runs), and overlaps what the wrong calibration gave.
    split = ev.metadata["timing_split_us"]
    candidate = [float(x) for x in re.findall(r"candidate, [^;]*?deliver ([\d.]+)", split)]
    twin = {int(n): float(x) for n, x in re.findall(r"twin, (\d+) calls: [^;]*?deliver ([\d.]+)", split)}
    assert candidate and twin, split
    assert max(candidate) <= 8 * twin[max(twin)], (ev.summary, split)


def test_the_calibration_no_op_reads_every_page_of_an_array_that_starts_inside_one() -> None:
    """The twin's no-op pays a round's page faults as a call that reads its inputs does: every page
    an input's values lie in, the last one too when the array starts past a page's first byte."""
    import ctypes
    import mmap

    from krex_lab.evaluate.candidate.process import _read_pages

    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    for pages in (3, 40):  # a byte at a time, and through a buffer (more than 16 pages)
        with mmap.mmap(-1, (pages + 1) * page) as mem:
            view = ctypes.c_char.from_buffer(mem)
            base = ctypes.addressof(view)
            _read_pages(base + 100, pages * page)
            resident = (ctypes.c_ubyte * (pages + 1))()
            assert libc.mincore(ctypes.c_void_p(base), (pages + 1) * page, resident) == 0, ctypes.get_errno()
            assert [r & 1 for r in resident] == [1] * (pages + 1)
            del view
