"""Moved to :mod:`tests.support.pool`; this re-export stays until ``tests/workers/test_pool_wire.py``
imports from there."""

from tests.support.pool import PoolProc, alive, krex_run, python_run, shell_code

__all__ = ["PoolProc", "alive", "krex_run", "python_run", "shell_code"]
