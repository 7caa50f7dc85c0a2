"""Arrays as memory both sides of the channel map: descriptors, sealed memfds, views over them.

The sender's half of :mod:`.channel`'s arrays (the memory it shares, the descriptors that say where
an array lies in it) and the views both sides build over such memory. The checks of what a
descriptor may name, and everything the candidate's side could patch to attack the judge, stay in
:mod:`.channel`. A leaf: it imports nothing of the package, so the candidate's side may load it
through the channel.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
from typing import Any

import msgspec

__all__ = [
    "ALLOWED_DTYPES",
    "ArrayDesc",
    "Shared",
    "array_in",
    "contiguous_strides",
    "dtype_name",
    "element_size",
    "is_numpy",
    "is_torch",
    "memfd_array",
    "sealed_memfd",
    "span_of",
    "view_over",
]

#: the dtypes an array may have on either side (by name, torch's and numpy's alike)
ALLOWED_DTYPES = frozenset(
    [
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    ]
)
#: the least size of a memfd that inputs share (:meth:`Shared.place`)
_ARENA_BYTES = 64 << 20


class ArrayDesc(msgspec.Struct, kw_only=True):
    """One array as it crosses: where its memory is, and how to view it."""

    #: "torch" or "numpy"
    lib: str
    dtype: str
    shape: list[int]
    #: in elements
    strides: list[int]
    #: elements from the start of the memory below
    offset: int
    #: "memfd" (the message's fd number ``fd``), "cuda" (an IPC handle), or "input" (the memory of
    #: input array ``ref`` that the judge shared for this call: an output written in place)
    where: str
    nbytes: int = 0
    fd: int = -1
    ref: int = -1
    #: torch's ``UntypedStorage._share_cuda_()`` fields: device, handle, size, offset, ref-counter
    #: handle and offset, event handle, event sync required
    cuda: list[Any] = []


def dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_numpy(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


class Shared:
    """Arrays of one message: their descriptors, the fds that go with them, and the mappings kept
    alive while the other side may use them."""

    def __init__(self) -> None:
        self.arrays: list[Any] = []
        self.fds: list[int] = []
        self.keep: list[Any] = []
        #: the CUDA IPC counters of the arrays it shares (:func:`.cuda_ipc.held_of`)
        self.counters: list[tuple[bytes, int]] = []
        #: host arrays to pack into one memfd at :meth:`finish` (one file, not one per array)
        self.packed: list[tuple[ArrayDesc, Any, int]] = []
        self.packed_bytes = 0
        #: the memfd that :meth:`place` fills with inputs: (mapping, its fd's index, bytes used)
        self.arena: tuple[mmap.mmap, int, int] | None = None

    def place(self, nbytes: int) -> tuple[mmap.mmap, int, int]:
        """Room for ``nbytes`` in this message's input memory: (mapping, fd index, byte offset).
        Inputs share memfds of at least 64 MiB (sparse until written): a message may carry at
        most 253 descriptors, and a round's sets of a three-input problem are 300 arrays."""
        need = (max(1, nbytes) + 63) // 64 * 64  # every dtype's alignment
        if self.arena is None or self.arena[2] + need > self.arena[0].size():
            mm, index = self.region(max(_ARENA_BYTES, need), "krex-inputs")
            self.arena = (mm, index, 0)
        mm, index, used = self.arena
        self.arena = (mm, index, used + need)
        return mm, index, used

    def region(self, nbytes: int, name: str = "krex-set") -> tuple[mmap.mmap, int]:
        """A memfd of its own for this message: (the sender's mapping, its fd's index). Nothing
        else lies in it, so an array there reaches no other array of the message through its
        memory (a view past its end runs off the file)."""
        fd = sealed_memfd(name, max(1, nbytes))
        mm = mmap.mmap(fd, max(1, nbytes))
        self.fds.append(fd)
        self.keep.append(mm)
        return mm, len(self.fds) - 1

    def pack(self, desc: ArrayDesc, contiguous: Any) -> None:
        nbytes = int(contiguous.nbytes)
        self.packed.append((desc, contiguous, self.packed_bytes))
        self.packed_bytes += (nbytes + 63) // 64 * 64  # every dtype's alignment

    def finish(self) -> None:
        """The packed arrays copied into one memfd, their descriptors pointed at it."""
        if not self.packed:
            return
        arena, fd, mm = memfd_array("numpy", "uint8", [max(1, self.packed_bytes)])
        self.fds.append(fd)
        self.keep += [arena, mm]
        for desc, x, at in self.packed:
            raw = x.reshape(-1).view(__import__("torch").uint8).numpy() if is_torch(x) else x.reshape(-1).view("uint8")
            arena[at : at + raw.nbytes] = raw
            desc.fd = len(self.fds) - 1
            desc.offset = at // max(1, x.itemsize if not is_torch(x) else x.element_size())
            desc.nbytes = mm.size()
        self.packed = []

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def sealed_memfd(name: str, nbytes: int) -> int:
    """A memfd of ``nbytes`` whose size no process can change any more: the other side holds its
    fd too, and a file it shrank would kill the judge with SIGBUS on its next read."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def array_in(lib: str, dtype: str, shape: list[int], mm: mmap.mmap, index: int, at: int) -> tuple[ArrayDesc, Any]:
    """A contiguous array at byte ``at`` of a message's memfd ``index`` (mapped here as ``mm``):
    (its descriptor, the sender's own array over it)."""
    numel = 1
    for n in shape:
        numel *= int(n)
    itemsize = element_size(lib, dtype)
    arr = view_over(lib, dtype, shape, None, at // itemsize, mm, numel)
    desc = ArrayDesc(
        lib=lib,
        dtype=dtype,
        shape=[int(n) for n in shape],
        strides=contiguous_strides([int(n) for n in shape]),
        offset=at // itemsize,
        where="memfd",
        nbytes=mm.size(),
        fd=index,
    )
    return desc, arr


def memfd_array(lib: str, dtype: str, shape: list[int], fill: Any = None) -> tuple[Any, int, mmap.mmap]:
    """A new contiguous array over a memfd: (array, fd, mapping); ``fill`` copied in when given."""
    numel = 1
    for s in shape:
        numel *= int(s)
    itemsize = element_size(lib, dtype)
    nbytes = max(1, numel * itemsize)
    fd = sealed_memfd("krex-array", nbytes)
    mm = mmap.mmap(fd, nbytes)
    arr = view_over(lib, dtype, shape, None, 0, mm, numel)
    if fill is not None:
        if lib == "torch":
            arr.copy_(fill)
        else:
            arr[...] = fill
    return arr, fd, mm


@functools.lru_cache(maxsize=64)
def element_size(lib: str, dtype: str) -> int:
    if lib == "torch":
        import torch

        return int(torch.empty(0, dtype=getattr(torch, dtype)).element_size())
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def view_over(
    lib: str, dtype: str, shape: list[int], strides: list[int] | None, offset: int, mm: Any, numel: int
) -> Any:
    if lib == "torch":
        import torch

        flat = torch.frombuffer(mm, dtype=torch.uint8).view(getattr(torch, dtype))
        if strides is None:
            return flat[offset : offset + numel].view(shape)
        return flat.as_strided(shape, strides, offset)
    import numpy as np

    dt = np.dtype(dtype)
    host = np.frombuffer(mm, dtype=dt)
    if strides is None:
        return host[offset : offset + numel].reshape(shape)
    return np.lib.stride_tricks.as_strided(
        host[offset:], shape=shape, strides=[s * dt.itemsize for s in strides], writeable=True
    )


def contiguous_strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(1, int(s))
    return out[::-1]


def span_of(x: Any) -> tuple[int, int]:
    """The memory of ``x`` itself (an input the judge made: contiguous), not of what it views:
    inputs share memfds (:meth:`Shared.place`), and an output written into one must name that one."""
    if is_torch(x):
        start = int(x.data_ptr())
        return start, start + int(x.numel()) * int(x.element_size())
    start = int(x.__array_interface__["data"][0])
    return start, start + int(x.nbytes)
