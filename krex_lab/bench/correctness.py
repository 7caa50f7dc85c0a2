"""``krex_lab.check(candidate, reference, make_inputs, rtol, atol)``: is a candidate kernel correct?

Every call draws fresh random inputs (the seed is reported so a failure can be replayed), fills
the outputs with NaN (integer outputs with a sentinel) before the candidate runs, so an element
the candidate never writes cannot pass by luck, and compares with the reference. NaN never
passes, not even against a NaN in the reference. A failure raises :class:`CheckFailed` (an
``AssertionError``) whose message says where and by how much: mismatching elements, the first
mismatching index, the largest absolute and relative errors, NaNs.

Conventions:

* ``make_inputs(rng)`` gets a ``numpy.random.Generator`` (or nothing, if it takes no argument)
  and returns either ``(inputs, outputs)``, two tuples (or ``{"inputs": …, "outputs": …}``):
  the candidate is called as ``candidate(*inputs, *outputs)`` and must write the outputs; or
  a plain tuple of arguments: then ``candidate(*args)`` returns the output(s).
* ``reference(*inputs)`` gets NumPy copies of the inputs, taken before the candidate ran, and
  returns the expected output(s) (an array, or a tuple in the outputs' order).
* Arrays may be NumPy, numba device arrays, CuPy arrays or torch tensors.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast


class CheckFailed(AssertionError):
    """The candidate's outputs differ from the reference's; ``.result`` has the details."""

    def __init__(self, message: str, result: CheckResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    dtype: str
    ok: bool
    total: int = 0
    mismatches: int = 0
    nans: int = 0
    first_index: tuple[int, ...] | None = None
    first_actual: Any = None
    first_expected: Any = None
    max_abs_error: float = 0.0
    max_abs_index: tuple[int, ...] | None = None
    max_rel_error: float = 0.0
    max_rel_index: tuple[int, ...] | None = None
    problem: str = ""

    def describe(self) -> str:
        head = f"{self.name} ({self.dtype}, shape {self.shape})"
        if self.problem:
            return f"{head}: {self.problem}"
        if self.ok:
            return f"{head}: ok (max abs error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g})"
        lines = [
            f"{head}: {self.mismatches} of {self.total} elements differ",
            f"  first mismatch at {list(self.first_index or ())}: got {self.first_actual!r}, "
            f"expected {self.first_expected!r}",
        ]
        if self.nans:
            lines.append(
                f"  NaN in the output: {self.nans} element(s) (NaN never passes; outputs are NaN-filled "
                "before the call, so a NaN may be an element the candidate never wrote)"
            )
        if self.max_abs_index is None:
            lines.append("  no element compared finite (every difference is NaN or infinite)")
        else:
            lines.append(
                f"  max abs error {self.max_abs_error:.6g} at {list(self.max_abs_index)}, "
                f"max rel error {self.max_rel_error:.6g} at {list(self.max_rel_index or ())} "
                "(over the finite differences)"
            )
        return "\n".join(lines)


class OutputDiffDict(TypedDict):
    """An :class:`OutputDiff` as plain data (its fields, one for one)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    ok: bool
    total: int
    mismatches: int
    nans: int
    first_index: tuple[int, ...] | None
    first_actual: Any
    first_expected: Any
    max_abs_error: float
    max_abs_index: tuple[int, ...] | None
    max_rel_error: float
    max_rel_index: tuple[int, ...] | None
    problem: str


class CheckResultDict(TypedDict):
    """A :class:`CheckResult` as plain data (:meth:`CheckResult.to_dict`)."""

    ok: bool
    rtol: float
    atol: float
    trials: int
    seeds: list[int]
    outputs: list[OutputDiffDict]
    notes: list[str]


@dataclass
class CheckResult:
    ok: bool
    rtol: float
    atol: float
    trials: int
    seeds: list[int]
    outputs: list[OutputDiff]
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def message(self) -> str:
        state = "passed" if self.ok else "FAILED"
        lines = [
            f"check {state}: {self.trials} trial(s) with fresh random inputs, rtol={self.rtol:g}, "
            f"atol={self.atol:g}, last seed {self.seeds[-1] if self.seeds else None}"
        ]
        lines += [d.describe() for d in self.outputs]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.message()

    def _repr_html_(self) -> str:
        import html

        color = "#070" if self.ok else "#b00"
        return f"<pre style='color:{color}'>{html.escape(self.message())}</pre>"

    def to_dict(self) -> CheckResultDict:
        return {
            "ok": self.ok,
            "rtol": self.rtol,
            "atol": self.atol,
            "trials": self.trials,
            "seeds": self.seeds,
            "outputs": [cast(OutputDiffDict, vars(d).copy()) for d in self.outputs],
            "notes": list(self.notes),
        }


def to_numpy(x: Any) -> Any:
    import numpy as np

    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        t = x.detach().cpu()
        try:
            return t.numpy()
        except TypeError:  # bfloat16 and friends have no NumPy dtype
            return t.float().numpy()
    if mod.startswith("cupy"):
        return x.get()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    return np.asarray(x)


def poison(x: Any) -> bool:
    """Fill ``x`` with NaN (integers: a sentinel) in place; False when it cannot be poisoned."""
    import numpy as np

    name = str(x.dtype).replace("torch.", "")
    try:
        dtype: Any = np.dtype(name)
        kind = dtype.kind
    except TypeError:  # bfloat16 and friends
        dtype, kind = None, "f" if "float" in name else ""
    if kind in ("f", "c"):
        value: Any = np.nan
    elif kind == "i":
        value = np.iinfo(dtype).min
    elif kind == "u":
        value = np.iinfo(dtype).max
    else:
        return False
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        x.fill_(value)
    elif hasattr(x, "copy_to_device") and not isinstance(x, np.ndarray):
        x.copy_to_device(np.full(x.shape, value, dtype=dtype))
    else:
        x.fill(value)
    return True


def _split(case: Any) -> tuple[tuple[Any, ...], tuple[Any, ...] | None]:
    if isinstance(case, dict):
        return tuple(case["inputs"]), tuple(case["outputs"])
    if isinstance(case, (tuple, list)) and len(case) == 2 and all(isinstance(c, (tuple, list)) for c in case):
        return tuple(case[0]), tuple(case[1])
    if isinstance(case, (tuple, list)):
        return tuple(case), None
    return (case,), None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _names(candidate: Callable[..., Any], start: int, count: int) -> list[str]:
    try:
        params = [
            p.name
            for p in inspect.signature(candidate).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return [f"output {j} '{params[start + j]}'" if start + j < len(params) else f"output {j}" for j in range(count)]


def compare_output(name: str, actual: Any, expected: Any, rtol: float, atol: float) -> OutputDiff:
    import numpy as np

    a, e = np.asarray(actual), np.asarray(expected)
    diff = OutputDiff(name=name, shape=tuple(a.shape), dtype=str(a.dtype), ok=False, total=int(a.size))
    if a.shape != e.shape:
        diff.problem = f"shape {a.shape} differs from the reference's {e.shape}"
        return diff
    af, ef = (
        a.astype(np.complex128 if a.dtype.kind == "c" else np.float64),
        e.astype(np.complex128 if e.dtype.kind == "c" else np.float64),
    )
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        bad = ~np.isclose(af, ef, rtol=rtol, atol=atol, equal_nan=False)
        err = np.abs(af - ef)
        finite = np.isfinite(err)
        rel = np.where(finite & (ef != 0), err / np.abs(np.where(ef == 0, 1, ef)), 0.0)
    diff.nans = int(np.isnan(af).sum())
    diff.mismatches = int(bad.sum())
    if finite.any():
        masked = np.where(finite, err, -1.0)
        i = np.unravel_index(int(np.argmax(masked)), a.shape) if a.ndim else ()
        diff.max_abs_error, diff.max_abs_index = float(masked[i]), tuple(int(k) for k in i)
        j = np.unravel_index(int(np.argmax(rel)), a.shape) if a.ndim else ()
        diff.max_rel_error, diff.max_rel_index = float(rel[j]), tuple(int(k) for k in j)
    if diff.mismatches:
        first = tuple(int(k) for k in np.argwhere(bad)[0]) if a.ndim else ()
        diff.first_index, diff.first_actual, diff.first_expected = first, a[first].item(), e[first].item()
    diff.ok = diff.mismatches == 0
    return diff


def check(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[..., Any],
    rtol: float = 1e-5,
    atol: float = 1e-8,
    *,
    trials: int = 1,
    seed: int | None = None,
    raise_on_failure: bool = True,
) -> CheckResult:
    """Run ``candidate`` and ``reference`` on ``trials`` fresh random inputs; raise :class:`CheckFailed`
    with a readable diff at the first failure (or return the failed result with
    ``raise_on_failure=False``). ``seed`` replays a reported failure. See the module doc."""
    import numpy as np

    from ..devsync import synchronize_frameworks

    takes_rng = _takes_argument(make_inputs)
    seeds: list[int] = []
    notes: list[str] = []
    diffs: list[OutputDiff] = []
    for trial in range(max(1, trials)):
        s = seed + trial if seed is not None else secrets.randbits(63)
        seeds.append(s)
        rng = np.random.default_rng(s)
        inputs, outputs = _split(make_inputs(rng) if takes_rng else make_inputs())
        host_inputs = [np.array(to_numpy(x), copy=True) for x in inputs]
        if outputs is not None:
            for j, out in enumerate(outputs):
                if not poison(out) and trial == 0:
                    notes.append(f"output {j} ({out.dtype}) cannot be poisoned before the call")
            returned = candidate(*inputs, *outputs)
            actual = list(outputs)
            names = _names(candidate, len(inputs), len(outputs))
            if returned is not None and trial == 0:
                notes.append("the candidate returned a value; its output arguments were compared")
        else:
            actual = _as_list(candidate(*inputs))
            names = [f"output {j}" for j in range(len(actual))]
        synchronize_frameworks()
        expected = _as_list(reference(*[x.copy() for x in host_inputs]))
        if any(e is None for e in expected):
            raise TypeError(
                "the reference returned None: check() calls reference(*inputs), with the inputs only, "
                "and compares what it returns with the candidate's outputs; return the expected array(s)"
            )
        if any(a is None for a in actual):
            raise TypeError(
                "the candidate returned None and make_inputs gave no output arrays to compare: return "
                "the result, or have make_inputs return (inputs, outputs) for a candidate that writes into outputs"
            )
        if len(expected) != len(actual):
            diffs = [
                OutputDiff(
                    name="outputs",
                    shape=(),
                    dtype="",
                    ok=False,
                    problem=f"the candidate gave {len(actual)} output(s), the reference {len(expected)}",
                )
            ]
        else:
            diffs = [
                compare_output(n, to_numpy(a), to_numpy(e), rtol, atol) for n, a, e in zip(names, actual, expected)
            ]
        for k, (before, x) in enumerate(zip(host_inputs, inputs)):
            if not np.array_equal(before, to_numpy(x), equal_nan=True):
                notes.append(f"trial {trial + 1}: the candidate modified input {k}")
        if not all(d.ok for d in diffs):
            result = CheckResult(False, rtol, atol, trial + 1, seeds, diffs, notes)
            if raise_on_failure:
                raise CheckFailed(result.message() + f"\nreplay with check(..., seed={s})", result)
            return result
    return CheckResult(True, rtol, atol, len(seeds), seeds, diffs, notes)


def _takes_argument(fn: Callable[..., Any]) -> bool:
    try:
        params: Sequence[inspect.Parameter] = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
