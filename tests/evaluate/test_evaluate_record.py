"""The reproducibility record (record.collect), the compact verdict (compact.compact), progress
callbacks (progress) and the options the CLI and evaluate() check before any worker is asked."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import pytest

from krex_lab.evaluate.cli import _options, add_arguments
from krex_lab.evaluate.compact import LIMIT, compact
from krex_lab.evaluate.job import build_job
from krex_lab.evaluate.judge import record
from krex_lab.evaluate.progress import phase_started, reporting
from krex_lab.evaluate.result import CaseResult, Evaluation, Reproducibility, TimingStats
from krex_lab.gpu.nvml import NvmlApi

from .helpers import PROBLEMS, problem

SCALE = PROBLEMS / "gm_tasks" / "gm_task_scale"


class CountingNvml(NvmlApi):
    """An NVML of one GPU that counts what it is asked (the record must not re-read static facts)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.sm = 1980

    def shutdown(self) -> None:
        pass

    def device_count(self) -> int:
        return 1

    def driver_version(self) -> str:
        self.asked.append("driver")
        return "580.159.04"

    def name(self, index: int) -> str:
        self.asked.append("name")
        return "NVIDIA H200"

    def uuid(self, index: int) -> str:
        self.asked.append("uuid")
        return "GPU-1234"

    def memory(self, index: int) -> tuple[int, int]:
        return (0, 0)

    def utilization(self, index: int) -> float | None:
        return None

    def clocks(self, index: int) -> tuple[int | None, int | None]:
        self.asked.append("clocks")
        return (self.sm, None)

    def clock_event_reasons(self, index: int) -> int | None:
        return None

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        return []


def test_the_record_names_versions_gpu_seeds_hashes_settings_and_reads_static_facts_once() -> None:
    job = build_job(SCALE, SCALE / "correct.py", timing="converge", atol=1e-3, seed=7, strict=True, max_case_s=2.5)
    nvml = CountingNvml()
    gpu = record._Gpu(nvml)
    first = record.collect(job, seed=123, device="NVIDIA H200", nvml_index=0, nvml=gpu.api)
    assert first.gpu_name == "NVIDIA H200" and first.gpu_uuid == "GPU-1234" and first.driver == "580.159.04"
    assert first.clocks_mhz == {"sm": 1980}  # the memory clock NVML did not give is left out
    assert first.seed == 123 and first.seed_given and first.init_seed is None
    assert first.packages.python and first.packages.krex_lab and first.packages.torch  # torch: the test extra's
    assert first.reference_sha256 == job.reference.sha256 and first.candidate_sha256 == job.candidate.sha256
    assert set(first.files) == {"reference.py", "submission.py", "task.py", "utils.py"}
    assert first.files["submission.py"] == job.candidate.sha256 and first.task == str(SCALE / "task.yml")
    assert first.timing["timing"] == "converge" and first.timing["max_rel_err"] == 0.001
    assert first.timing["max_case_s"] == 2.5 and first.timing["strict"] is True and "max_runs" not in first.timing
    assert first.tolerances == {"atol": 1e-3, "rtol": None}
    assert first.numerics["cudnn_allow_tf32"] is False and first.numerics["float32_matmul_precision"] == "highest"
    # a shared record reader: the static facts once, the clocks every time
    shared = record._Gpu(CountingNvml())
    for sm in (1980, 1755):
        shared.api.sm = sm
        record._GPU, saved = shared, record._GPU
        try:
            again = record.collect(job, seed=1, device="NVIDIA H200", nvml_index=0)
        finally:
            record._GPU = saved
        assert again.clocks_mhz == {"sm": sm}
    assert shared.api.asked.count("name") == 1 and shared.api.asked.count("driver") == 1
    assert shared.api.asked.count("clocks") == 2
    # it travels: JSON and back, typed
    assert msgspec.json.decode(msgspec.json.encode(first), type=Reproducibility) == first


def test_the_record_of_a_kernelbench_job_on_a_cpu() -> None:
    job = build_job(problem("kb_softmax"), problem("kb_softmax", "correct.py"))
    rec = record.collect(job, seed=99, device="cpu: test")
    assert rec.device == "cpu: test" and rec.gpu_name is None and rec.driver is None and rec.clocks_mhz == {}
    assert rec.seed == 99 and not rec.seed_given and rec.init_seed == 42 and rec.files == {} and rec.task is None
    assert rec.timing["perf_trials"] == 100 and rec.timing["trials"] == 5 and "warmup_s" not in rec.timing
    assert rec.numerics == {}  # KernelBench: torch's defaults, as its harness leaves them


def _evaluation(**kw: Any) -> Evaluation:
    base: dict[str, Any] = dict(format="gpumode", verdict="correct", summary="correct", reference="r", candidate="c")
    return Evaluation(**{**base, **kw})


def test_the_compact_verdict_fits_a_kilobyte_whatever_the_reason_and_says_what_failed() -> None:
    huge = "error: 'ü' is not a member of 'at::Tensor' 💥\n" * 500  # 4-byte characters too
    ev = _evaluation(
        verdict="compile_error",
        summary="compile_error: " + huge[:5000],
        metadata={"compilation_error": huge, "correctness_trials": "(0 / 5)"},
        warnings=["w"] * 50,
        tests=[CaseResult(spec="size: 3; seed: 1", passed=True), CaseResult(spec="n: 9", passed=False, message=huge)],
    )
    out = compact(ev)
    data = msgspec.json.encode(out)
    assert len(data) <= LIMIT, len(data)
    assert out.reason_key == "compilation_error" and out.reason and out.reason.startswith("error: 'ü'")
    assert out.first_mismatch and out.first_mismatch.startswith("test [n: 9]: error")
    assert out.evaluation is None and compact(ev, full=True).evaluation == ev.to_dict()
    rejected = compact(
        _evaluation(verdict="rejected", metadata={"rejected": {"inputs_modified": "wrote into input 0"}})
    )
    assert (rejected.reason_key, rejected.reason) == ("rejected:inputs_modified", "wrote into input 0")
    assert rejected.flags == ["rejected:inputs_modified"]
    timed = compact(
        _evaluation(
            runtime=12.3456,
            ref_runtime=24.0,
            speedup=1.944,
            runtime_stats=TimingStats(mean=12.3, std=0.1, min=12.0, max=13.0, num_trials=9, converged=False),
            metadata={"timing_disagreement": ["x"]},
        )
    )
    assert timed.reason is None and timed.runtime == 12.346 and timed.speedup == 1.944
    assert timed.flags == ["timing_disagreement", "not_converged", "no_gpu_timed"]


def test_progress_calls_the_callback_of_its_block_and_drops_one_that_fails() -> None:
    seen: list[tuple[str, str]] = []
    phase_started("load")  # no block: nobody to tell, and no error
    with reporting(lambda phase, detail: seen.append((phase, detail))):
        phase_started("load", "worker 1")
        with reporting(None):
            phase_started("check")  # an inner evaluation without a callback
        phase_started("time")
    assert seen == [("load", "worker 1"), ("time", "")]

    calls: list[str] = []

    def broken(phase: str, detail: str) -> None:
        calls.append(phase)
        raise RuntimeError("the caller's bug")

    with reporting(broken):
        phase_started("load")
        phase_started("check")
    assert calls == ["load"]


def _cli(*argv: str) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return _options(p.parse_args(["r.py", "c.py", *argv])).given()


def test_the_cli_takes_converge_strict_seed_and_tolerances_and_refuses_bad_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    opts = _cli("--timing", "converge", "--strict", "--seed", "5", "--atol", "1e-3", "--max-case-s", "2")
    assert (opts["timing"], opts["strict"], opts["seed"], opts["atol"], opts["max_case_s"]) == (
        "converge",
        True,
        5,
        1e-3,
        2.0,
    )
    assert "rtol" not in opts and "seed" not in _cli()  # not given: a batch line's own value stands
    for bad in (["--seed", "-1"], ["--atol", "nan"], ["--timing", "fast"], ["--max-case-s", "0"]):
        with pytest.raises(SystemExit):
            _cli(*bad)
    assert "invalid" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "error"),
    [
        ({"timing": "fast"}, "unknown timing 'fast': one of format, bench, converge"),
        ({"strict": "yes"}, "strict must be `bool`, got `str`"),
        ({"seed": -3}, "seed must be `int` >= 0"),
        ({"seed": True}, "seed must be `int | null`, got `bool`"),
        ({"atol": -1.0}, r"atol must be `float` >= 0\.0"),
        ({"max_case_s": 0}, r"max_case_s must be `float` > 0\.0"),
        ({"timeouts": {"check": 0}}, r"timeouts\[\.\.\.\] must be `float` > 0\.0"),
        ({"timeouts": {"compile": 5}}, "unknown phase 'compile' in timeouts: load, check, time"),
        ({"trials": 0}, "trials must be `int` >= 1"),
        ({"colour": "red"}, "unknown option `colour`"),
    ],
)
def test_build_job_refuses_a_bad_option_before_anything_runs(option: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        build_job(problem("kb_softmax"), problem("kb_softmax", "correct.py"), **option)
    job = build_job(problem("kb_softmax"), problem("kb_softmax", "correct.py"), timing="converge", strict=True)
    assert job.options.timing == "converge" and job.options.strict and job.options.converge_rel_err == 0.001
