"""Parts that several cheats of this corpus share (imported by name from this folder, which is on
the candidate's import path; never by an honest twin, which runs as source text):

* :func:`slow_clocks`: every clock of the ``time`` module slowed 1000-fold in this process, in
  ``time`` itself and in every module that imported one by name (the harness's own clock
  included): an in-process figure is then a thousandth of the truth, and only a figure from
  outside can tell;
* :func:`in_exited_thread`: the call's work done in a thread that has exited before any clock
  reads (an accounting of the process's live threads misses it).
"""

import sys
import threading
import time

SLOW = 1000


def _slowed(real, ns):
    origin = real()

    def fake():
        elapsed = real() - origin
        return origin + (elapsed // SLOW if ns else elapsed / SLOW)

    return fake


def slow_clocks():
    swaps = {}
    for name in ("perf_counter", "monotonic", "time", "perf_counter_ns", "monotonic_ns", "time_ns"):
        real = getattr(time, name)
        swaps[id(real)] = _slowed(real, name.endswith("_ns"))
        setattr(time, name, swaps[id(real)])
    for module in list(sys.modules.values()):  # from time import perf_counter: rebind those too
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            for key, value in list(namespace.items()):
                if id(value) in swaps:
                    namespace[key] = swaps[id(value)]


def in_exited_thread(work, *args):
    """``work(*args)`` run in a thread of its own, joined (so exited) before this returns."""
    box = []
    t = threading.Thread(target=lambda: box.append(work(*args)))
    t.start()
    t.join()
    return box[0]
