"""GPU memory this process shared by torch's CUDA IPC, taken back once its receiver is dead.

torch keeps memory it sent alive until the receiving process lets go of it: every send puts a
counter, set to 1, in a shared-memory file of the sender's (``/dev/shm/torch_…``), and the receiver
decrements it when it frees its view. A receiver killed while holding a view never decrements,
and torch then keeps the memory for the sender's whole life: its ``ipc_collect`` frees only what
reached zero. The judge kills its candidate at the end of every evaluation, and a candidate that
keeps its inputs (a cache of its own, a crash, a hang) holds its last round's sets there; each
evaluation then left gigabytes allocated in the judge, until a later evaluation ran out of memory.

So the sender notes every counter it hands out (:func:`note`, from the channel's ``describe``),
and once no process that received them is alive, sets them to zero (:func:`take_back`): torch's
``ipc_collect`` frees the memory then. The counters' place in the file is torch's layout
(``at::RefcountedMapAllocator``: a 64-byte header, then the int64 counters); :func:`note` checks it
on the first counter it sees, which torch has just set to 1, and notes nothing where it differs
(the memory is then kept as torch keeps it, and :func:`status` says why).

A leaf: the candidate's side imports the channel, which imports this.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from typing import Any, NamedTuple

__all__ = ["collect", "held", "held_of", "note", "status", "take_back"]

#: at::RefcountedMapAllocator's header, in front of the counters
_HEADER = 64
_COUNTER = struct.Struct("<q")
#: where shm_open puts torch's files
SHM_DIR = "/dev/shm"

_lock = threading.Lock()
_sent: list[tuple[bytes, int]] = []


class _Layout:
    """Whether the counters lie where this module reads them (None: not checked yet), and why not."""

    ok: bool | None = None
    why = ""


class Status(NamedTuple):
    """Counters noted and not taken back; whether their layout was recognised, and why not."""

    noted: int
    layout_ok: bool | None
    why: str


_layout = _Layout()


def _path(handle: bytes) -> str:
    return os.path.join(SHM_DIR, handle.decode("ascii", "replace").lstrip("/"))


def _counters(handle: bytes, offsets: list[int], value: int | None) -> list[int | None]:
    """The counters at ``offsets`` of ``handle``'s file (None: not there), each set to ``value``
    where it is given."""
    try:
        fd = os.open(_path(handle), os.O_RDWR)
    except OSError:
        return [None] * len(offsets)
    try:
        size = os.fstat(fd).st_size
        if size < _HEADER + _COUNTER.size:
            return [None] * len(offsets)
        out: list[int | None] = []
        with mmap.mmap(fd, size) as mm:
            for off in offsets:
                at = _HEADER + _COUNTER.size * off
                if off < 0 or at + _COUNTER.size > size:
                    out.append(None)
                    continue
                out.append(_COUNTER.unpack_from(mm, at)[0])
                if value is not None:
                    _COUNTER.pack_into(mm, at, value)
        return out
    finally:
        os.close(fd)


def note(fields: list[Any] | tuple[Any, ...]) -> tuple[bytes, int] | None:
    """A share just made: ``storage._share_cuda_()``'s fields, whose 5th and 6th are the counter's
    file and place. Its counter is remembered for :func:`take_back`, and returned (None: fields
    of another shape) for :func:`held_of`."""
    if len(fields) != 8 or not isinstance(fields[4], bytes) or not isinstance(fields[5], int):
        return None
    handle, offset = fields[4], fields[5]
    with _lock:
        if _layout.ok is None:
            (value,) = _counters(handle, [offset], None)
            _layout.ok = value == 1  # torch sets a new counter to 1 before handing it out
            if not _layout.ok:
                _layout.why = (
                    f"torch's CUDA IPC counter file {_path(handle)} does not hold 1 where a new "
                    f"counter should be (found {value!r}): memory a dead receiver held is kept"
                )
        if _layout.ok:
            _sent.append((handle, offset))
    return handle, offset


def take_back() -> int:
    """Every counter noted so far set to zero, and forgotten: call it only when no process that
    received them is alive. How many were still held (memory a dead receiver never let go)."""
    with _lock:
        sent = list(_sent)
        _sent.clear()
    return _count_held(sent, 0)


def held() -> int:
    """How many counters noted so far a receiver still holds (read, never changed): the shares
    whose memory torch keeps for a live receiver. The judge's memory trace between rounds."""
    with _lock:
        sent = list(_sent)
    return _count_held(sent, None)


def held_of(counters: list[tuple[bytes, int]]) -> int:
    """How many of ``counters`` (as :func:`note` returned them; a storage shared twice has one) a
    receiver still holds: the shares of one message that its receiver has not let go of."""
    return _count_held(counters, None)


def _count_held(sent: list[tuple[bytes, int]], value: int | None) -> int:
    """How many of ``sent``'s counters are not zero, each file opened once (each then set to
    ``value`` where it is given)."""
    by_file: dict[bytes, set[int]] = {}
    for handle, offset in sent:  # a storage shared twice has one counter: counted once
        by_file.setdefault(handle, set()).add(offset)
    return sum(1 for handle, offsets in by_file.items() for v in _counters(handle, sorted(offsets), value) if v)


def status() -> Status:
    """Counters noted and not taken back, and whether the counters' layout was recognised."""
    with _lock:
        return Status(len(_sent), _layout.ok, _layout.why)


def collect() -> None:
    """Memory this process's torch no longer uses given back to the device: what receivers let go
    of (``ipc_collect``), then every cached block (``empty_cache``).

    The second matters for the judge's input sets, each in a memory pool of its own. A set's pool is
    dropped while its receiver still maps the set (until the receiver has the next round's), so its
    memory is freed later, into the cache of a pool that no one uses any more. torch gives such
    blocks back only at ``empty_cache``: not when an allocation in another pool runs out (the
    judge allocates every set inside a pool), so without it each round left its sets' size reserved
    and a case of 1 GiB sets ran the GPU out of memory in about 64 rounds."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    try:
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()
    except Exception:  # a device in error says so at its next use
        pass
