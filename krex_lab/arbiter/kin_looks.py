"""A thawed region's frozen ancestors, looked at again: a parent whose own stop landed after the
thaw is continued (:func:`~krex_lab.enforcement.freeze.continue_kin`).

The :class:`~.scheduler.Scheduler` owns one and calls :meth:`KinLooks.look` on its event loop at
each release that stopped kin.
"""

from __future__ import annotations

import asyncio

from ..enforcement.freeze import continue_kin

#: seconds after a thaw at which the frozen processes' ancestors are looked at again
KIN_LOOKS = (0.05, 0.5)


class KinLooks:
    """The ancestors due a look at each of :data:`KIN_LOOKS`, and the timer of each look."""

    def __init__(self) -> None:
        self._due: list[tuple[dict[int, int], set[int], dict[int, tuple[int, int | None]]]] = [
            ({}, set(), {}) for _ in KIN_LOOKS
        ]
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def look(self, look: int, kin: dict[int, int], first: set[int], up: dict[int, tuple[int, int | None]]) -> None:
        """Look at ``kin`` again at the ``look``-th of :data:`KIN_LOOKS` after now (``first`` and
        ``up``: see :func:`continue_kin`). The looks of every region due meanwhile are one batch,
        one timer: at hundreds of regions a second, two timers and two reads of the same shared
        ancestors a region cost more than the region's freeze (scale.py)."""
        due = self._due[look]
        due[0].update(kin)
        due[1].update(first)
        due[2].update(up)
        if look not in self._timers:
            wait = KIN_LOOKS[look] - (KIN_LOOKS[look - 1] if look else 0.0)
            self._timers[look] = asyncio.get_running_loop().call_later(wait, self._looked, look)

    def _looked(self, look: int) -> None:
        del self._timers[look]
        (kin, first, up), self._due[look] = self._due[look], ({}, set(), {})
        continue_kin(kin, first, up)
        if look + 1 < len(KIN_LOOKS):
            self.look(look + 1, kin, first, up)
