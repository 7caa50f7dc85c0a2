"""``krex_lab.check``: fresh inputs, poisoned outputs, NaN never passes, a diff that says where."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import krex_lab
from krex_lab.bench import CheckFailed, CheckResult
from tests.numba_sim import use_simulator


def make_add(rng: np.random.Generator, n: int = 50) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    return (a, b), (np.empty(n, np.float32),)


def ref_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def add_ok(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def add_skips_last(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    for i in range(len(out) - 1):  # planted off-by-one: range(n - 1)
        out[i] = a[i] + b[i]


def add_reads_next(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    out[:-1] = a[1:] + b[:-1]  # planted off-by-one: a[i + 1]
    out[-1] = a[-1] + b[-1]


def test_correct_candidate_passes() -> None:
    r = krex_lab.check(add_ok, ref_add, make_add, rtol=1e-6, atol=1e-7, trials=3)
    assert isinstance(r, CheckResult) and r and r.ok and r.trials == 3 and len(set(r.seeds)) == 3
    assert "check passed" in repr(r) and "output 0 'out'" in repr(r) and "color:#070" in r._repr_html_()


def test_off_by_one_that_leaves_an_element_unwritten_is_caught_by_the_poison() -> None:
    with pytest.raises(CheckFailed) as err:
        krex_lab.check(add_skips_last, ref_add, make_add)
    msg = str(err.value)
    assert "1 of 50 elements differ" in msg and "first mismatch at [49]: got nan" in msg
    assert "NaN in the output: 1 element" in msg and "seed=" in msg
    diff = err.value.result.outputs[0]
    assert diff.first_index == (49,) and diff.nans == 1 and not err.value.result.ok
    assert isinstance(err.value, AssertionError)


def test_off_by_one_in_the_indexing_is_caught_with_its_errors() -> None:
    with pytest.raises(CheckFailed) as err:
        krex_lab.check(add_reads_next, ref_add, make_add)
    d = err.value.result.outputs[0]
    assert d.mismatches >= 45 and d.first_index == (0,) and d.nans == 0
    assert d.max_abs_error > 0.1 and d.max_abs_index is not None and d.max_rel_error > 0
    assert "max abs error" in str(err.value) and "max rel error" in str(err.value)


def test_a_result_as_data_has_the_fields_its_type_names() -> None:
    """``CheckResult.to_dict`` is typed by ``CheckResultDict`` and each output by ``OutputDiffDict``:
    the keys are the dataclasses' fields, one for one."""
    import dataclasses

    from krex_lab.bench.correctness import CheckResultDict, OutputDiff, OutputDiffDict

    with pytest.raises(CheckFailed) as err:
        krex_lab.check(add_skips_last, ref_add, make_add, seed=7)
    data = err.value.result.to_dict()
    assert set(data) == set(CheckResultDict.__required_keys__) == {f.name for f in dataclasses.fields(CheckResult)}
    fields = {f.name for f in dataclasses.fields(OutputDiff)}
    assert set(data["outputs"][0]) == set(OutputDiffDict.__required_keys__) == fields
    assert data["outputs"][0]["first_index"] == (49,) and data["seeds"] == [7] and not data["ok"]


def test_nan_never_passes_not_even_against_a_nan_reference() -> None:
    def nan_at_7(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        np.add(a, b, out=out)
        out[7] = np.nan

    with pytest.raises(CheckFailed, match=r"first mismatch at \[7\]: got nan"):
        krex_lab.check(nan_at_7, ref_add, make_add)

    def ref_with_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        r = a + b
        r[3] = np.nan
        return r

    def cand_with_nan(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        np.add(a, b, out=out)
        out[3] = np.nan

    r = krex_lab.check(cand_with_nan, ref_with_nan, make_add, raise_on_failure=False)
    assert not r.ok and r.outputs[0].first_index == (3,)


def test_outputs_are_poisoned_before_every_call() -> None:
    seen: list[np.ndarray] = []

    def peek(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        seen.append(out.copy())
        np.add(a, b, out=out)

    def make(rng: np.random.Generator) -> Any:
        (a, b), _ = make_add(rng)
        return (a, b), (np.zeros(50, np.float32), np.zeros(4, np.int32))

    def peek2(a: np.ndarray, b: np.ndarray, out: np.ndarray, count: np.ndarray) -> None:
        peek(a, b, out)
        seen.append(count.copy())
        count[:] = 1

    def ref2(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return a + b, np.ones(4, np.int32)

    krex_lab.check(peek2, ref2, make, trials=2)
    assert np.isnan(seen[0]).all() and np.isnan(seen[2]).all(), "float outputs: NaN"
    assert (seen[1] == np.iinfo(np.int32).min).all(), "integer outputs: a sentinel"


def test_fresh_inputs_each_call_and_a_seed_replays_them() -> None:
    drawn: list[np.ndarray] = []

    def make(rng: np.random.Generator) -> Any:
        (a, b), outs = make_add(rng)
        drawn.append(a)
        return (a, b), outs

    krex_lab.check(add_ok, ref_add, make)
    krex_lab.check(add_ok, ref_add, make)
    assert not np.array_equal(drawn[0], drawn[1])
    krex_lab.check(add_ok, ref_add, make, seed=1234)
    krex_lab.check(add_ok, ref_add, make, seed=1234)
    assert np.array_equal(drawn[2], drawn[3])


def test_functional_candidates_and_shape_errors() -> None:
    def make(rng: np.random.Generator) -> Any:
        return (rng.standard_normal((4, 6)).astype(np.float32),)

    r = krex_lab.check(lambda x: x.T.copy(), lambda x: x.T, make)
    assert r.ok
    with pytest.raises(CheckFailed, match=r"shape \(4, 6\) differs from the reference's \(6, 4\)"):
        krex_lab.check(lambda x: x.copy(), lambda x: x.T, make)
    with pytest.raises(CheckFailed, match="the candidate gave 1 output"):
        krex_lab.check(lambda x: x, lambda x: (x, x), make)


def test_a_candidate_that_changes_its_inputs_is_noted() -> None:
    def clobber(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        np.add(a, b, out=out)
        a[0] = 99

    r = krex_lab.check(clobber, ref_add, make_add)
    assert r.ok and any("modified input 0" in n for n in r.notes)


def test_planted_off_by_one_in_a_numba_kernel_under_the_simulator() -> None:
    use_simulator()
    from numba import cuda

    from tests.planted_kernels import candidate

    with pytest.raises(CheckFailed) as err:
        krex_lab.check(candidate, ref_add, make_add)
    assert err.value.result.outputs[0].first_index == (49,) and "got nan" in str(err.value)

    def device_case(rng: np.random.Generator) -> Any:  # device arrays are poisoned on the device
        (a, b), (out,) = make_add(rng)
        return (cuda.to_device(a), cuda.to_device(b)), (cuda.to_device(out),)

    with pytest.raises(CheckFailed, match="NaN in the output: 1 element"):
        krex_lab.check(candidate, ref_add, device_case)


def test_a_reference_or_candidate_that_returns_none_gets_a_clear_error() -> None:
    """In-place functions on both sides with no output arrays from make_inputs: check() crashed
    inside itself (AttributeError: 'NoneType' object has no attribute 'item')."""

    def in_place(x: Any, out: Any = None) -> None:
        if out is not None:
            np.multiply(x, 2, out=out)

    def make_inputs(rng: Any) -> tuple[Any, ...]:
        return (rng.random(8),)

    with pytest.raises(TypeError, match="the reference returned None"):
        krex_lab.check(lambda x: x * 2, in_place, make_inputs)
    with pytest.raises(TypeError, match="the candidate returned None"):
        krex_lab.check(in_place, lambda x: x * 2, make_inputs)
