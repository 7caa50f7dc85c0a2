"""Pool <-> worker framing: length-prefixed msgpack maps over the socketpair between them."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import msgspec

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict)
_HEADER = struct.Struct(">I")

EncodeError = msgspec.EncodeError


def pack(msg: dict[str, Any]) -> bytes:
    body = _encoder.encode(msg)
    return _HEADER.pack(len(body)) + body


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """Blocking read of one frame (the worker's side); None at EOF."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _recv_exact(sock, size)
    if body is None:
        return None
    msg: dict[str, Any] = _decoder.decode(body)
    return msg


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """Asyncio read of one frame (the pool's side); None at EOF."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        msg: dict[str, Any] = _decoder.decode(await reader.readexactly(size))
        return msg
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
