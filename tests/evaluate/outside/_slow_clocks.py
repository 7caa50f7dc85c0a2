"""Shared by the cheats of this folder: every clock of the ``time`` module slowed 1000-fold in this
process (the harness's own clock included), so that its in-process figure is a thousandth of
the truth and only a figure from outside can tell."""

import sys
import time

SLOW = 1000


def _slowed(real, ns):
    origin = real()

    def fake():
        elapsed = real() - origin
        return origin + (elapsed // SLOW if ns else elapsed / SLOW)

    return fake


def install():
    swaps = {}
    for name in ("perf_counter", "monotonic", "time", "perf_counter_ns", "monotonic_ns", "time_ns"):
        real = getattr(time, name)
        swaps[id(real)] = _slowed(real, name.endswith("_ns"))
        setattr(time, name, swaps[id(real)])
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            for key, value in list(namespace.items()):
                if id(value) in swaps:
                    namespace[key] = swaps[id(value)]
