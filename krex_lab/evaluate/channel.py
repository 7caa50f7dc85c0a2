"""The judge <-> candidate channel: messages, and arrays that cross as memory, never as objects.

A socketpair carries length-prefixed msgpack of an operation's name, its body (a struct of
:mod:`.messages`, checked as it is read) and the descriptors of its arrays (never pickle: the judge
decodes nothing the candidate could shape into code). Arrays travel as descriptors that the
*receiver* turns into its own ``torch.Tensor`` / ``numpy.ndarray``: CUDA IPC handles on a GPU,
memfd file descriptors (``SCM_RIGHTS``) on the CPU. So the judge only ever holds objects of exact
types it built itself, over memory it can read; a subclass, a lazy tensor or a patched method of
the candidate's never crosses. Values are trees of tuples, lists, dicts, scalars and arrays
(``encode_tree`` / ``decode_tree``).

Both sides import this module; the candidate's copy may be patched in its own process, which
changes only what it sends, and everything it sends is checked on the judge's side.
"""

from __future__ import annotations

import functools
import mmap
import os
import socket
import struct
import sys
from typing import Any, TypeVar

import msgspec

from . import cuda_ipc
from .messages import Body

__all__ = [
    "ALLOWED_DTYPES",
    "ArrayDesc",
    "Channel",
    "ChannelError",
    "Envelope",
    "Shared",
    "array_in",
    "decode_tree",
    "encode_tree",
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
_MAX_MESSAGE = 64 << 20
_MAX_FDS = 256
#: the least size of a memfd that inputs share (:meth:`Shared.place`)
_ARENA_BYTES = 64 << 20


class ChannelError(Exception):
    """The other side broke the protocol, or went away."""


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


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_numpy(x: Any) -> bool:
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
            raw = x.reshape(-1).view(__import__("torch").uint8).numpy() if _is_torch(x) else x.reshape(-1).view("uint8")
            arena[at : at + raw.nbytes] = raw
            desc.fd = len(self.fds) - 1
            desc.offset = at // max(1, x.itemsize if not _is_torch(x) else x.element_size())
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
    itemsize = _itemsize(lib, dtype)
    arr = _view(lib, dtype, shape, None, at // itemsize, mm, numel)
    desc = ArrayDesc(
        lib=lib,
        dtype=dtype,
        shape=[int(n) for n in shape],
        strides=_contiguous_strides([int(n) for n in shape]),
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
    itemsize = _itemsize(lib, dtype)
    nbytes = max(1, numel * itemsize)
    fd = sealed_memfd("krex-array", nbytes)
    mm = mmap.mmap(fd, nbytes)
    arr = _view(lib, dtype, shape, None, 0, mm, numel)
    if fill is not None:
        if lib == "torch":
            arr.copy_(fill)
        else:
            arr[...] = fill
    return arr, fd, mm


@functools.lru_cache(maxsize=64)
def _itemsize(lib: str, dtype: str) -> int:
    if lib == "torch":
        import torch

        return int(torch.empty(0, dtype=getattr(torch, dtype)).element_size())
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def _view(lib: str, dtype: str, shape: list[int], strides: list[int] | None, offset: int, mm: Any, numel: int) -> Any:
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


def spans(inputs: list[Any] | None) -> list[tuple[int, int, int]]:
    """(start, end, index) of the memory of each of ``inputs``, for :func:`describe`."""
    out = []
    for k, src in enumerate(inputs or ()):
        lo, hi = _span(src)
        out.append((lo, hi, k))
    return out


def describe(x: Any, shared: Shared, inputs: list[tuple[int, int, int]] | None = None) -> ArrayDesc:
    """``x`` as a descriptor, its memory shared (sender side). An array that lies in one of
    ``inputs`` (:func:`spans` of memory the other side shared with us) is said as a view of it."""
    lib = "torch" if _is_torch(x) else "numpy"
    dtype = _dtype_name(x)
    shape = [int(s) for s in x.shape]
    strides = [int(s) for s in x.stride()] if lib == "torch" else [int(s) // max(1, x.itemsize) for s in x.strides]
    start = _data_ptr(x) if inputs else 0
    for lo, hi, k in inputs or ():
        if lo <= start < hi:
            elem = _itemsize(lib, dtype)
            return ArrayDesc(
                lib=lib, dtype=dtype, shape=shape, strides=strides, offset=(start - lo) // elem, where="input", ref=k
            )
    if lib == "torch" and x.is_cuda:
        storage = x.untyped_storage()
        fields = list(storage._share_cuda_())
        if (counter := cuda_ipc.note(fields)) is not None:  # taken back if the receiver dies holding it
            shared.counters.append(counter)
        shared.keep.append(x)
        return ArrayDesc(
            lib=lib,
            dtype=dtype,
            shape=shape,
            strides=strides,
            offset=int(x.storage_offset()),
            where="cuda",
            cuda=[_plain(f) for f in fields],
        )
    contiguous = x.detach().cpu().contiguous() if lib == "torch" else __import__("numpy").ascontiguousarray(x)
    desc = ArrayDesc(lib=lib, dtype=dtype, shape=shape, strides=_contiguous_strides(shape), offset=0, where="memfd")
    shared.pack(desc, contiguous)
    return desc


def share_input(x: Any, shared: Shared) -> tuple[ArrayDesc, Any]:
    """An input the judge made, moved into memory both sides map (CPU: a memfd; GPU: the tensor's
    own allocation): (its descriptor, the judge's array over that memory)."""
    if _is_torch(x) and x.is_cuda:
        x = x.contiguous()
        return describe(x, shared), x
    lib, dtype = ("torch" if _is_torch(x) else "numpy"), _dtype_name(x)
    shape = [int(s) for s in x.shape]
    numel = 1
    for n in shape:
        numel *= n
    itemsize = _itemsize(lib, dtype)
    mm, index, at = shared.place(numel * itemsize)
    arr = _view(lib, dtype, shape, None, at // itemsize, mm, numel)
    if lib == "torch":
        arr.copy_(x)
    else:
        arr[...] = x
    shared.keep.append(arr)
    desc = ArrayDesc(
        lib=lib,
        dtype=dtype,
        shape=shape,
        strides=_contiguous_strides(shape),
        offset=at // itemsize,
        where="memfd",
        nbytes=mm.size(),
        fd=index,
    )
    return desc, arr


def _contiguous_strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(1, int(s))
    return out[::-1]


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if hasattr(v, "__index__"):
        return int(v)
    return v


def _data_ptr(x: Any) -> int:
    if _is_torch(x):
        return int(x.data_ptr())
    return int(x.__array_interface__["data"][0])


def _span(x: Any) -> tuple[int, int]:
    """The memory of ``x`` itself (an input the judge made: contiguous), not of what it views:
    inputs share memfds (:meth:`Shared.place`), and an output written into one must name that one."""
    if _is_torch(x):
        start = int(x.data_ptr())
        return start, start + int(x.numel()) * int(x.element_size())
    start = int(x.__array_interface__["data"][0])
    return start, start + int(x.nbytes)


def open_arrays(descs: list[ArrayDesc], fds: list[int], inputs: list[Any] | None = None) -> list[Any]:
    """:func:`open_array` of each, one mapping per fd."""
    maps: dict[int, mmap.mmap] = {}
    return [open_array(d, fds, inputs, maps) for d in descs]


def open_array(
    d: ArrayDesc, fds: list[int], inputs: list[Any] | None = None, maps: dict[int, mmap.mmap] | None = None
) -> Any:
    """The receiver's own array for ``d``, over the memory it names. Checks every field: a
    descriptor that does not fit its memory is a :class:`ChannelError`."""
    if d.lib not in ("torch", "numpy") or d.dtype not in ALLOWED_DTYPES:
        raise ChannelError(f"an array of {d.lib} {d.dtype} is not accepted")
    if len(d.shape) != len(d.strides) or any(s < 0 for s in d.shape) or d.offset < 0 or len(d.shape) > 16:
        raise ChannelError("an array's shape, strides or offset do not fit together")
    numel = 1
    for s in d.shape:
        numel *= s
    itemsize = _itemsize(d.lib, d.dtype)
    span = d.offset + (1 + sum((n - 1) * s for n, s in zip(d.shape, d.strides) if n > 0) if numel else 0)
    if any(s < 0 for s in d.strides):
        raise ChannelError("negative strides are not accepted")
    if d.where == "input":
        if inputs is None or not 0 <= d.ref < len(inputs):
            raise ChannelError("an output names an input that was not shared")
        base = inputs[d.ref]
        lo, hi = _span(base)
        if (hi - lo) < span * itemsize:
            raise ChannelError("an output's view runs past the input it names")
        if d.lib == "torch":  # the offset is from the input's first element, on both sides
            return base.as_strided(d.shape, d.strides, base.storage_offset() + d.offset)
        import numpy as np

        flat = base.reshape(-1)
        return np.lib.stride_tricks.as_strided(
            flat[d.offset :], shape=d.shape, strides=[s * itemsize for s in d.strides]
        )
    if d.where == "memfd":
        if not 0 <= d.fd < len(fds):
            raise ChannelError("an array names a file descriptor the message did not carry")
        size = os.fstat(fds[d.fd]).st_size
        if size < span * itemsize or size < 1:
            raise ChannelError("an array runs past its memory")
        mm = maps.get(d.fd) if maps is not None else None
        if mm is None:
            mm = mmap.mmap(fds[d.fd], size)
            if maps is not None:
                maps[d.fd] = mm
        return _view(d.lib, d.dtype, d.shape, d.strides, d.offset, mm, numel)
    if d.where == "cuda" and d.lib == "torch":
        import torch
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        if len(d.cuda) != 8:
            raise ChannelError("a CUDA array's handle is malformed")
        dev, handle, size, off, rc_handle, rc_off, ev_handle, ev_sync = d.cuda
        if not (isinstance(handle, bytes) and isinstance(size, int) and size >= span * itemsize):
            raise ChannelError("a CUDA array runs past its memory")
        return rebuild_cuda_tensor(
            torch.Tensor,
            torch.Size(d.shape),
            tuple(d.strides),
            d.offset,
            torch.storage.TypedStorage,
            getattr(torch, d.dtype),
            int(dev),
            handle,
            size,
            int(off),
            False,
            rc_handle,
            int(rc_off),
            ev_handle,
            bool(ev_sync),
        )
    raise ChannelError(f"an array's memory is of an unknown kind {d.where!r}")


def encode_tree(value: Any, shared: Shared, inputs: list[tuple[int, int, int]] | None = None) -> Any:
    """``value`` as plain data: ``["a", k]`` for the k-th array of ``shared.arrays``, ``["t", ...]``
    tuples, ``["l", ...]`` lists, ``["d", {...}]`` dicts (string keys), ``["v", x]`` scalars."""
    if _is_torch(value) or _is_numpy(value):
        shared.arrays.append(describe(value, shared, inputs))
        return ["a", len(shared.arrays) - 1]
    if isinstance(value, tuple):
        return ["t", [encode_tree(v, shared, inputs) for v in value]]
    if isinstance(value, list):
        return ["l", [encode_tree(v, shared, inputs) for v in value]]
    if isinstance(value, dict):
        return ["d", {str(k): encode_tree(v, shared, inputs) for k, v in value.items()}]
    if value is None or type(value) in (bool, int, float, str):
        return ["v", value]
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.generic):
        return ["v", value.item()]
    raise ChannelError(f"a value of type {type(value).__name__} cannot cross (arrays, scalars, tuples, lists, dicts)")


def decode_tree(tree: Any, arrays: list[Any], depth: int = 0) -> Any:
    """The value :func:`encode_tree` described, over the receiver's own ``arrays``."""
    if depth > 32 or not (isinstance(tree, list) and len(tree) == 2 and isinstance(tree[0], str)):
        raise ChannelError("a value tree is malformed")
    tag, body = tree
    if tag == "a":
        if not (isinstance(body, int) and 0 <= body < len(arrays)):
            raise ChannelError("a value names an array that did not cross")
        return arrays[body]
    if tag == "v":
        if body is not None and type(body) not in (bool, int, float, str):
            raise ChannelError("a scalar is of a type that cannot cross")
        return body
    if tag in ("t", "l") and isinstance(body, list):
        items = [decode_tree(v, arrays, depth + 1) for v in body]
        return tuple(items) if tag == "t" else items
    if tag == "d" and isinstance(body, dict):
        return {str(k): decode_tree(v, arrays, depth + 1) for k, v in body.items()}
    raise ChannelError("a value tree is malformed")


# -- the socket -------------------------------------------------------------------------------------


B = TypeVar("B", bound=Body)


class Envelope(msgspec.Struct, kw_only=True):
    """One message as it arrived: its operation, its body still unread (:meth:`read` checks it
    against the operation's struct, :mod:`.messages`), and the arrays it carries."""

    op: str
    body: msgspec.Raw
    arrays: list[ArrayDesc] = []

    def read(self, kind: type[B]) -> B:
        """The body, as ``kind`` (the operation expected): any other operation, or a body of
        another shape, is a :class:`ChannelError` that says which."""
        if self.op != kind.op:
            raise ChannelError(f"a {kind.op!r} message was expected, not {self.op[:64]!r}")
        try:
            return _body_decoder(kind).decode(self.body)
        except msgspec.DecodeError as exc:
            raise ChannelError(f"a {self.op!r} message's body is malformed: {str(exc)[:500]}") from None


class _Outgoing(msgspec.Struct, kw_only=True):
    op: str
    body: Body
    arrays: list[ArrayDesc] = []


@functools.cache
def _body_decoder(kind: type[B]) -> msgspec.msgpack.Decoder[B]:
    return msgspec.msgpack.Decoder(kind)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)


class Channel:
    """One end of the judge <-> candidate socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, body: Body, shared: Shared | None = None) -> None:
        """``body`` (its operation's struct, :mod:`.messages`) and the arrays of ``shared``."""
        if shared is not None:
            shared.finish()
        data = _encoder.encode(_Outgoing(op=body.op, body=body, arrays=shared.arrays if shared else []))
        header = struct.pack("!I", len(data))
        fds = shared.fds if shared else []
        if fds:  # the fds ride on the header's first byte; the body follows as plain stream data
            socket.send_fds(self.sock, [header], fds)
            self.sock.sendall(data)
        else:
            self.sock.sendall(header + data)

    def recv(self) -> tuple[Envelope, list[int]]:
        """The next message and the fds that came with it (the caller closes them)."""
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, 4, _MAX_FDS)
        if len(msg) < 4:
            head = msg + self._exact(4 - len(msg)) if msg else b""
            if not head:
                for fd in fds:
                    os.close(fd)
                raise ChannelError("the other side closed the channel")
            msg = head
        (size,) = struct.unpack("!I", msg[:4])
        if size > _MAX_MESSAGE:
            raise ChannelError(f"a message of {size} bytes is over the limit")
        try:
            return _decoder.decode(self._exact(size)), fds
        except msgspec.DecodeError as exc:
            for fd in fds:
                os.close(fd)
            raise ChannelError(f"a message could not be read: {exc}") from None

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            part = self.sock.recv(n - len(buf))
            if not part:
                raise ChannelError("the other side closed the channel")
            buf += part
        return bytes(buf)
