"""A kernel stopped by another session's region (``krex exclusive`` from a shell, on the kernel's
GPU) cannot start a cell until it is resumed: a ``%%krex_exclusive`` cell sent meanwhile then gets
its region at once, and its report must say how long the kernel was stopped, not only the few ms
its own request waited. A real arbiter, a real kernel, a real ``krex exclusive``."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import pytest

from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc

from . import test_kernels
from .test_kernels import Kernels, pid_of, run, text

kernels = test_kernels.kernels  # fixtures
krex_spec = test_kernels.krex_spec

pytestmark = pytest.mark.timeout(120)


async def test_a_cell_sent_while_the_kernel_was_stopped_says_so(arbiter: ArbiterProc, kernels: Kernels) -> None:
    ((km, kc),) = await kernels.start(1, {"KREX_GPU": "0"})
    pid = pid_of(km)
    assert pid
    holder = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--gpu", "0", "--", "sleep", "3"],
        env=arbiter.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stderr is not None and holder.stderr.readline().startswith("KREX region")
        t0 = time.monotonic()
        while proc_state(pid) != "T":
            assert time.monotonic() - t0 < 10, "the kernel is never stopped by the shell's region"
            await asyncio.sleep(0.01)
        sent = time.monotonic()
        reply, outputs = await run(kc, "%%krex_exclusive --gpu 0\n6 * 7")
        took = time.monotonic() - sent
        assert holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert reply["status"] == "ok", reply
    said = text(outputs)
    assert took > 1.5, took  # the cell did wait for the shell's region
    found = re.search(r"stopped (\d+\.\d) ms by another region before it queued", said)
    assert found, said
    assert float(found.group(1)) / 1e3 >= took - 1.0, (said, took)
