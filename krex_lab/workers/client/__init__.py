"""Talking to this user's pool from any process: :class:`PoolClient`, :func:`submit`
(:mod:`.pool_client`) and ``krex run`` (:mod:`.run_cli`)."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` costs `krex run`'s start; the checker alone reads these names
if TYPE_CHECKING:
    from typing import Any

    from .pool_client import PoolClient, default_client, exception_of, print_output, submit

__all__ = ["PoolClient", "default_client", "exception_of", "print_output", "submit"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `krex`'s argument parser (it imports .run_cli) does not load zmq and msgspec.
    if name in __all__:
        from . import pool_client

        return getattr(pool_client, name)
    raise AttributeError(f"module 'krex_lab.workers.client' has no attribute {name!r}")
