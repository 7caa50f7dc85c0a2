"""The judge's memory for one call: the inputs it shares and the output buffers it owns.

Each input set (one call's inputs) lies in memory of its own: on a CPU a memfd of its own, sealed
against resizing, holding the set's inputs and its output buffers and nothing else; on a GPU a
CUDA memory pool of its own, so that the allocation a CUDA IPC handle opens holds that set alone
(a handle opens a whole allocation, and torch's allocator packs many tensors into one). No view of
one set, strided past its end, reaches another set, a pristine copy or a reference output.

The output buffers take the reference's layout (:func:`out_spec`): the candidate's side copies its
return value into them before the call is over (:mod:`..candidate.outputs`); the judge poisons
them before each call and, after it, reads only them, into copies of its own (:meth:`CallSet.read`),
never an object of the candidate's. Memory a round used is freed after the round
(:meth:`CallSet.release`), even where the candidate's process still maps it.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
from dataclasses import dataclass, field
from typing import Any

from ..array_memory import array_in
from ..channel import Shared, describe
from ..messages import CallEntry
from .tensors import _is_array, _is_torch, arrays
from .values import replace_arrays, tree_of

__all__ = ["CallSet", "OutSpec", "device_footprint", "out_spec", "set_bytes", "share_set"]

_ALIGN = 64
#: torch's CUDA allocator: requests up to 1 MiB share 2 MiB segments, requests under 10 MiB take a
#: 20 MiB segment, larger ones a segment of their size in 2 MiB steps
_MB = 1 << 20


def _slab_bytes(nbytes: int) -> int:
    """The request for a set's CUDA slab of ``nbytes``: sized so that its segment wastes least (a
    request between 1 and 10 MiB asked as 10 MiB gets a 10 MiB segment, not a 20 MiB one)."""
    return nbytes if nbytes <= _MB or nbytes >= 10 * _MB else 10 * _MB


def device_footprint(nbytes: int) -> int:
    """The GPU memory a set's slab of ``nbytes`` holds (its segment: the pool is the set's own)."""
    if nbytes <= 0:
        return 0
    if nbytes <= _MB:
        return 2 * _MB
    return (_slab_bytes(nbytes) + 2 * _MB - 1) // (2 * _MB) * (2 * _MB)


@dataclass
class OutSpec:
    """The reference's output as buffers: per leaf ``(lib, dtype, shape, device)`` or None (a
    plain scalar, which crosses as a value), and its structure (``["a", k]`` / ``["s", k]`` leaves)."""

    leaves: list[tuple[str, str, list[int], str] | None]
    tree: Any

    @property
    def nbytes(self) -> int:
        total = 0
        for leaf in self.leaves:
            if leaf is not None:
                numel = 1
                for n in leaf[2]:
                    numel *= n
                total += numel * _itemsize(leaf[0], leaf[1])
        return total


def _itemsize(lib: str, dtype: str) -> int:
    from ..array_memory import element_size as size

    return size(lib, dtype)


def out_spec(expected: Any) -> OutSpec:
    """The buffers a call's output takes, from the reference's answer."""
    leaves: list[tuple[str, str, list[int], str] | None] = []

    def walk(v: Any, depth: int = 0) -> Any:
        if _is_array(v):
            lib = "torch" if _is_torch(v) else "numpy"
            device = str(v.device.type) if lib == "torch" else "cpu"
            leaves.append((lib, str(v.dtype).replace("torch.", ""), [int(n) for n in v.shape], device))
            return ["a", len(leaves) - 1]
        if isinstance(v, (tuple, list)) and depth < 32:
            return ["t" if isinstance(v, tuple) else "l", [walk(x, depth + 1) for x in v]]
        if isinstance(v, dict) and depth < 32:
            return ["d", {k: walk(x, depth + 1) for k, x in v.items()}]
        leaves.append(None)
        return ["s", len(leaves) - 1]

    tree = walk(expected)
    return OutSpec(leaves=leaves, tree=tree)


def _build(tree: Any, leaves: list[Any]) -> Any:
    tag, body = tree
    if tag in ("a", "s"):
        return leaves[body]
    if tag == "t":
        return tuple(_build(t, leaves) for t in body)
    if tag == "l":
        return [_build(t, leaves) for t in body]
    return {k: _build(t, leaves) for k, t in body.items()}


@dataclass
class CallSet:
    """One call's memory: the judge's views of its shared inputs and of its output buffers."""

    inputs: list[Any]
    outs: list[Any]
    spec: OutSpec
    #: what the message says of it: ``args`` (tree), ``outs`` (a leaf each), ``ins`` (input arrays)
    entry: CallEntry
    #: the arguments as the judge's arrays over the shared memory
    args: Any = None
    #: the memfd mapping or CUDA memory pool behind it, released with it
    memory: list[Any] = field(default_factory=list)

    def poison(self) -> None:
        """NaN (an integer's largest value) in every output buffer: a call that does not write its
        answer there leaves the judge an answer no reference gives."""
        for b in self.outs:
            if b is None:
                continue
            if _is_torch(b):
                import torch

                if b.is_floating_point() or b.is_complex():
                    b.fill_(float("nan"))
                elif b.dtype != torch.bool:
                    b.fill_(torch.iinfo(b.dtype).max)
            else:
                import numpy as np

                if b.dtype.kind in "fc":
                    b.fill(np.nan)
                elif b.dtype.kind in "iu":
                    b.fill(np.iinfo(b.dtype).max)

    def read(self, values: Any) -> Any:
        """The call's output as the judge's own copies of its buffers, in the reference's structure,
        with the scalars it said (``values``: plain msgpack values, one per scalar leaf)."""
        vals = list(values) if isinstance(values, list) else []
        leaves: list[Any] = []
        for b in self.outs:
            if b is None:
                v = vals.pop(0) if vals else None
                leaves.append(v if type(v) in (bool, int, float, str, type(None)) else None)
            else:
                leaves.append(b.clone() if _is_torch(b) else b.copy())
        return _build(self.spec.tree, leaves)

    def release(self) -> None:
        """The set's memory freed now: a process that still maps it reads zeros there, never what
        the judge puts in its next sets (those are memory of their own)."""
        for m in self.memory:
            if isinstance(m, mmap.mmap):
                with contextlib.suppress(Exception):
                    m.madvise(mmap.MADV_REMOVE)
        self.memory = []
        self.inputs, self.outs, self.args = [], [], None


def _sizes(data_arrays: list[Any], spec: OutSpec) -> tuple[int, int]:
    """Bytes a set takes (host, device), each array aligned."""
    host = device = 0
    for x in data_arrays:
        size = (max(1, int(x.nbytes)) + _ALIGN - 1) // _ALIGN * _ALIGN
        if _is_torch(x) and x.is_cuda:
            device += size
        else:
            host += size
    for leaf in spec.leaves:
        if leaf is not None:
            numel = 1
            for n in leaf[2]:
                numel *= n
            size = (max(1, numel * _itemsize(leaf[0], leaf[1])) + _ALIGN - 1) // _ALIGN * _ALIGN
            if leaf[3] == "cpu":
                host += size
            else:
                device += size
    return host, device


def set_bytes(data: Any, spec: OutSpec) -> tuple[int, int]:
    """(host, device) bytes one set of ``data``'s shape takes in the memory it is shared in."""
    host, device = _sizes(list(arrays(data)), spec)
    return host, device_footprint(device)


class _Slab:
    """One memory of a set's, carved into aligned arrays: a memfd on the host, or a CUDA slab in a
    memory pool of the set's own (torch's allocator would otherwise pack it beside other tensors
    in an allocation that one IPC handle opens whole)."""

    def __init__(self, shared: Shared, nbytes: int, device: str | None, memory: list[Any]) -> None:
        self.shared, self.device, self.at = shared, device, 0
        if device is None:
            self.mm, self.index = shared.region(nbytes)
            memory.append(self.mm)
            return
        torch = sys.modules["torch"]
        cuda = torch.cuda
        pool = cuda.MemPool() if hasattr(cuda, "MemPool") and hasattr(cuda, "use_mem_pool") else None
        ctx = cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()
        with ctx:
            self.slab = torch.empty(_slab_bytes(nbytes), dtype=torch.uint8, device=device)
        memory += [self.slab, pool]

    def array(self, lib: str, dtype: str, shape: list[int]) -> tuple[Any, Any]:
        """(descriptor, the judge's array) of the next aligned array of this memory."""
        numel = 1
        for n in shape:
            numel *= n
        size = max(1, numel * _itemsize(lib, dtype))
        at = self.at
        self.at += (size + _ALIGN - 1) // _ALIGN * _ALIGN
        if self.device is None:
            return array_in(lib, dtype, shape, self.mm, self.index, at)
        torch = sys.modules["torch"]
        arr = self.slab[at : at + numel * _itemsize(lib, dtype)].view(getattr(torch, dtype)).view(shape)
        return describe(arr, self.shared), arr


def share_set(problem: Any, data: Any, spec: OutSpec, shared: Shared) -> CallSet:
    """``data`` (the judge's inputs of one call) moved into memory of its own with the call's output
    buffers, described in ``shared``: the :class:`CallSet`."""
    xs = list(arrays(data))
    memory: list[Any] = []
    host, device = _sizes(xs, spec)
    on_host = _Slab(shared, host, None, memory) if host else None
    on_device = None
    if device:
        cuda = next((str(x.device) for x in xs if _is_torch(x) and x.is_cuda), None)
        cuda = cuda or next((leaf[3] for leaf in spec.leaves if leaf is not None and leaf[3] != "cpu"), "cuda")
        on_device = _Slab(shared, device, cuda, memory)
    mine: list[Any] = []
    ins: list[int] = []
    outs: list[Any] = []
    out_refs: list[Any] = []
    for x in xs:
        lib = "torch" if _is_torch(x) else "numpy"
        where = on_device if lib == "torch" and x.is_cuda else on_host
        assert where is not None
        desc, arr = where.array(lib, str(x.dtype).replace("torch.", ""), [int(n) for n in x.shape])
        if lib == "torch":
            arr.copy_(x.detach())
        else:
            arr[...] = x
        shared.arrays.append(desc)
        ins.append(len(shared.arrays) - 1)
        mine.append(arr)
    for leaf in spec.leaves:
        if leaf is None:
            outs.append(None)
            out_refs.append(["v", None])
            continue
        lib, dtype, shape, dev = leaf
        where = on_host if dev == "cpu" else on_device
        assert where is not None
        desc, buf = where.array(lib, dtype, shape)
        shared.arrays.append(desc)
        outs.append(buf)
        out_refs.append(["a", len(shared.arrays) - 1])
    call_args = problem.args(data)
    entry = CallEntry(args=tree_of(call_args, iter(ins)), outs=out_refs, ins=ins)
    cs = CallSet(inputs=mine, outs=outs, spec=spec, entry=entry, memory=memory)
    cs.args = replace_arrays(call_args, iter(mine))
    cs.poison()
    return cs
