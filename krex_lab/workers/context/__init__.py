"""Inside a context worker process: the main loop (:mod:`.worker`), how a job runs
(:mod:`.runner`) and how the process returns to its baseline between jobs (:mod:`.reset`).

Started by the pool as ``python -u -m krex_lab.workers.context FD``; nothing here runs in the
pool or in a client.
"""
