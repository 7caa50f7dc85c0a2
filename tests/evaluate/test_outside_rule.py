"""The rule that decides a case's figure (krex_lab.evaluate.judge.clock.OutsideClock.figure): the
outside figure is the brackets less the calibrated round trips; the candidate's own figure stays
on a GPU only where it is not below that by more than max(5 %, 1 us a call); on a CPU the figure
is always the judge's, the cgroup's CPU time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from krex_lab.evaluate.judge.clock import OutsideClock, Scheduling


def _clock(
    device: str, rounds: list[tuple[int, float]], wall: dict[int, float], cpu: tuple[float, float] = (0, 0)
) -> OutsideClock:
    judge = SimpleNamespace(device=device, opts=SimpleNamespace(limit=lambda phase: 30.0), group=None)
    clock = OutsideClock(judge, None)
    clock.rounds = rounds
    clock.wall = wall
    clock.cpu = {n: t / 10 for n, t in wall.items()}  # the twin's harness CPU: a tenth of its wall
    clock.cpu0, clock.cpu1 = cpu
    return clock


# two rounds of 100 calls, 12 ms each; the twin: 1.0 ms for a 1-call round, 3.0 ms for 100 calls
ROUNDS = [(100, 0.012), (100, 0.012)]
TWIN = {1: 0.001, 100: 0.003}


def test_the_outside_figure_is_the_brackets_less_the_calibrated_round_trips() -> None:
    fig = _clock("cuda", ROUNDS, TWIN).figure([90.0] * 200, "kernelbench-events", "")
    # per call 0.02 ms, per round 0.98 ms: (24 ms - 2 * 3 ms) / 200 calls = 90 us
    assert fig.outside == pytest.approx(90.0)
    assert fig.overhead == pytest.approx(2000 / 99 / 1000 * 1000, rel=1e-6)  # us a call
    assert fig.roundtrip == pytest.approx(1000.0)  # the best one-call round trip
    assert fig.believed and fig.stats.mean == 90.0 and fig.method == "kernelbench-events" and not fig.text


@pytest.mark.parametrize(
    ("inprocess", "believed"),
    [(86.0, True), (85.6, True), (85.4, False), (9.0, False), (400.0, True)],
)
def test_the_in_process_figure_stays_within_five_percent_below(inprocess: float, believed: bool) -> None:
    fig = _clock("cuda", ROUNDS, TWIN).figure([inprocess] * 200, "kernelbench-events", "forward")
    assert fig.believed is believed
    if believed:
        assert fig.stats.mean == inprocess
    else:
        assert fig.stats.mean == pytest.approx(90.0) and fig.stats.std == 0
        assert fig.method.startswith("outside (") and "90.000 us" in fig.text


def test_a_replaced_figure_shows_the_spread_the_judge_saw_round_by_round() -> None:
    # three rounds of 100 calls at 80, 90 and 100 us a call (each bracket with the 3 ms round trip)
    rounds = [(100, 0.003 + 0.0001 * v) for v in (80, 90, 100)]
    fig = _clock("cuda", rounds, TWIN).figure([9.0] * 300, "kernelbench-events", "forward")
    assert not fig.believed
    assert fig.stats.mean == pytest.approx(90.0, abs=1e-3)
    assert fig.stats.min == pytest.approx(80.0, abs=1e-3) and fig.stats.max == pytest.approx(100.0, abs=1e-3)
    assert fig.stats.std == pytest.approx(8.18, abs=0.01) and fig.stats.num_trials == 300
    # a CPU's replaced figure keeps the candidate's spread, scaled to the judge's figure
    cpu = _clock("cpu", ROUNDS, TWIN, cpu=(10.0, 10.25)).figure([1.0, 3.0] * 100, "host-clock", "")
    assert not cpu.believed and cpu.stats.max == pytest.approx(3 * cpu.stats.min) and cpu.stats.std > 0


def test_a_microsecond_a_call_is_the_least_disagreement_that_counts() -> None:
    # a 4 us call: 5 % is 0.2 us, the floor 1 us
    rounds = [(100, 0.0004 + 0.003 - 0.00002 * 100 + 0.00002 * 100)]
    fig = _clock("cuda", rounds, TWIN).figure([3.1] * 100, "kernelbench-events", "")
    assert fig.outside == pytest.approx(4.0)
    assert fig.believed
    assert not _clock("cuda", rounds, TWIN).figure([2.9] * 100, "kernelbench-events", "").believed


def test_a_cpus_figure_is_the_cgroups_cpu_time_never_the_candidates_clock() -> None:
    # 200 calls used 0.25 s of CPU; the twin's harness: 0.1 ms a round, 0.002 ms a call
    clock = _clock("cpu", ROUNDS, TWIN, cpu=(10.0, 10.25))
    fig = clock.figure([1.0] * 200, "host-clock", "")  # a forged clock: 1 us a call
    expected = (0.25 - 2 * 0.0003) / 200 * 1e6
    assert fig.outside == pytest.approx(expected) and fig.stats.mean == pytest.approx(expected, abs=1e-3)
    assert not fig.believed and fig.method == "host-clock" and "CPU time of its cgroup" in fig.text
    assert fig.wall == pytest.approx(90.0)
    honest = _clock("cpu", ROUNDS, TWIN, cpu=(10.0, 10.25)).figure([1300.0] * 200, "host-clock", "")
    # a slower wall clock (a shared host's waits) keeps its spread, scaled to the judge's figure
    assert honest.believed and honest.stats.mean == pytest.approx(expected, abs=1e-3)


def test_calibration_noise_above_the_bracket_falls_back_to_the_uncorrected_bracket() -> None:
    fig = _clock("cuda", [(100, 0.002)], TWIN).figure([1.0] * 100, "kernelbench-events", "")
    assert fig.outside == pytest.approx(20.0)  # 2 ms over 100 calls: never 0, never negative


def test_the_judges_scheduling_is_put_back_and_reported() -> None:
    import os

    sched = Scheduling()
    if os.geteuid() != 0:
        pytest.skip("raising a priority back needs root")
    os.setpriority(os.PRIO_PROCESS, 0, sched.nice + 5)
    try:
        found = sched.reset()
        assert found and "reniced" in found[0] and "(undone)" in found[0]
        assert os.getpriority(os.PRIO_PROCESS, 0) == sched.nice
        assert sched.reset() == []
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, sched.nice)
