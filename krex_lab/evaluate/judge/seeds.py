"""The seeds of the judge's input sets: each drawn alone from the operating system's CSPRNG.

A seed that follows from another (``base, base + 1, ...``) gives every later set away to a
candidate that learns one, from the judge's memory or from an input it can invert; so no seed
here follows from any other. A caller who asks for a reproducible run gives a seed: each set's
seed is then SHA-256 of it and the set's number (the run is as secret as the number chosen). The
timed rounds' sets are drawn from the CSPRNG even then (:meth:`Seeds.next` with ``secret``): a
candidate run again under the same seed would otherwise meet the same inputs, and an answer it
left in its build directory the first time would be timed as work. The seeds drawn are listed in
the result's record once the candidate's process is gone.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["Seeds"]


class Seeds:
    """The seeds of one evaluation's input sets, in the order they were drawn."""

    def __init__(self, given: int | None) -> None:
        self.given = given
        self.drawn: list[int] = []

    def next(self, secret: bool = False) -> int:
        """The next set's seed; ``secret``: from the CSPRNG, whatever seed was given."""
        if self.given is None or secret:
            seed = secrets.randbits(63)
        else:
            digest = hashlib.sha256(f"krex-inputs:{self.given}:{len(self.drawn)}".encode()).digest()
            seed = int.from_bytes(digest[:8], "big") >> 1
        self.drawn.append(seed)
        return seed
