"""The pool service process: one per user per node, owning that user's context workers.

:mod:`.service` (``Pool``: options, handlers, lifecycle), :mod:`.node` (what it knows of the node),
:mod:`.app` (``PoolApp``, ``main``), :mod:`.dispatcher` (queue, leases, workers' events),
:mod:`.sizing` (how many workers each GPU keeps), :mod:`.handle` (one worker process, as the
pool sees it), :mod:`.gates` (the arbiter's gate events), :mod:`.clients` (submitting processes
that exit). ``python -m krex_lab.workers.pool`` runs it.
"""

from .app import PoolApp, main
from .service import Pool

__all__ = ["Pool", "PoolApp", "main"]
