"""Temporary alias of :mod:`krex_lab.workers.client.run_cli` for ``krex_lab/cli.py``, which imports
``.workers.run_cli``; delete this file once cli.py imports ``.workers.client.run_cli``."""

from .client.run_cli import add_arguments, run

__all__ = ["add_arguments", "run"]
