"""``python -u -m krex_lab.workers.context FD``: a context worker (started by the pool only)."""

from .worker import main

main()
