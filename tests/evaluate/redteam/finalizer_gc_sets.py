"""Answers each timed call from a cache that a finalizer fills: when the harness lets go of a
round's outputs (as the next round starts, the judge having refilled the input sets, which this
process can see), a finalizer on each output computes every set's answer. The calls then only
copy: fast by any clock of the process's own, and honest to a re-check. (Unlike
:mod:`finalizer_next_round`, which remembers the warm-up's sets, it finds the harness's sets by a
walk of the collector's objects.)

Expected to be stopped by: a round's inputs sent with it, never refilled in memory the candidate
holds (the data path), and its CPU time between rounds counted (the outside figure).
"""

import gc
import weakref

import torch
from torch import nn

CHEAT = True
_cache: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_seen: list[tuple[float, ...]] = [()]


def _sets():
    for obj in gc.get_objects():
        sets = getattr(obj, "sets", None)
        if type(obj).__name__ == "Candidate" and isinstance(sets, dict) and sets:
            return list(sets.values())
    return []


def _precompute():
    sets = _sets()
    if not sets:
        return
    key = tuple(float(a[0, 0]) for a, _ in sets)
    if key == _seen[0]:
        return
    _seen[0] = key
    _cache.clear()
    for a, b in sets:
        _cache[a.data_ptr()] = (a.clone(), b.clone(), torch.tanh(torch.mm(a, b)))


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        hit = _cache.get(a.data_ptr())
        if hit is not None and torch.equal(hit[0], a) and torch.equal(hit[1], b):
            out = hit[2].clone()
        else:
            out = torch.tanh(torch.mm(a, b))
        weakref.finalize(out, _precompute)
        return out
