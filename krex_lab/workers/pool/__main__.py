"""``python -m krex_lab.workers.pool``: this user's pool service, in the foreground."""

from .app import main

main()
