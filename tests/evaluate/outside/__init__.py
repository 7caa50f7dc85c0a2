"""Hostile candidates that move their work where a clock of their own, or an accounting of their
live threads, does not see it (tests/evaluate/test_outside_time.py). Each defines ``CHEAT = True``
at module level; its honest twin is the same source with ``CHEAT = False``. They attack the
red-team corpus's ``kb_mm_tanh`` problem (tanh(a @ b), 256 x 256, about a millisecond a call)."""
