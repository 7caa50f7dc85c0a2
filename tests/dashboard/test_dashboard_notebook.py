"""``notebooks/03_dashboard.ipynb`` run for real (nbclient, ``krex`` kernel, fake-backend arbiter) shows
a working dashboard, and the region loops it starts stop quietly when the kernel is interrupted,
leaving no zombie behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from krex_lab.pytest_plugin import ArbiterProc
from tests import test_kernels
from tests.support import ROOT

krex_spec = test_kernels.krex_spec  # fixture

pytestmark = pytest.mark.timeout(150)

NOTEBOOK = ROOT / "notebooks" / "03_dashboard.ipynb"


def _texts(cell: Any, kinds: tuple[str, ...] = ("stream", "execute_result", "display_data")) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] not in kinds:
            continue
        out.append(o["text"] if o["output_type"] == "stream" else o.get("data", {}).get("text/plain", ""))
    return "".join(out)


def _check_outputs(nb: Any) -> None:
    code = [c for c in nb.cells if c.cell_type == "code"]
    dash = _texts(code[0])
    assert "KREX dashboard: live" in dash and "LOST" not in dash, dash
    assert "(simulated)" in dash, "the fake backend is said"
    for cell in code:
        streams = _texts(cell, ("stream",))
        assert "Traceback" not in streams and "KeyboardInterrupt" not in streams, streams
        assert not [o for o in cell.get("outputs", []) if o["output_type"] == "error"], cell.source
    summary = _texts(next(c for c in code if "dash.summary()" in c.source))
    assert summary.startswith("live") and "region-loop-a" in summary, summary


def test_dashboard_notebook_runs_and_its_loops_stop_quietly_on_interrupt(
    arbiter: ArbiterProc, krex_spec: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:  # a shorter busy cell; the rest as written
        cell.source = cell.source.replace("time.sleep(15)", "time.sleep(4)")
    client = NotebookClient(nb, timeout=60, kernel_name="krex", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        _check_outputs(nb)
        # A kernel interrupt (SIGINT to the kernel's process group) reaches the loops too: they must end
        # without a traceback in the notebook.
        busy = nbformat.v4.new_code_cell("import time\ntime.sleep(20)")
        after = nbformat.v4.new_code_cell(
            "import psutil\ntime.sleep(1.5)\n"  # ended: reaped as they end, not left as zombies until waited for
            "print('zombies:', [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE])\n"
            "print('loops:', [p.wait(10) for p in others])\n"
            "print('still running:', len(dash.summary()))"
        )
        nb.cells += [busy, after]
        assert client.km is not None
        pid = test_kernels.pid_of(client.km)
        assert pid
        # What Jupyter's interrupt does (the provisioner's send_signal): SIGINT to the kernel's process group.
        timer = threading.Timer(2.0, os.killpg, (os.getpgid(pid), signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(Exception, match="KeyboardInterrupt"):  # the interrupted cell itself
            client.execute_cell(busy, len(nb.cells) - 2)
        assert time.monotonic() - t0 < 15
        client.execute_cell(after, len(nb.cells) - 1)
    text = "".join(_texts(c, ("stream",)) for c in nb.cells)
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "loops: [0, 0, 0]" in text and "zombies: []" in text, text
    # The loops' stderr is the kernel's (a terminal under `krex lab`, the notebook where ipykernel
    # forwards it): here it is this test's, captured.
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_the_loops_queue_without_a_line_in_the_running_cell(
    arbiter: ArbiterProc, krex_spec: None, tmp_path: Path
) -> None:
    """Under `krex lab` ipykernel forwards the kernel's stderr, which the loops inherit, into the
    running cell (and echoes it to the lab's terminal). The loops queue on purpose and the panel
    shows it: no wait or grant line of theirs lands in a cell, where it would read as an error."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        cell.source = cell.source.replace("time.sleep(15)", "time.sleep(8)")
    nb.cells.append(nbformat.v4.new_code_cell("print(dash.summary())\nstop_loops()"))
    # ipykernel does not forward a kernel's fd 2 under pytest (PYTEST_CURRENT_TEST): as `krex lab` runs it.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    client = NotebookClient(nb, timeout=60, kernel_name="krex", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel(env=env):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "region-loop-" in _texts(code[-1], ("stream",)), "the loops ran and took regions"
    err = "".join(o["text"] for c in code for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert "krex: " not in err, err
