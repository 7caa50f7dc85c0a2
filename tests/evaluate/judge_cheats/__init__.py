"""Hostile candidates against the judge's data path: each defines ``CHEAT = True`` once at module
level, and its honest twin is the same source with ``CHEAT = False``
(:func:`tests.evaluate.redteam.twin`). A cheat that observes what a defence should hide says so
on its stdout with a ``krex-saw:`` line (the result's ``output``), so a test can tell that the
defence held even where noise would blur a speed."""
