"""numba's CUDA simulator for this test process: call :func:`use_simulator` before numba.cuda is imported.

The environment variable stays set for the session: numba re-reads its configuration whenever
it compiles, and numba.cuda (simulator or not) is decided once, at its first import.
"""

from __future__ import annotations

import os
import sys

import pytest


def use_simulator() -> None:
    cuda = sys.modules.get("numba.cuda")
    if cuda is not None:
        if not hasattr(cuda, "FakeCUDAKernel"):
            pytest.skip("numba.cuda was imported without the CUDA simulator in this process")
        return
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if "numba" in sys.modules:
        from numba.core import config

        config.reload_config()
