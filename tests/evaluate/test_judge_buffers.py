"""The judge's data path against hostile candidates (tests/evaluate/judge_cheats/), each beside
its honest twin (the same source with ``CHEAT = False``), which stays ``correct``:

* lazy outputs (a tuple subclass, a dict of tensor subclasses, an ndarray subclass) are refused
  by name: outputs land in the judge's buffers, by exact type, inside the call;
* a rewritten reply path that answers first and computes after gets no ``correct``;
* timed calls that write into their inputs are rejected as the check phase rejects them;
* a round's sets are not reachable from one another's memory, nor visible before their round;
* a near-constant output on a problem with tiny values is not ``correct``;
* every set's seed is drawn alone: none follows from another.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from tests.evaluate.helpers import LIMITS
from tests.evaluate.helpers import PROBLEMS as TEST_PROBLEMS
from tests.evaluate.redteam import PROBLEMS as REDTEAM_PROBLEMS
from tests.evaluate.redteam import twin
from tests.support.pool import PoolProc

CHEATS = Path(__file__).parent / "judge_cheats"
#: what a forged time is off by against a shared CPU's noise
SLACK = 3.0

Judge = Callable[..., tuple[Evaluation, Evaluation]]


def _problem(name: str) -> Path:
    for base in (REDTEAM_PROBLEMS, TEST_PROBLEMS):
        if (base / name / "reference.py").is_file():
            return base / name / "reference.py"
    raise LookupError(name)


@pytest.fixture
def judge(eval_pool: PoolProc) -> Judge:
    """``judge(problem, cheat)``: (the honest twin's evaluation, the cheat's); the twin must be
    ``correct``."""

    def go(problem: str, cheat: str, **options: object) -> tuple[Evaluation, Evaluation]:
        options = {"timeouts": LIMITS, "perf_trials": 30, **options}
        source = (CHEATS / f"{cheat}.py").read_text()
        honest = evaluate(_problem(problem), twin(source), pool=eval_pool.client, **options)
        assert honest.verdict == "correct", f"the honest twin of {cheat}: {honest.summary}"
        ev = evaluate(_problem(problem), CHEATS / f"{cheat}.py", pool=eval_pool.client, **options)
        return honest, ev

    return go


def _forged(ev: Evaluation, honest: Evaluation) -> str:
    if ev.verdict == "correct" and ev.runtime < honest.runtime / SLACK:
        return f"{ev.summary}; its honest twin: {honest.summary}"
    return ""


def _not_forged(judge: Judge, problem: str, cheat: str, ev: Evaluation, honest: Evaluation) -> None:
    """A forged time is 10-1000x off; a busy shared host can slow an honest twin past the slack
    now and then (135 us against 32 us, once): a forgery counts when both, judged again, show it
    again."""
    if why := _forged(ev, honest):
        honest2, ev2 = judge(problem, cheat)
        assert not (again := _forged(ev2, honest2)), f"{why}; again: {again}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("problem", "cheat", "named"),
    [
        ("kb_mm_tanh", "lazy_tuple_subclass", "LazyTuple (a subclass of builtins.tuple)"),
        ("kb_mm_tanh", "lazy_dict_values", "Lazy (a subclass of torch.Tensor)"),
        ("gm_np_tanh", "lazy_ndarray_subclass", "Lazy (a subclass of numpy.ndarray)"),
    ],
)
def test_a_lazy_output_is_refused_by_name(judge: Judge, problem: str, cheat: str, named: str) -> None:
    _, ev = judge(problem, cheat)
    assert ev.verdict == "rejected", ev.summary
    assert named in ev.metadata["rejected"]["output_type"]


@pytest.mark.timeout(300)
def test_a_reply_path_rewritten_to_answer_first_gets_no_correct(judge: Judge) -> None:
    _, ev = judge("kb_mm_tanh", "reply_after_answer")
    assert ev.verdict in ("incorrect", "rejected"), ev.summary


@pytest.mark.timeout(300)
def test_a_timed_call_that_writes_into_its_input_is_rejected(judge: Judge) -> None:
    _, ev = judge("kb_mm_tanh", "timed_input_write")
    assert ev.verdict == "rejected", ev.summary
    assert "inputs_modified" in ev.metadata["rejected"]
    assert "a timed call" in ev.metadata["rejected"]["inputs_modified"]


@pytest.mark.timeout(300)
def test_one_call_reaches_no_other_set_of_its_round(judge: Judge) -> None:
    honest, ev = judge("kb_add3", "batch_round")
    assert "krex-saw" not in (ev.output or ""), ev.output
    _not_forged(judge, "kb_add3", "batch_round", ev, honest)


@pytest.mark.timeout(300)
def test_a_rounds_inputs_are_not_visible_before_the_round(judge: Judge) -> None:
    _, ev = judge("kb_add3", "refill_watcher")
    assert "krex-saw" not in (ev.output or ""), ev.output
    assert ev.verdict == "rejected", ev.summary  # its thread, left running past the round
    assert "threads_left" in ev.metadata["rejected"]


@pytest.mark.timeout(300)
def test_a_near_constant_output_under_a_loose_atol_is_not_correct(judge: Judge) -> None:
    _, ev = judge("kb_tiny_out", "near_constant_tiny")
    assert ev.verdict == "incorrect", ev.summary
    assert "a tenth of the reference's spread" in ev.metadata["correctness_issue"]


def test_no_seed_follows_from_another() -> None:
    """The seeds of one evaluation's sets: no step between two is repeated or small (a sequence
    from one secret base gives every later set away), and a given seed reproduces them all."""
    from krex_lab.evaluate.job import build_job

    seeds = _draw(build_job(_problem("kb_mm_tanh"), CHEATS / "timed_input_write.py"), 64)
    steps = {b - a for a, b in itertools.pairwise(seeds)}
    assert len(steps) == len(seeds) - 1, "two steps between seeds are the same: a sequence"
    assert all(abs(s) > 1 << 20 for s in steps), "a seed lies next to the one before it"
    given = build_job(_problem("kb_mm_tanh"), CHEATS / "timed_input_write.py", seed=7)
    assert _draw(given, 8) == _draw(given, 8)


def _draw(job: object, n: int) -> list[int]:
    from krex_lab.evaluate.judge.session import Judge as JudgeSession

    judge = JudgeSession(job)  # type: ignore[arg-type]
    return [judge.seed() for _ in range(n)]


FOREIGN_MEMORY = """
import ctypes
import torch
from torch import nn

KEEP = []


class ModelNew(nn.Module):
    def forward(self, a, b):
        answer = torch.tanh(torch.mm(a, b))
        raw = (ctypes.c_float * answer.numel())()  # memory no channel could hand over as it is
        KEEP.append(raw)
        out = torch.frombuffer(raw, dtype=torch.float32).view(answer.shape[1], answer.shape[0]).t()
        out.copy_(answer)
        return out  # a transposed view: not contiguous either
"""


@pytest.mark.timeout(300)
def test_an_output_in_memory_no_channel_shares_is_judged_as_any_other(eval_pool: PoolProc) -> None:
    """The CPU's twin of a GPU output torch cannot share by IPC: the value is copied into the
    judge's buffer, whatever memory it lies in."""
    ev = evaluate(_problem("kb_mm_tanh"), FOREIGN_MEMORY, pool=eval_pool.client, timeouts=LIMITS, perf_trials=10)
    assert ev.verdict == "correct", ev.summary


def test_deliver_takes_exact_types_and_copies_into_the_buffers() -> None:
    import numpy as np
    import torch

    from krex_lab.evaluate.candidate.outputs import OutputMismatch, OutputRejected, deliver

    buf = torch.full((2, 3), float("nan"))
    answer = torch.arange(6.0, dtype=torch.float64).view(3, 2).t()  # another float width, strided
    assert deliver((answer,), [buf], []) == ([], [])
    assert torch.equal(buf, answer.float())
    assert deliver({"x": answer, "n": np.int64(3)}, [buf, None], []) == ([3], [])

    class Sub(torch.Tensor):
        pass

    class SubTuple(tuple):
        pass

    for bad in (answer.as_subclass(Sub), SubTuple((answer,)), np.zeros((2, 3)), {"x": object()}):
        with pytest.raises(OutputRejected):
            deliver(bad, [buf], [])
    with pytest.raises(OutputMismatch):
        deliver(torch.zeros(3, 2), [buf], [])  # shape
    with pytest.raises(OutputMismatch):
        deliver(torch.zeros(2, 3, dtype=torch.int32), [buf], [])  # kind of dtype
    with pytest.raises(OutputMismatch):
        deliver((answer, answer), [buf], [])  # count
    x = torch.zeros(10)
    spans = [(x.data_ptr(), x.data_ptr() + 40, 0)]
    assert deliver(x[2:8].view(2, 3), [buf], spans) == ([], [0])
    assert deliver(torch.zeros(2, 3), [buf], spans) == ([], [])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("answer", ["returned", "timed"])
def test_a_malformed_answer_is_refused_in_words(eval_pool: PoolProc, answer: str) -> None:
    """A body of the wrong shape (a number for a list, a word for the samples) is a ``rejected``
    verdict that names the operation and the field; the judge is not hurt by it: the next
    evaluation on the same pool is judged as ever."""
    source = (CHEATS / "malformed_answer.py").read_text().replace('FORGE = "returned"', f"FORGE = {answer!r}")
    ev = evaluate(_problem("kb_mm_tanh"), source, pool=eval_pool.client, timeouts=LIMITS, perf_trials=30)
    assert ev.verdict == "rejected", ev.summary
    said = ev.metadata["rejected"]["protocol"]
    assert f"{answer!r} message's body is malformed" in said, said
    again = evaluate(_problem("kb_mm_tanh"), twin(source), pool=eval_pool.client, timeouts=LIMITS, perf_trials=30)
    assert again.verdict == "correct", again.summary
