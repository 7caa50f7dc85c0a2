"""The batch engine's scheduling alone: its evaluations replaced by timed stand-ins, the GPUs'
memory by a reader of set figures (the engine's own code, threads and lock are real)."""

from __future__ import annotations

import io
import threading
import time

from krex_lab.evaluate.admission import GpuMemory, MemoryPolicy
from krex_lab.evaluate.many import _Engine
from krex_lab.evaluate.options import EvaluateOptions
from krex_lab.evaluate.pairs import Pair, Progress
from krex_lab.evaluate.result import Evaluation

GiB = 1 << 30


class Engine(_Engine):
    """Each evaluation sleeps ``seconds[candidate]`` (else ``seconds[reference]``) and says where it
    ran and when."""

    def __init__(self, pairs: list[Pair], gpus: list[int], total: int, seconds: dict[str, float], **kw: object) -> None:
        self.seconds = seconds
        self.spans: list[tuple[str, int | None, float, float]] = []
        self.given: list[tuple[int, int | None]] = []
        self.lock = threading.Lock()
        out: list[object] = []
        policy = MemoryPolicy(poll_s=0.02, **kw)  # type: ignore[arg-type]
        super().__init__(
            pairs,
            jobs=len(pairs),
            defaults=EvaluateOptions(),
            pool=None,
            emit=out.append,
            bar=Progress(len(pairs), io.StringIO()),
            policy=policy,
            gpus=gpus,
        )
        self.out = out
        self.admission.read = lambda: {g: GpuMemory(total, 0) for g in gpus}
        self.admission.refresh(force=True)

    def _evaluate(self, pair: Pair, gpu: int | None, need: int, free: int | None, sets: int = 0) -> Evaluation:
        self.given.append((need, free))
        t0 = time.monotonic()
        time.sleep(self.seconds.get(pair.candidate, self.seconds.get(pair.reference, 0.0)))
        with self.lock:
            self.spans.append((pair.reference, gpu, t0, time.monotonic()))
        return Evaluation(format="kernelbench", verdict="correct", summary="", reference="", candidate="")


def _pairs(refs: list[str]) -> list[Pair]:
    return [Pair(index=i, line=i, reference=r, candidate=f"c{i}") for i, r in enumerate(refs)]


def test_pairs_spread_over_every_gpu() -> None:
    engine = Engine(_pairs(["a"] * 8), gpus=list(range(8)), total=80 * GiB, seconds={"a": 0.3})
    engine.run()
    assert len(engine.out) == 8
    assert sorted(g for _, g, _, _ in engine.spans) == list(range(8))  # one on each GPU, at once


def test_a_pair_that_waited_too_long_is_not_starved_by_smaller_ones() -> None:
    # two small ones fit at a time, the big one alone; the small ones end staggered (c0 first), so one
    # of them always runs and the big one never fits beside it
    refs = ["small", "small", "big", *["small"] * 8]
    seconds = {"small": 0.2, "big": 0.05, "c0": 0.1}
    engine = Engine(_pairs(refs), gpus=[0], total=10 * GiB, seconds=seconds, reserve_mb=0, max_wait_s=0.3)
    engine.footprints = {"small||None|None": 4 * GiB, "big||None|None": 9 * GiB}  # measured before
    engine.run()
    assert len(engine.out) == len(refs)
    (big,) = [s for s in engine.spans if s[0] == "big"]
    smalls = [s for s in engine.spans if s[0] == "small"]
    assert not any(s[2] < big[3] and s[3] > big[2] for s in smalls), "the big one ran alone"
    assert any(s[2] >= big[3] for s in smalls), "smaller ones waited behind it"
    assert big[2] - min(s[2] for s in smalls) < 2.0, "it was not starved"


def test_a_pair_that_fits_with_fewer_input_sets_starts_now_with_them() -> None:
    # 10 GiB, 3 held by a neighbour; each pair takes 4 GiB, 3 of them its timed rounds' input sets:
    # the first fits whole, the second fits with its sets shrunk to the 3 GiB left, and starts at
    # once instead of waiting for the first (nothing else of its own frees memory sooner)
    engine = Engine(_pairs(["a", "a"]), gpus=[0], total=10 * GiB, seconds={"a": 0.4}, reserve_mb=0, max_wait_s=60)
    engine.admission.read = lambda: {0: GpuMemory(10 * GiB, 3 * GiB)}
    engine.admission.refresh(force=True)
    engine.footprints = {"a||None|None": 4 * GiB}
    engine.input_sets = {"a||None|None": 3 * GiB}
    engine.run()
    (s1, s2) = sorted(engine.spans, key=lambda s: s[2])
    assert s2[2] < s1[3], "the second started while the first ran"
    assert sorted(engine.given) == [(4 * GiB, 3 * GiB), (4 * GiB, 7 * GiB)], engine.given
    # the second's sets: 3 GiB for two rounds' worth less the 1 GiB it lacks, 1 GiB a round
    assert engine.admission.budget_mb(4 * GiB, 3 * GiB, 3 * GiB) == 1024


def test_a_pair_whose_one_set_is_larger_than_the_room_left_waits() -> None:
    # the same, but one input set alone is 1.5 GiB (two rounds' worth: all 3 GiB of its sets): however
    # little the judge is given for its sets, a round holds one, so the second cannot start short
    engine = Engine(_pairs(["a", "a"]), gpus=[0], total=10 * GiB, seconds={"a": 0.4}, reserve_mb=0, max_wait_s=60)
    engine.admission.read = lambda: {0: GpuMemory(10 * GiB, 3 * GiB)}
    engine.admission.refresh(force=True)
    engine.footprints = {"a||None|None": 4 * GiB}
    engine.input_sets = {"a||None|None": 3 * GiB}
    engine.sets_least = {"a||None|None": 3 * GiB}
    engine.run()
    (s1, s2) = sorted(engine.spans, key=lambda s: s[2])
    assert s2[2] >= s1[3], "the second waited for the first"


def test_a_footprint_counts_one_set_at_least_and_two_rounds_of_them() -> None:
    from krex_lab.evaluate.judge.footprint import figures

    # small sets: the judge's 512 MiB budget a round, and the next round's made before it is freed
    small = figures("cuda", peak=GiB // 4, per_set=1 << 20, max_sets=128)
    assert int(small["input_sets"]) == 2 * 128 * (1 << 20) and int(small["input_sets_least"]) == 2 << 20
    # one set of 2 GiB (three vectors of 2^26 floats, their pristine copies and output): over the budget,
    # a round still holds it
    large = figures("cuda", peak=GiB, per_set=2 * GiB, max_sets=128)
    assert int(large["input_sets"]) == 4 * GiB == int(large["input_sets_least"])
    assert int(large["footprint"]) == 2 * GiB + 4 * GiB + 2 * GiB


def test_the_judges_measured_peak_raises_the_footprint() -> None:
    # the estimate said 2 GiB; the judge's side took 5 GiB as it ran, the candidate is allowed 1: the
    # next pairs of the problem are admitted at 6 GiB
    class Measured(Engine):
        def _evaluate(self, pair: Pair, gpu: int | None, need: int, free: int | None, sets: int = 0) -> Evaluation:
            ev = super()._evaluate(pair, gpu, need, free, sets)
            ev.metadata["memory"] = {
                "footprint": str(2 * GiB),
                "judge_peak": str(5 * GiB),
                "candidate_allowance": str(GiB),
            }
            return ev

    engine = Measured(_pairs(["a"]), gpus=[0], total=10 * GiB, seconds={"a": 0.01}, reserve_mb=0)
    engine.run()
    assert engine.footprints == {"a||None|None": 6 * GiB}
