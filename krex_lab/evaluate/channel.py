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
changes only what it sends, and everything it sends is checked on the judge's side. The memory
arrays lie in (a message's memfds, the views over them) is :mod:`.array_memory`'s; what the
candidate's side could patch to attack the judge (``describe``, ``encode_tree``, ``Channel``) and
every check of what crosses stay here, so a patch reaches the same code by the same name.
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
from .array_memory import (
    ALLOWED_DTYPES,
    ArrayDesc,
    Shared,
    contiguous_strides,
    dtype_name,
    element_size,
    is_numpy,
    is_torch,
    span_of,
    view_over,
)
from .messages import Body

__all__ = [
    "ALLOWED_DTYPES",
    "ArrayDesc",
    "Channel",
    "ChannelError",
    "Envelope",
    "Shared",
    "decode_tree",
    "encode_tree",
]

_MAX_MESSAGE = 64 << 20
_MAX_FDS = 256


class ChannelError(Exception):
    """The other side broke the protocol, or went away."""


def spans(inputs: list[Any] | None) -> list[tuple[int, int, int]]:
    """(start, end, index) of the memory of each of ``inputs``, for :func:`describe`."""
    out = []
    for k, src in enumerate(inputs or ()):
        lo, hi = span_of(src)
        out.append((lo, hi, k))
    return out


def describe(x: Any, shared: Shared, inputs: list[tuple[int, int, int]] | None = None) -> ArrayDesc:
    """``x`` as a descriptor, its memory shared (sender side). An array that lies in one of
    ``inputs`` (:func:`spans` of memory the other side shared with us) is said as a view of it."""
    lib = "torch" if is_torch(x) else "numpy"
    dtype = dtype_name(x)
    shape = [int(s) for s in x.shape]
    strides = [int(s) for s in x.stride()] if lib == "torch" else [int(s) // max(1, x.itemsize) for s in x.strides]
    start = _data_ptr(x) if inputs else 0
    for lo, hi, k in inputs or ():
        if lo <= start < hi:
            elem = element_size(lib, dtype)
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
    desc = ArrayDesc(lib=lib, dtype=dtype, shape=shape, strides=contiguous_strides(shape), offset=0, where="memfd")
    shared.pack(desc, contiguous)
    return desc


def share_input(x: Any, shared: Shared) -> tuple[ArrayDesc, Any]:
    """An input the judge made, moved into memory both sides map (CPU: a memfd; GPU: the tensor's
    own allocation): (its descriptor, the judge's array over that memory)."""
    if is_torch(x) and x.is_cuda:
        x = x.contiguous()
        return describe(x, shared), x
    lib, dtype = ("torch" if is_torch(x) else "numpy"), dtype_name(x)
    shape = [int(s) for s in x.shape]
    numel = 1
    for n in shape:
        numel *= n
    itemsize = element_size(lib, dtype)
    mm, index, at = shared.place(numel * itemsize)
    arr = view_over(lib, dtype, shape, None, at // itemsize, mm, numel)
    if lib == "torch":
        arr.copy_(x)
    else:
        arr[...] = x
    shared.keep.append(arr)
    desc = ArrayDesc(
        lib=lib,
        dtype=dtype,
        shape=shape,
        strides=contiguous_strides(shape),
        offset=at // itemsize,
        where="memfd",
        nbytes=mm.size(),
        fd=index,
    )
    return desc, arr


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if hasattr(v, "__index__"):
        return int(v)
    return v


def _data_ptr(x: Any) -> int:
    if is_torch(x):
        return int(x.data_ptr())
    return int(x.__array_interface__["data"][0])


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
    itemsize = element_size(d.lib, d.dtype)
    span = d.offset + (1 + sum((n - 1) * s for n, s in zip(d.shape, d.strides) if n > 0) if numel else 0)
    if any(s < 0 for s in d.strides):
        raise ChannelError("negative strides are not accepted")
    if d.where == "input":
        if inputs is None or not 0 <= d.ref < len(inputs):
            raise ChannelError("an output names an input that was not shared")
        base = inputs[d.ref]
        lo, hi = span_of(base)
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
        return view_over(d.lib, d.dtype, d.shape, d.strides, d.offset, mm, numel)
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
    if is_torch(value) or is_numpy(value):
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
