"""Helpers shared by the problems of this directory, laid out as ``utils.py`` beside each submission
(each task.yml lists it as ``../utils.py``, as published GPU MODE problems share theirs)."""

import torch


def mismatches(received: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, show: int = 3) -> list[str]:
    """What differs, first few elements named; empty when every element is within tolerance."""
    if received.shape != expected.shape:
        return [f"shape {tuple(received.shape)}, expected {tuple(expected.shape)}"]
    bad = ~torch.isclose(received, expected, rtol=rtol, atol=atol, equal_nan=True)
    count = int(bad.sum())
    if not count:
        return []
    out = [f"{count} element(s) differ"]
    for index in bad.nonzero()[:show].tolist():
        at = tuple(index)
        out.append(f"at {at}: {received[at].item():.6g} != {expected[at].item():.6g}")
    return out


def checker_of(reference, rtol: float = 1e-5, atol: float = 1e-6):
    """A ``check_implementation`` comparing with ``reference``'s answer on a copy of the data."""

    def check(data, output):
        expected = reference(tuple(x.clone() for x in data))
        found = mismatches(output, expected, rtol, atol)
        return (False, "; ".join(found)) if found else (True, "")

    return check
