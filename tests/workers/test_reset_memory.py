"""The reset's memory check waits a moment for freed GPU memory to show as free before it calls
the worker unclean (``reset.settled``): fed readings in order, as NVML would give them."""

from __future__ import annotations

import time
from collections.abc import Callable

from krex_lab.workers.context.reset import settled

BASE = {"process": 1000}


def grown(now: dict[str, int]) -> dict[str, int]:
    return {k: now[k] - v for k, v in BASE.items() if now.get(k, 0) > v + 100}


def readings(*values: int) -> tuple[list[int], Callable[[], dict[str, int]]]:
    calls: list[int] = []

    def read() -> dict[str, int]:
        calls.append(1)
        return {"process": values[min(len(calls) - 1, len(values) - 1)]}

    return calls, read


def test_memory_freed_a_moment_later_is_back() -> None:
    calls, read = readings(5000, 5000, 1050)
    assert settled(read, grown, 2.0) == {"process": 1050}
    assert len(calls) == 3


def test_memory_still_held_after_the_wait_is_reported() -> None:
    calls, read = readings(5000)
    t0 = time.monotonic()
    assert settled(read, grown, 0.2) == {"process": 5000}
    assert 0.2 <= time.monotonic() - t0 < 1.0
    assert len(calls) > 2


def test_memory_back_at_once_is_read_once() -> None:
    calls, read = readings(1000)
    assert settled(read, grown, 5.0) == {"process": 1000}
    assert len(calls) == 1
