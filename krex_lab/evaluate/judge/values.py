"""The judge's side of what crosses to the candidate: value trees with the judge's own arrays
numbered in message order, the judge's own copies of what comes back, and the candidate's
failure as the judge states it. Used by :mod:`.session` (calls) and :mod:`.rounds` (timing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..channel import Shared, encode_tree

__all__ = ["CandidateFailed", "own", "replace_arrays", "tree_of"]


class CandidateFailed(Exception):
    """The candidate's process raised, died or broke the protocol: ``verdict`` and ``key`` say how."""

    def __init__(
        self,
        verdict: str,
        key: str,
        message: str,
        reasons: dict[str, str] | None = None,
        figures: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.verdict, self.key, self.message = verdict, key, message
        #: a ``rejected`` verdict's reasons (``metadata.rejected``)
        self.reasons = reasons or {}
        #: what the judge measured of the failure itself (metadata beside the message)
        self.figures = figures or {}

    def record(self, result: Any) -> None:
        """Into a phase's result: its verdict, message, reasons and figures."""
        result.fail(self.verdict, self.key, self.message)
        if self.reasons:
            result.metadata["rejected"] = dict(self.reasons)
        result.metadata.update(self.figures)


def own(value: Any) -> Any:
    """The judge's own copy of an output it received (the candidate's memory is let go)."""

    def copy(x: Any) -> Any:
        return x.clone() if hasattr(x, "clone") else x.copy()

    from .tensors import _map

    return _map(value, copy)


def tree_of(value: Any, ids: Iterator[int]) -> Any:
    """``value``'s tree for the channel, its arrays numbered in order (the shared message's)."""
    from .tensors import _is_array

    if _is_array(value):
        return ["a", next(ids)]
    if isinstance(value, tuple):
        return ["t", [tree_of(v, ids) for v in value]]
    if isinstance(value, list):
        return ["l", [tree_of(v, ids) for v in value]]
    if isinstance(value, dict):
        return ["d", {str(k): tree_of(v, ids) for k, v in value.items()}]
    return encode_tree(value, Shared())


def replace_arrays(value: Any, mine: Iterator[Any]) -> Any:
    from .tensors import _map

    return _map(value, lambda _x: next(mine))
