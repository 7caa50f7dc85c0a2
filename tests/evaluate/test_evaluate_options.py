"""An evaluation's options have one definition, :class:`EvaluateOptions`: the API's keywords, the
MCP tool's arguments, a manifest line's options and the job all name its fields, and one check
(msgspec's, on the struct) refuses a bad value wherever it comes from."""

from __future__ import annotations

import inspect

import pytest

from krex_lab.evaluate.api import evaluate
from krex_lab.evaluate.batch import ManifestLine
from krex_lab.evaluate.job import build_job
from krex_lab.evaluate.options import OPTION_DEFAULTS, EvaluateOptions, Options
from krex_lab.evaluate.pairs import PAIR_OPTIONS

from .helpers import problem

FIELDS = set(EvaluateOptions.__struct_fields__)


def test_the_apis_keywords_are_the_options_with_their_defaults() -> None:
    params = inspect.signature(evaluate).parameters
    keywords = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(keywords) - {"options", "pool", "progress"} == FIELDS
    assert {n: keywords[n] for n in FIELDS} == OPTION_DEFAULTS


def test_the_mcp_tools_arguments_name_options() -> None:
    pytest.importorskip("mcp")
    from krex_lab.evaluate.mcp_tools import evaluate_kernel

    extra = {"reference", "candidate", "detail", "ctx", "load_timeout", "check_timeout", "time_timeout"}
    names = set(inspect.signature(evaluate_kernel).parameters) - extra
    assert names <= FIELDS, names - FIELDS


def test_a_manifest_line_sets_options_by_their_names() -> None:
    assert set(PAIR_OPTIONS) <= FIELDS
    assert set(ManifestLine.__struct_fields__) - {"reference", "candidate", "id"} == set(PAIR_OPTIONS)


def test_the_judge_reads_each_option_under_the_same_name() -> None:
    judged = FIELDS - {"format", "gpu", "tests", "benchmarks"}
    assert judged <= set(Options.__struct_fields__), judged - set(Options.__struct_fields__)


def test_merged_options_are_checked_again_and_keep_what_is_not_replaced() -> None:
    base = EvaluateOptions.of({"trials": 3, "timeouts": {"load": 5.0}})
    merged = base.merged({"gpu": 1, "seed": 7})
    assert (merged.trials, merged.timeouts, merged.gpu, merged.seed) == (3, {"load": 5.0}, 1, 7)
    assert base.given() == {"trials": 3, "timeouts": {"load": 5.0}}
    with pytest.raises(ValueError, match="seed must be `int` >= 0"):
        base.merged({"seed": -1})


def test_the_job_takes_the_options_or_their_names_alike() -> None:
    ref, cand = problem("kb_softmax"), problem("kb_softmax", "correct.py")
    by_struct = build_job(ref, cand, EvaluateOptions.of({"timing": "converge", "timeouts": {"check": 9}}))
    by_name = build_job(ref, cand, timing="converge", timeouts={"check": 9})
    assert by_struct.options == by_name.options
    assert by_name.options.timing == "converge" and by_name.options.limit("check") == 9.0
    with pytest.raises(ValueError, match="unknown mode 'fast': one of test, benchmark, leaderboard"):
        build_job(ref, cand, mode="fast")
