"""benchmarks/agent/agent_study.py against a real fake-backend arbiter: a small sweep, real properties."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from krex_lab.pytest_plugin import ArbiterProc, running_arbiter

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "benchmarks" / "agent" / "agent_study.py"
#: the small sweep's measured window and warm-up per point (s): 6 points, so each second here is 6
WINDOW, WARMUP = 5.0, 2.0


def _run_study(tmp_path_factory: pytest.TempPathFactory, gpus: int, args: list[str]) -> dict[str, Any]:
    """``agent_study.py --use-arbiter ARGS`` on an arbiter of ``gpus`` fake GPUs; its JSON, and its
    stdout as ``stdout``."""
    tmp = tmp_path_factory.mktemp("agents")
    mp = pytest.MonkeyPatch()
    arbiters = running_arbiter(tmp, mp, gpus=gpus)
    arb: ArbiterProc = next(arbiters)
    try:
        out = tmp / "study.json"
        scratch = tmp / "tmp"  # its TMPDIR: what it leaves there is seen
        scratch.mkdir()
        cmd = [sys.executable, str(STUDY), "--use-arbiter", *args, "--out", str(out)]
        env = {**arb.env(), "TMPDIR": str(scratch)}
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        data: dict[str, Any] = json.loads(out.read_text())
        data["stdout"] = r.stdout
        data["left_in_tmp"] = sorted(p.name for p in scratch.glob("krex-*"))
        return data
    finally:
        next(arbiters, None)
        mp.undo()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_study(
        tmp_path_factory,
        1,
        [
            "--agents",
            "4",
            "--think-mean",
            "0",
            "--seconds",
            str(WINDOW),
            "--warmup",
            str(WARMUP),
            "--launch",
            "warm",
            "--kernels",
            "vector_add,transpose",
            "--p-wrong",
            "0.3",
            "--freeze",
            "on,off",
        ],
    )


@pytest.mark.timeout(220)
def test_says_the_gpu_phases_are_simulated(study: dict[str, Any]) -> None:
    assert study["simulated_gpu_phases"] is True
    assert "SIMULATED" in study["stdout"]
    assert all(r.get("simulated") for p in study["points"] for r in p["records"] if r["status"] != "error")


def test_the_study_leaves_nothing_in_tmp(study: dict[str, Any]) -> None:
    assert study["left_in_tmp"] == []


def test_every_evaluation_returned_exactly_once(study: dict[str, Any]) -> None:
    for p in study["points"]:
        assert p["agent_exit_codes"] == [0] * p["agents"]
        keys = [(r["agent"], r["seq"]) for r in p["records"]]
        assert len(keys) == len(set(keys)) == p["evaluations_started"] > 0
        for agent in {a for a, _ in keys}:  # no gap: each agent's evaluations are 0..n-1
            seqs = sorted(s for a, s in keys if a == agent)
            assert seqs == list(range(len(seqs)))
        assert p["returned_exactly_once"]
        assert not [r for r in p["records"] if r["status"] == "error"]


def test_no_two_regions_on_a_gpu_overlap(study: dict[str, Any]) -> None:
    for p in study["points"]:
        regions = sorted((r["region"]["granted"], r["region"]["released"]) for r in p["records"] if r.get("region"))
        if p["mode"] == "none":
            assert not regions
            continue
        assert len(regions) >= 3
        for (_, end), (start, _) in itertools.pairwise(regions):
            assert start >= end
        assert p["region_overlaps"] == 0
    assert study["arbiter_history"]["regions"] >= sum(p["regions"]["n"] for p in study["points"] if p["regions"])
    assert study["arbiter_history"]["overlapping_pairs"] == 0


def test_command_mode_regions_hold_the_compile_and_region_mode_regions_do_not(study: dict[str, Any]) -> None:
    # What makes region mode faster, read off each evaluation's own timestamps (the rates are the
    # benchmark's figures, not this test's): a command-mode region spans the compile, a region-mode
    # region is asked for only once the compile is done.
    by = {p["mode"]: p for p in study["points"]}
    spans = {m: [r for r in by[m]["records"] if r.get("region") and r.get("compile_s")] for m in ("command", "region")}
    assert spans["command"] and spans["region"], "both modes timed something"
    for r in spans["command"]:
        assert r["region"]["released"] - r["region"]["granted"] >= r["compile_s"], r
    for r in spans["region"]:
        assert r["region"]["requested"] - r["eval_started"] >= r["compile_s"], r


def test_timing_errors_recorded_against_every_alone_run_before_and_after(study: dict[str, Any]) -> None:
    before, after = study["reference"], study["reference_after"]
    assert set(after) == set(before), "the same candidates, alone, after the points"
    for c in before:  # each pass ran each candidate its repeats, on the pool's workers
        assert len(before[c]["runs"]) == len(after[c]["runs"]) == 2
    drift = [abs(after[c]["median_ms"] / before[c]["median_ms"] - 1) * 100 for c in before]
    assert study["reference_drift_pct"]["n"] == len(drift)
    assert study["reference_drift_pct"]["median"] == pytest.approx(statistics.median(drift), abs=1e-3)
    assert study["reference_spread_pct"]["n"] == 4 * len(before)
    for p in study["points"]:
        timed = [r for r in p["records"] if r["status"] == "ok"]
        assert timed
        for r in timed:
            runs = [x["median_ms"] for x in before[r["candidate"]]["runs"] + after[r["candidate"]]["runs"]]
            ref = statistics.median(runs)
            assert math.isclose(r["ref_median_ms"], ref, rel_tol=1e-12)
            assert math.isclose(r["error_pct"], 100 * (r["median_ms"] / ref - 1), rel_tol=1e-9)
            assert r["alone_range_pct"] == pytest.approx(100 * (max(runs) / min(runs) - 1), abs=1e-3)
            # outside the alone runs' range, signed; 0 inside it
            m, lo, hi = r["median_ms"], min(runs), max(runs)
            beyond = 100 * (m / hi - 1) if m > hi else 100 * (m / lo - 1) if m < lo else 0.0
            assert r["beyond_alone_pct"] == pytest.approx(beyond, abs=1e-9)
            assert abs(r["beyond_alone_pct"]) <= abs(r["error_pct"]) + 1e-9, "the median lies inside the range"
        # judged: candidates of 0.1 ms and more alone; steady: their alone runs within 1 % of each other
        judged = [r for r in timed if not r["late"] and r["ref_median_ms"] >= 0.1]
        assert judged, "the fake backend's candidates take a millisecond or so"
        steady = [r for r in judged if r["alone_range_pct"] <= 1.0]
        assert p["error_abs_pct"]["n"] == len(judged)
        assert p["error_abs_pct_steady"]["n"] == len(steady)
        assert set(p["unsteady_alone"]) == {r["candidate"] for r in judged if r not in steady}
        assert p["error_abs_pct_vs_before"]["n"] == p["error_abs_pct"]["n"]
        assert p["error_abs_pct_beyond_alone"]["n"] == len(judged)
        assert p["error_abs_pct_beyond_alone"]["p95"] <= p["error_abs_pct"]["p95"] + 1e-9


def test_throughput_counts_what_returned_in_the_measured_window(study: dict[str, Any]) -> None:
    for p in study["points"]:
        assert p["measure_from"] - p["start_at"] == pytest.approx(WARMUP)
        assert p["until"] - p["measure_from"] == pytest.approx(WINDOW)
        counted = [r for r in p["records"] if p["measure_from"] <= r["done"] <= p["until"]]
        assert p["evaluations_in_window"] == len(counted)
        assert p["evals_per_min"] == round(len(counted) * 60 / WINDOW, 2)
        assert any(r["sent"] < p["measure_from"] for r in p["records"]), "the agents ran before the window"
        queued = sorted(r["eval_started"] - r["sent"] for r in p["records"])
        assert p["queue_s_median"] == pytest.approx(statistics.median(queued), abs=1e-3)
        assert p["queue_s_median"] >= 0
    # and what returned before it is not counted
    early = [r for p in study["points"] for r in p["records"] if r["done"] < p["measure_from"]]
    assert early


def test_regions_say_where_their_acquire_and_release_went(study: dict[str, Any]) -> None:
    for p in study["points"]:
        if p["mode"] == "none":
            continue
        held = [r["region"] for r in p["records"] if r.get("region")]
        assert held
        for region in held:
            steps = region["steps"]
            assert {"drain", "freeze", "isolate", "undo", "unisolate", "thaw"} <= set(steps), steps
            # the acquire's steps lie inside the acquire, the release's inside the undo
            assert (
                steps["drain"] + steps["freeze"] + steps["isolate"] <= region["acquire_s"] + 1e-5
            )  # each rounded to the microsecond
            assert steps["unisolate"] + steps["thaw"] <= steps["undo"] + 1e-5
        medians = p["regions"]["steps_ms_median"]
        for step in ("drain", "freeze", "isolate", "undo"):
            assert medians[step] == pytest.approx(statistics.median(r["steps"][step] for r in held) * 1e3, abs=1e-3)


def test_wrong_candidates_fail_and_correct_ones_pass(study: dict[str, Any]) -> None:
    records = [r for p in study["points"] for r in p["records"]]
    wrong = [r for r in records if r["wrong_on_purpose"]]
    assert wrong, "no wrong candidate was drawn"
    assert all(r["status"] in ("wrong", "compile_error") for r in wrong)
    assert all(r["status"] == "ok" for r in records if not r["wrong_on_purpose"])


def test_freeze_off_points_freeze_nobody_and_are_compared_with_their_twins(study: dict[str, Any]) -> None:
    regions = {
        (p["mode"], p["freeze"]): [r["region"] for r in p["records"] if r.get("region")]
        for p in study["points"]
        if p["mode"] != "none"
    }
    assert set(regions) == {("command", True), ("command", False), ("region", True), ("region", False)}
    for (mode, freeze), held in regions.items():
        assert held, (mode, freeze)
        if freeze:  # four agents, each with its worker: a region froze the others
            assert max(r["frozen"] for r in held) > 0, (mode, held)
        else:
            assert all(r["frozen"] == 0 for r in held), (mode, held)
    assert "region no-freeze" in study["stdout"]
    assert sorted(r["freeze"] for r in study["ratios_region_over_command"]) == [False, True]


def test_each_ratio_comes_with_its_counts_and_an_interval_around_it(study: dict[str, Any]) -> None:
    points = {(p["mode"], p["freeze"]): p for p in study["points"]}
    for r in study["ratios_region_over_command"]:
        region, command = points["region", r["freeze"]], points["command", r["freeze"]]
        assert r["counts"] == [region["evaluations_in_window"], command["evaluations_in_window"]]
        ratio = region["evals_per_min"] / command["evals_per_min"]
        assert r["ratio"] == round(ratio, 2)
        if min(r["counts"]) < 10:  # a handful of gaps says little about their spread
            assert r["interval_95"] is None
            assert f"{r['ratio']}x (no interval (under 10 returns" in study["stdout"]
            continue
        lo, hi = r["interval_95"]
        assert 0 < lo < r["ratio"] < hi
        assert lo * hi == pytest.approx(ratio**2, rel=0.02)  # centred on the ratio, on a log scale
        line = f"{r['ratio']}x (95 % {lo:.2f}-{hi:.2f}; {r['counts'][0]} vs {r['counts'][1]} evaluations)"
        assert line in study["stdout"]


def _point(done: list[float]) -> dict[str, Any]:
    return {"measure_from": 0.0, "until": 100.0, "records": [{"done": t} for t in [-1.0, *done, 101.0]]}


def test_the_interval_is_narrow_for_a_steady_queue_and_a_count_s_for_random_returns() -> None:
    sys.path.insert(0, str(REPO / "benchmarks" / "agent"))
    import agent_reference

    steady = agent_reference.log_rate_se(_point([1.0 + 2.0 * i + (0.1 if i % 2 else 0.0) for i in range(40)]))
    gen = random.Random(3)
    random_ = agent_reference.log_rate_se(_point(list(itertools.accumulate(gen.expovariate(0.5) for _ in range(40)))))
    assert steady is not None and random_ is not None
    assert steady < 0.02  # gaps of 2.1 and 1.9 s: the rate is known to a few percent
    assert 0.5 / math.sqrt(39) < random_ < 1.5 / math.sqrt(39)  # like a count of 40
    # what returned outside the window is not counted: under 10 returns in it there is no interval
    assert agent_reference.log_rate_se(_point([5.0 * i + gen.random() for i in range(1, 10)])) is None
    assert agent_reference.log_rate_se(_point([5.0 * i + gen.random() for i in range(1, 11)])) is not None
    # nor for a point of a run written before its window was recorded
    assert agent_reference.log_rate_se({"records": [{"done": float(t)} for t in range(40)]}) is None


def rescore(path: Path) -> subprocess.CompletedProcess[str]:
    """``agent_reference.py --rescore PATH``, as a user runs it; it must succeed."""
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "agent" / "agent_reference.py"), "--rescore", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r


def test_a_run_written_before_windows_were_recorded_rescores_without_an_interval(tmp_path: Path) -> None:
    old = REPO / "benchmarks" / "results" / "agent_study-nvidia-2026-12-01T2257.json"
    assert "measure_from" not in old.read_text()
    path = tmp_path / old.name
    path.write_text(old.read_text())
    rescore(path)
    (ratio,) = json.loads(path.read_text())["ratios_region_over_command"]
    assert ratio["ratio"] == 2.14 and ratio["counts"] == [30, 14] and ratio["interval_95"] is None


def test_rescoring_a_study_under_the_same_rules_changes_no_figure(study: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({k: v for k, v in study.items() if k != "stdout"}))
    r = rescore(path)
    again = json.loads(path.read_text())
    assert again["rescored"]["min_ms"] == 0.1 and again["rescored"]["steady_pct"] == 1.0
    fields = (
        "error_abs_pct",
        "error_abs_pct_steady",
        "error_abs_pct_beyond_alone",
        "unsteady_alone",
        "error_abs_pct_vs_before",
    )
    for before, after in zip(study["points"], again["points"], strict=True):
        assert {f: after[f] for f in fields} == {f: before[f] for f in fields}
        assert after["error_abs_pct_as_run"] == before["error_abs_pct"]
        assert f"agents {before['agents']:2d}: |error| median {before['error_abs_pct']['median']} %" in r.stdout
    assert again["ratios_region_over_command"] == study["ratios_region_over_command"]


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The study spread over two fake GPUs (``--gpus 2``: agent i on GPU i mod 2)."""
    args = ["--gpus", "2", "--agents", "4", "--think-mean", "0", "--seconds", "6", "--warmup", "2"]
    args += ["--launch", "warm", "--modes", "region", "--kernels", "vector_add"]
    return _run_study(tmp_path_factory, 2, [*args, "--reference-repeats", "1", "--no-reference-after", "--no-plots"])


@pytest.mark.timeout(220)
def test_two_gpus_each_agent_on_its_own_and_regions_one_at_a_time_on_each(two_gpus: dict[str, Any]) -> None:
    (point,) = two_gpus["points"]
    timed = [r for r in point["records"] if r.get("region")]
    assert {r["gpu"] for r in point["records"]} == {0, 1}
    for r in point["records"]:
        assert r["gpu"] == r["agent"] % 2, r
    for r in timed:
        assert r["region"]["gpu"] == r["gpu"], "a region is taken on the agent's own GPU"
    for gpu in (0, 1):
        spans = sorted((r["region"]["granted"], r["region"]["released"]) for r in timed if r["gpu"] == gpu)
        assert spans, f"no region on GPU {gpu}"
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end
    assert two_gpus["arbiter_history"]["overlapping_pairs"] == 0


@pytest.fixture(scope="module")
def kernelbench(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Agents that write KernelBench-format candidates (torch and numba: the fake backend's kinds)
    and submit them through krex_lab.evaluate."""
    args = ["--kernelbench", "--agents", "2", "--think-mean", "0.3", "--seconds", "8", "--warmup", "2"]
    args += ["--launch", "warm", "--modes", "region,none", "--kernels", "04_sigmoid,06_vector_add"]
    return _run_study(tmp_path_factory, 1, [*args, "--p-wrong", "0.4", "--no-plots"])


@pytest.mark.timeout(220)
def test_kernelbench_agents_get_a_verdict_for_every_candidate_they_submit(kernelbench: dict[str, Any]) -> None:
    assert kernelbench["parameters"]["kernelbench"] is True and kernelbench["reference"] == {}
    assert {c["variant"] for c in kernelbench["candidates"]} == {"kb-torch", "kb-numba"}
    assert "no cuda and triton: the fake backend has no GPU" in kernelbench["stdout"]
    verdicts: dict[str, set[str]] = {}
    for p in kernelbench["points"]:
        assert p["agent_exit_codes"] == [0, 0] and p["returned_exactly_once"] and p["evaluations_returned"] > 0
        for r in p["records"]:
            verdicts.setdefault(r["candidate"].split("/", 2)[-1] if r["wrong_on_purpose"] else "right", set()).add(
                r["verdict"]
            )
            assert r["simulated"] is True  # host-clock times: no GPU was timed
        assert p["wrong_on_purpose_passed"] == 0 and p["correct_failed"] == 0, p["statuses"]
    assert verdicts["right"] == {"correct"}
    assert verdicts.get("off", {"incorrect"}) == {"incorrect"}
    assert verdicts.get("typo", {"compile_error"}) == {"compile_error"}
    assert {"off", "typo"} & set(verdicts), "no wrong candidate was drawn"


def test_kernelbench_region_mode_times_in_regions_and_none_mode_does_not(kernelbench: dict[str, Any]) -> None:
    by_mode = {p["mode"]: p for p in kernelbench["points"]}
    timed = [r for r in by_mode["region"]["records"] if r.get("median_ms")]
    assert timed and all(r["region"] and r["region"]["hold_s"] > 0 for r in timed)
    spans = sorted((r["region"]["granted"], r["region"]["released"]) for r in timed)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end
    assert all(r["region"] is None for r in by_mode["none"]["records"])
    assert any(r.get("median_ms") for r in by_mode["none"]["records"])
    assert kernelbench["arbiter_history"]["overlapping_pairs"] == 0


def test_kernelbench_mode_refuses_command_mode_before_starting_anything(tmp_path: Path) -> None:
    cmd = [sys.executable, str(STUDY), "--kernelbench", "--modes", "command", "--out", str(tmp_path / "x.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--modes region,none and --launch warm only" in r.stderr
    assert not (tmp_path / "x.json").exists()
