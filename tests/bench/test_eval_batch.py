"""benchmarks/eval/eval_batch.py in its smallest form on the fake backend: a real arbiter, a real pool,
real `krex eval --batch` and real baseline processes on CPU torch; the JSON's shape and that every
pair got exactly one result each way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "eval" / "eval_batch.py"
PAIRS = ["04_sigmoid/torch", "21_cumsum/torch"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("evalbatch") / "eval_batch.json"
    cmd = [sys.executable, str(SCRIPT), "--backend", "fake", "--problems", "04,21", "--jobs", "2"]
    cmd += ["--perf-trials", "5", "--compile-workers", "2", "--long-ms", "0", "--out", str(out)]
    cmd += ["--foreign", "2", "--foreign-gib", "0.5"]  # beside two foreign processes of 0.5 GiB each
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "OUT"}
    env["KREX_FAKE_GPU_MEMORY"] = str(out.parent / "gpu-memory")  # the simulated GPU's memory, as NVML's
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    data["stdout"] = r.stdout
    return data


@pytest.mark.timeout(480)
def test_the_json_says_what_ran_where(run: dict[str, Any]) -> None:
    assert run["benchmark"] == "eval_batch" and run["backend"] == "fake" and run["simulated"] is True
    assert "MOCKED" in run["stdout"]
    assert {"hostname", "cpus", "date"} <= set(run["machine"]) and run["git_rev"] and len(run["tree_digest"]) == 16
    assert run["pairs"] == PAIRS and run["parameters"]["jobs"] == 2


def test_every_pair_got_exactly_one_result_each_way(run: dict[str, Any]) -> None:
    s = run["summary"]
    assert s["krex_results_per_pair"] == dict.fromkeys(PAIRS, 1)
    assert s["baseline_results_per_pair"] == dict.fromkeys(PAIRS, 1)
    assert s["exactly_one_result_each"] is True
    for pid in PAIRS:
        (rec,) = run["krex"]["results"][pid]
        assert rec["id"] == pid and rec["verdict"] == "correct" and rec["runtime"] > 0
        assert rec["gpu_timed"] is False  # host-clock times on the fake backend, and said so
        assert run["baseline"]["evals"][pid]["correctness"] is True


def test_both_ways_time_the_same_trials_and_every_timing_is_in_a_region(run: dict[str, Any]) -> None:
    for pid in PAIRS:
        krex = run["krex"]["results"][pid][0]["runtime_stats"]["num_trials"]
        assert krex == run["baseline"]["evals"][pid]["runtime_stats"]["num_trials"] == 5
    regions = run["summary"]["regions"]
    assert regions["timed_parts"] >= len(PAIRS) and regions["in_regions"] == regions["timed_parts"]
    assert run["summary"]["verdicts_differ"] == []


def test_wall_times_ratio_and_deviations_are_reported(run: dict[str, Any]) -> None:
    s, base = run["summary"], run["baseline"]
    assert base["wall_s"] >= base["compile_s"] + base["evals_s"] + base["refs_s"] > 0
    assert s["wall_ratio"] == pytest.approx(base["wall_s"] / run["krex"]["wall_s"])
    assert run["krex"]["pool_ready_s"] > 0 and s["wall_ratio_with_pool_start"] < s["wall_ratio"]
    for key in ("deviation_krex_vs_baseline", "deviation_alone_vs_baseline"):  # --long-ms 0: every pair
        assert s[key]["n"] == 2 and set(s[key]["per_pair_pct"]) == set(PAIRS), key
        assert s[key]["p95_abs_pct"] <= s[key]["max_abs_pct"]
    assert set(run["alone"]["evals"]) == set(PAIRS)
    assert "wall: (b) KernelBench way" in run["stdout"] and "(b') alone vs (b)" in run["stdout"]


def test_bad_selections_are_refused_before_anything_starts() -> None:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--backend", "fake", "--problems", "99"], capture_output=True, text=True
    )
    assert r.returncode != 0 and "no such problems: 99" in r.stderr


@pytest.mark.timeout(400)
@pytest.mark.parametrize("during", ["(a)", "(b)"])
def test_a_run_stopped_by_timeout_writes_what_it_measured(tmp_path: Path, during: str) -> None:
    """As ``timeout`` stops it on the device: SIGTERM to the whole process group during (a), whose
    batch's own words are kept, or during (b)."""
    out = tmp_path / "eval_batch.json"
    # one problem: what is tested is the interrupted run's file, not the set (the fixture runs two)
    cmd = [sys.executable, str(SCRIPT), "--backend", "fake", "--problems", "04", "--jobs", "2"]
    cmd += ["--perf-trials", "5", "--compile-workers", "2", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "OUT"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        # (a)'s batch starts once its pool is ready; (b) is under way once it compiles
        if line.startswith("(a) arbiter and" if during == "(a)" else "(b) compile:"):
            os.killpg(proc.pid, signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, "".join(seen) + rest
    data = json.loads(out.read_text())
    assert "interrupted" in data and "summary" not in data
    if during == "(a)":
        cut = data["krex_cut_short"]
        assert "krex" not in data and cut["results"] <= 1 and isinstance(cut["stderr_tail"], str), cut
        return
    assert {pid: len(recs) for pid, recs in data["krex"]["results"].items()} == dict.fromkeys(PAIRS[:1], 1)
    assert "compile" in data["baseline"] and "wall_s" not in data["baseline"]


def test_the_cuda_toolkit_behind_an_nvcc_wrapper_reaches_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch takes the folder above the nvcc on PATH for CUDA_HOME: wrong for a wrapper script."""
    sys.path.insert(0, str(REPO / "benchmarks" / "eval"))
    import eval_batch

    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    (toolkit / "bin" / "nvcc").write_text("")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert eval_batch.cuda_home() == str(toolkit)
    env = eval_batch.base_env(eval_batch.parse(["--backend", "nvidia"]))
    assert env["CUDA_HOME"] == str(toolkit)  # the baseline's processes
    assert "CUDA_HOME" in eval_batch.WORKER_ENV  # the pool's workers


def test_the_json_records_pool_start_foreign_processes_and_admission(run: dict[str, Any]) -> None:
    s = run["summary"]
    assert 0 < s["pool_first_worker_s"] <= s["pool_ready_s"] == run["krex"]["pool_ready_s"]
    assert [p["held_gib"] for p in s["foreign_processes"]] == [0.5, 0.5]
    assert s["verdicts"] == {"correct": 2} and s["requeued_for_memory"] == 0
    assert s["regions"]["degraded"] == 0 and s["regions"]["degraded_reasons"] == {}
    for pid in PAIRS:
        ev = s["evaluations"][pid]
        assert ev["verdict"] == "correct" and ev["admission"]["gpu"] == 0 and ev["admission"]["attempts"] == 1
        # the foreign processes' memory was seen: less than the whole simulated GPU was free
        assert ev["admission"]["free_bytes"] <= (80 << 30) - (1 << 30) - (1024 << 20)
        assert int(ev["memory"]["footprint"]) > 0
