"""Fair share: which user's queued region goes next on a GPU, counting what each region costs
the others, not only how long it was held.

A region stops everyone else's work on its GPU for longer than it is held: its grant drains,
freezes and isolates the others, its release gives all that back. Counted by hold seconds
alone, many tiny regions never add up to one long one, and a user running back-to-back 2 ms
regions (with a request of theirs always queued) kept another user, who had once held the GPU
for 5 s, waiting as long as the loop ran. So:

* each region is charged its hold plus its own cost: the measured acquire and release, at least
  ``overhead`` seconds (``Quotas.region_overhead``); charges decay with ``half_life``;
* while others wait, the user who had the GPU's last region goes after them (a user gets at
  most one region per turn), and a request that another user's grant has passed over goes
  before those that have not: another user waits at most for the region in progress and for
  the turns of users who have used less;
* otherwise the user who used least goes first, first-come within a user. With one user it is
  the plain FIFO the single-user arbiter always had.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ..node_status import ShareRow
from .region import Region


class FairShare:
    """The scheduler's queue policy (see the module docstring)."""

    def __init__(self, half_life: float = 600.0, overhead: float = 0.02) -> None:
        self.half_life = half_life
        self.overhead = overhead
        self._usage: dict[int, tuple[float, float]] = {}  # uid -> (charged seconds, when)
        self._regions: dict[int, int] = {}  # uid -> regions charged
        self._names: dict[int, str] = {}
        #: the uid that had the last region granted on each GPU
        self.last: dict[int, int] = {}

    def usage(self, uid: int, now: float | None = None) -> float:
        seconds, when = self._usage.get(uid, (0.0, 0.0))
        now = time.monotonic() if now is None else now
        if self.half_life <= 0:
            return seconds
        return seconds * math.pow(0.5, (now - when) / self.half_life)

    def charge(self, uid: int, seconds: float, cost: float = 0.0, user: str = "") -> None:
        """Charge a finished region: ``seconds`` held, ``cost`` its measured acquire and release."""
        now = time.monotonic()
        charged = max(0.0, seconds) + max(cost, self.overhead)
        self._usage[uid] = (self.usage(uid, now) + charged, now)
        self._regions[uid] = self._regions.get(uid, 0) + 1
        if user:
            self._names[uid] = user

    def pick(self, queue: Sequence[Region]) -> Region:
        """The next region of ``queue`` (one GPU's); the others that another user's grant
        passes over are marked so (``Region.passed``)."""
        now = time.monotonic()
        first: dict[int, Region] = {}  # each user's earliest request competes
        for region in queue:
            first.setdefault(region.session.uid, region)
        candidates = list(first.values())
        gpu = queue[0].gpu
        last = self.last.get(gpu)
        if len(candidates) > 1:
            candidates = [r for r in candidates if r.session.uid != last] or candidates
        passed = [r for r in candidates if r.passed]
        if passed:
            chosen = min(passed, key=lambda r: r.requested)
        else:
            chosen = min(candidates, key=lambda r: (self.usage(r.session.uid, now), r.requested))
        self.last[gpu] = chosen.session.uid
        for region in queue:
            if region.session.uid != chosen.session.uid:
                region.passed += 1
        return chosen

    def table(self) -> list[ShareRow]:
        """Each user's charge now, most first (``krex status``)."""
        now = time.monotonic()
        rows = [
            ShareRow(
                uid=uid,
                user=self._names.get(uid, str(uid)),
                charged_s=round(self.usage(uid, now), 3),
                regions=self._regions.get(uid, 0),
            )
            for uid in self._usage
        ]
        return sorted(rows, key=lambda r: -r.charged_s)
