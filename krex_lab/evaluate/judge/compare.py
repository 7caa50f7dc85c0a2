"""The judge's comparison of a candidate's output with the reference's: on the arrays' own device,
in chunks, never a host float64 copy of a whole output.

Beyond the formats' tolerances (``|out - ref| <= atol + rtol * |ref|``, NaN only where the
reference has NaN), outputs that tolerances let through but no honest kernel gives are caught by
rule, named in the result (``metadata.correctness_rule``): a constant, an all-zero or a NaN output
where the reference's is none of these (KernelBench's loophole: all-zeros passes ``atol`` wherever
the reference is small).

The absolute tolerance follows the reference's own spread: it is at most a tenth of the standard
deviation of the reference's values (where they vary). An ``atol`` above the values themselves
would pass any output near their mean, a near-constant one included; bounded so, an output must
vary as the reference's does, while an honest kernel's rounding (far below its output's spread)
is unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Comparison", "compare", "same", "tolerances"]

#: elements per chunk: the temporaries of one chunk stay a few hundred MiB
_CHUNK = 1 << 25

#: the absolute tolerance at most this fraction of the reference's standard deviation
SPREAD_FRACTION = 0.1
#: values the spread is estimated from
_SPREAD_SAMPLE = 1 << 20

#: (atol, rtol) by the output's precision: half precisions are looser
_TOLERANCES = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-4, "float64": 1e-7}


def tolerances(expected: list[Any], atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The tolerances for ``expected``: as given, else by its loosest precision (default fp32's)."""
    loosest = 0.0
    for x in expected:
        name = str(x.dtype).replace("torch.", "")
        loosest = max(loosest, _TOLERANCES.get(name, 1e-4 if "float" in name or "complex" in name else 0.0))
    default = loosest or 1e-4
    return (default if atol is None else atol, default if rtol is None else rtol)


@dataclass
class Comparison:
    ok: bool
    issue: str = ""
    rule: str | None = None
    max_difference: list[float] = field(default_factory=list)
    avg_difference: list[float] = field(default_factory=list)


def _torch(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach()
    return torch.from_numpy(x) if hasattr(x, "__array_interface__") else torch.as_tensor(x)


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return out[::-1]


def spread(expected: Any) -> float:
    """The standard deviation of the reference's finite values (0: constant, empty or one value)."""
    import torch

    e = _torch(expected).reshape(-1)
    n = e.numel()
    if n < 2 or e.is_complex() or e.dtype == torch.bool:
        return 0.0
    # a spread needs no exactness: at most a million values, evenly strided, in float64
    step = max(1, n // _SPREAD_SAMPLE)
    y = e[::step].to(torch.float64)
    if not torch.isfinite(y.sum()):  # a NaN or infinity among them: left out
        y = y[torch.isfinite(y)]
    if y.numel() < 2:
        return 0.0
    return float(torch.std(y, unbiased=False))


def _one(k: int, actual: Any, expected: Any, atol: float, rtol: float) -> tuple[str, str | None, float, float]:
    """(what differs or "", the rule broken, max abs difference, mean abs difference) of one pair."""
    import torch

    given_atol = atol
    if not _torch(expected).is_complex():
        std = spread(expected)
        if std > 0:
            atol = min(atol, SPREAD_FRACTION * std)

    a, e = _torch(actual), _torch(expected)
    if tuple(a.shape) != tuple(e.shape):
        return f"output {k}: shape {tuple(a.shape)}, expected {tuple(e.shape)}", None, float("nan"), float("nan")
    if a.is_complex() != e.is_complex():
        return f"output {k}: dtype {a.dtype}, expected {e.dtype}", None, float("nan"), float("nan")
    if a.device != e.device:
        a = a.to(e.device)
    n = e.numel()
    if n == 0:
        return "", None, 0.0, 0.0
    af, ef = a.reshape(-1), e.reshape(-1)
    work = torch.float64 if e.dtype == torch.float64 or a.dtype == torch.float64 else torch.float32
    bad = 0
    first_bad = -1
    worst, worst_at, worst_rel, worst_rel_at = -1.0, 0, -1.0, 0
    total = 0.0
    a_nan = e_nan = 0
    a_min = a_max = e_min = e_max = None
    a_zero = True
    for lo in range(0, n, _CHUNK):
        x = af[lo : lo + _CHUNK].to(work)
        y = ef[lo : lo + _CHUNK].to(work)
        xn, yn = torch.isnan(x), torch.isnan(y)
        a_nan += int(xn.sum())
        e_nan += int(yn.sum())
        diff = (x - y).abs()
        diff = torch.where(xn & yn, torch.zeros_like(diff), diff)
        diff = torch.where(xn ^ yn, torch.full_like(diff, float("inf")), diff)
        wrong = diff > (atol + rtol * y.abs())
        wrong |= xn ^ yn
        count = int(wrong.sum())
        if count and first_bad < 0:
            first_bad = lo + int(torch.nonzero(wrong)[0, 0])
        bad += count
        finite = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
        total += float(finite.sum())
        m, at = torch.max(diff, 0)
        if float(m) > worst:
            worst, worst_at = float(m), lo + int(at)
        nonzero = y.abs() > 0
        if bool(nonzero.any()):
            rel = torch.where(nonzero, diff / y.abs().clamp_min(1e-30), torch.zeros_like(diff))
            rm, rat = torch.max(rel, 0)
            if float(rm) > worst_rel:
                worst_rel, worst_rel_at = float(rm), lo + int(rat)
        xs, ys = x[~xn], y[~yn]
        if xs.numel():
            a_min = min(float(xs.min()), a_min) if a_min is not None else float(xs.min())
            a_max = max(float(xs.max()), a_max) if a_max is not None else float(xs.max())
            a_zero = a_zero and not bool((xs != 0).any())
        if ys.numel():
            e_min = min(float(ys.min()), e_min) if e_min is not None else float(ys.min())
            e_max = max(float(ys.max()), e_max) if e_max is not None else float(ys.max())
    mean = total / n
    shape = tuple(e.shape)
    if bad:
        where = _index(first_bad, shape)
        got, want = af[first_bad].item(), ef[first_bad].item()
        text = (
            f"output {k}: {bad} of {n} elements differ; first at {where}: {got!r}, expected {want!r}; "
            f"max abs error {worst:.4g} at {_index(worst_at, shape)}"
        )
        if atol < given_atol:
            text += f" (atol {atol:.3g}: a tenth of the reference's spread, below {given_atol:g})"
        if worst_rel >= 0:
            text += f", max rel error {worst_rel:.4g} at {_index(worst_rel_at, shape)}"
        return text, None, worst, mean
    # within tolerance: the outputs no honest kernel gives
    ref_constant = e_min is not None and e_min == e_max
    if a_nan and not e_nan:
        return f"output {k}: {a_nan} NaN where the reference has none", "nan_output", worst, mean
    if n > 1 and not ref_constant and e_min is not None:
        ref_zero = e_min == 0 and e_max == 0
        if a_zero and not ref_zero and a_nan == 0:
            return (
                f"output {k}: all zeros, where the reference's values span [{e_min:.3g}, {e_max:.3g}] "
                "(within the tolerances only because the reference is small)",
                "zero_output",
                worst,
                mean,
            )
        if a_min is not None and a_min == a_max:
            return (
                f"output {k}: the constant {a_min:.6g}, where the reference's values span [{e_min:.3g}, {e_max:.3g}]",
                "constant_output",
                worst,
                mean,
            )
    return "", None, worst, mean


def compare(actual: list[Any], expected: list[Any], atol: float, rtol: float) -> Comparison:
    """Two outputs, each a list of arrays in the same order."""
    if len(actual) != len(expected):
        return Comparison(False, f"the candidate gave {len(actual)} output array(s), the reference {len(expected)}")
    out = Comparison(ok=True)
    problems: list[str] = []
    for k, (a, e) in enumerate(zip(actual, expected)):
        text, rule, worst, mean = _one(k, a, e, atol, rtol)
        out.max_difference.append(worst)
        out.avg_difference.append(mean)
        if text:
            problems.append(text)
            out.rule = out.rule or rule
    if problems:
        out.ok = False
        out.issue = f"Output mismatch (atol={atol:g}, rtol={rtol:g}): " + "; ".join(problems)
        if out.rule:
            out.issue = "; ".join(problems)
    return out


def same(a: Any, b: Any) -> bool:
    """Bitwise the same values (NaN equal to NaN), compared where the arrays are (no host copy)."""
    if hasattr(a, "__array_interface__") and hasattr(b, "__array_interface__"):  # NumPy: no torch needed
        import numpy as np

        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    import torch

    x, y = _torch(a), _torch(b)
    if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
        return False
    if x.device != y.device:
        y = y.to(x.device)
    if torch.equal(x, y):  # the common case, without temporaries (NaN never equals: looked at below)
        return True
    if x.is_floating_point() or x.is_complex():
        return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())
    return bool(torch.equal(x, y))
