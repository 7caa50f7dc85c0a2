"""devsync against the real numba.cuda (marker ``gpu``; skipped without a GPU or numba.cuda).

A drain's cooperative synchronise found no numba context on the H200 (2026-12-01): numba-cuda
keeps its device list's ``lst`` in a functools cache, not on the instance.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="needs numba with numba.cuda"),
]

CHILD = textwrap.dedent(
    """\
    import json, threading
    import numpy as np
    import krex_lab.kernels.spec  # the repo's numba-cuda vs NumPy 2.4 alias (np.row_stack), as candidates get it
    from numba import cuda
    from numba.cuda.cudadrv import driver
    from krex_lab import devsync
    before = devsync.numba_context() is None  # none yet, and none made by looking
    made = [d.primary_context for d in driver.driver.devices.values()]
    @cuda.jit
    def add_one(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1
    a = cuda.to_device(np.zeros(1 << 20, dtype=np.float32))
    add_one[1 << 12, 256](a)  # queued, not waited for: the drain's synchronise waits
    synced = []  # from another thread, as a drain's control thread does
    t = threading.Thread(target=lambda: synced.extend(devsync.synchronize_frameworks()))
    t.start()
    t.join()
    print(json.dumps({"before": before and not any(made), "found": devsync.numba_context() is not None,
                      "synced": synced}))
    """
)


def test_a_numba_context_is_found_and_synchronised() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"before": True, "found": True, "synced": ["numba"]}, seen
