"""The IPython magics on a real in-process IPython shell (run_cell_magic / run_cell, as ipyparallel
tests its magics), against a real arbiter and, for ``%%krex``, a real pool service."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from krex_lab import protocol
from krex_lab.magics import CellSyntaxError, KrexCellError, RemoteCellError
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.support import ROOT

from . import test_kernels

detached = test_kernels.detached  # fixtures
pool = test_kernels.pool

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ip() -> Any:
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    shell.extension_manager.load_extension("krex_lab")
    return shell


def last_region(arbiter: ArbiterProc) -> dict[str, Any]:
    from krex_lab.client import Connection

    conn = Connection(arbiter.endpoint)
    try:
        regions: list[dict[str, Any]] = conn.call(protocol.Regions(limit=1))
        return regions[-1]
    finally:
        conn.close()


def test_magics_registered(ip: Any) -> None:
    magics = ip.magics_manager.magics
    assert {"krex_exclusive", "krex"} <= set(magics["cell"])
    assert "krex_status" in magics["line"]


def test_exclusive_cell_runs_as_a_region(ip: Any, arbiter: ArbiterProc, detached: Any) -> None:
    sib = detached(0)
    code = f"from krex_lab.procutil import proc_state\nstate = proc_state({sib})\nanswer = 6 * 7\nanswer"
    with capture_output() as cap:
        value = ip.run_cell_magic("krex_exclusive", "--gpu 0", code)
    assert value == 42 and ip.user_ns["answer"] == 42, "runs in the user namespace, returns the last value"
    assert ip.user_ns["state"] == "T", "the sibling was stopped while the cell ran"
    lines = cap.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("KREX region") and "frozen 1" in lines[0], cap.stdout
    assert "[simulated GPU]" in lines[0] and "held" in lines[0]
    wait_for(lambda: proc_state(sib) in ("S", "R"))
    assert arbiter.status()["gpus"][0]["holder"] is None


def test_the_report_starts_on_a_line_of_its_own(ip: Any, arbiter: ArbiterProc) -> None:
    """A cell whose output ends inside a line (``print(i, end=" ")``) does not get the report
    glued onto it; one whose output ends its line gets no blank line."""
    with capture_output() as cap:
        ip.run_cell_magic("krex_exclusive", "--gpu 0 --no-freeze --no-isolate", "for i in range(3): print(i, end=' ')")
    assert cap.stdout.startswith("0 1 2 \nKREX region"), cap.stdout
    with capture_output() as cap:
        ip.run_cell_magic("krex_exclusive", "--gpu 0 --no-freeze --no-isolate", "print('done')")
    assert cap.stdout.startswith("done\nKREX region"), cap.stdout


def test_exclusive_options(ip: Any, arbiter: ArbiterProc, detached: Any) -> None:
    sib = detached(1)
    code = f"from krex_lab.procutil import proc_state\nstate = proc_state({sib})"
    with capture_output() as cap:
        ip.run_cell_magic("krex_exclusive", "--gpu 1 --max-hold 5 --no-freeze --no-isolate --quiet", code)
    assert cap.stdout == "", "--quiet prints nothing"
    assert ip.user_ns["state"] in ("S", "R"), "--no-freeze leaves the sibling running"
    report = last_region(arbiter)
    assert report["gpu"] == 1 and report["max_hold_s"] == 5 and report["frozen"] == [] and report["cores"] == []
    with capture_output():
        ip.run_cell_magic("krex_exclusive", "--gpu 1 --cores 1 --no-freeze", "pass")
    assert len(last_region(arbiter)["cores"]) <= 1
    with pytest.raises(UsageError):
        ip.run_cell_magic("krex_exclusive", "--gpu x", "pass")


def test_exclusive_failures_are_short_messages(
    ip: Any, arbiter: ArbiterProc, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Lease expiry: the cell fails with one clear line (and the report says LEASE EXPIRED).
    with capture_output() as cap, pytest.raises(KrexCellError, match=r"exceeded max_hold=0\.3 s"):
        ip.run_cell_magic("krex_exclusive", "--max-hold 0.3", "import time; time.sleep(0.8)")
    assert "LEASE EXPIRED" in cap.stdout
    # No arbiter: through run_cell, as a notebook shows it.
    from krex_lab import client

    if client._default is not None:
        client._default.close()
    monkeypatch.setenv("KREX_ENDPOINT", f"ipc://{tmp_path}/nobody.sock")
    with capture_output() as cap:
        result = ip.run_cell("%%krex_exclusive\nx = 1")
    assert isinstance(result.error_in_exec, KrexCellError)
    assert "KREX: ArbiterUnavailable: no KREX arbiter answers" in cap.stdout
    assert "Traceback" not in cap.stdout and "client.py" not in cap.stdout, cap.stdout
    with capture_output() as cap:
        ip.run_cell("%krex_status")
    assert "KREX: ArbiterUnavailable" in cap.stdout and "Traceback" not in cap.stdout


def test_user_exception_shows_normally(ip: Any, arbiter: ArbiterProc) -> None:
    with capture_output() as cap:
        result = ip.run_cell("%%krex_exclusive\ndef f():\n    return 1 / 0\nf()")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert "ZeroDivisionError" in cap.stdout and "return 1 / 0" in cap.stdout, "the cell's own traceback"
    assert "KREX region" in cap.stdout, "the report is still printed"
    assert arbiter.status()["gpus"][0]["holder"] is None, "the region was released"


def test_a_cell_that_does_not_compile_takes_no_region(ip: Any, arbiter: ArbiterProc, detached: Any) -> None:
    """A syntax error is the cell's own, shown as IPython shows it, before the GPU is taken: no
    region in the arbiter's record, no neighbour frozen."""
    sib = detached(0)
    with capture_output():
        ip.run_cell_magic("krex_exclusive", "--gpu 0 --no-freeze --no-isolate --quiet", "pass")
    before = last_region(arbiter)["region"]
    with capture_output() as cap:
        result = ip.run_cell("%%krex_exclusive --gpu 0\nx = (1,\nfrozen = 1")
    assert isinstance(result.error_in_exec, CellSyntaxError), result
    assert isinstance(result.error_in_exec.error, SyntaxError)
    assert "SyntaxError" in cap.stdout and "KREX region" not in cap.stdout, cap.stdout
    assert last_region(arbiter)["region"] == before, "a region was taken for a cell that cannot run"
    assert proc_state(sib) in ("S", "R") and arbiter.status()["gpus"][0]["holder"] is None


BROKEN = "print('hello'\nx = = 1"


def shown(ip: Any, cell: str) -> str:
    """What a cell shows, its own number (``Cell In[N]``) left out."""
    with capture_output() as cap:
        result = ip.run_cell(cell, store_history=True)
    assert not result.success
    return re.sub(r"Cell In\[\d+\]", "Cell In[N]", cap.stdout + cap.stderr)


def test_a_syntax_error_reads_like_a_plain_cells(ip: Any, arbiter: ArbiterProc) -> None:
    """Under ``%%krex_exclusive`` a syntax error shows exactly as in a plain cell: the cell's name
    and line, the error, no frames of IPython or KREX."""
    plain = shown(ip, BROKEN)
    assert "Cell In[N], line 1" in plain and "SyntaxError: '(' was never closed" in plain, plain
    assert shown(ip, "%%krex_exclusive --gpu 0\n" + BROKEN) == plain


def test_a_krex_cell_that_does_not_parse_is_not_sent(
    ip: Any, arbiter: ArbiterProc, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``%%krex`` finds a syntax error itself, before asking for a worker (none answers here), and
    shows it as a plain cell's, not as raised on the context worker."""
    pytest.importorskip("krex_lab.workers.client")
    from krex_lab.workers.client import PoolClient

    def refuse(cls: Any, endpoint: str | None = None, start: bool = True) -> Any:
        raise AssertionError("a cell that does not parse asked for a worker")

    monkeypatch.setattr(PoolClient, "connect", classmethod(refuse))
    monkeypatch.setenv("KREX_POOL_ENDPOINT", f"ipc://{tmp_path}/nopool.sock")
    plain = shown(ip, BROKEN)
    assert shown(ip, "%%krex\n" + BROKEN) == plain


def test_krex_status(ip: Any, arbiter: ArbiterProc) -> None:
    with capture_output() as cap:
        ip.run_line_magic("krex_status", "")
    assert "SIMULATED GPUs" in cap.stdout and "GPU 0:" in cap.stdout and "GPU 1:" in cap.stdout


# -- %%krex on a real pool ----------------------------------------------------------------------------


class LiveOut:
    """A stdout that records when each write arrived."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, str]] = []

    def write(self, s: str) -> int:
        self.writes.append((time.monotonic(), s))
        return len(s)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(s for _, s in self.writes)


def test_krex_cell_on_the_context_worker(ip: Any, pool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = LiveOut()
    monkeypatch.setattr(sys, "stdout", out)
    code = "import os, time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\nos.getpid()"
    t0 = time.monotonic()
    value = ip.run_cell_magic("krex", "", code)
    t_end = time.monotonic()
    ticks = [t for t, s in out.writes if "tick" in s]
    assert len(ticks) == 3 and ticks[0] < t_end - 0.6, "output arrives while the cell runs"
    assert t_end - t0 >= 1.2
    worker = int(repr(value))
    assert worker != os.getpid(), "it ran on the worker, not here"
    # The namespace persists on this kernel's worker from one %%krex cell to the next.
    ip.run_cell_magic("krex", "", "x = 41")
    assert repr(ip.run_cell_magic("krex", "", "x + 1")) == "42"
    # A segfault costs the worker, not this process; the next %%krex cell works.
    with pytest.raises(KrexCellError) as info:
        ip.run_cell_magic("krex", "", "import ctypes\nctypes.string_at(0)")
    message = str(info.value)
    assert "died" in message and "SIGSEGV" in message and "This kernel is fine" in message, message
    assert info.value._render_traceback_()[0].count("\n") == 0
    assert repr(ip.run_cell_magic("krex", "", "import os; os.getpid()")) != str(worker), "a fresh worker"
    # The cell's own exception shows as a traceback (from the worker).
    with pytest.raises(RemoteCellError) as exc:
        ip.run_cell_magic("krex", "", "def g():\n    raise ValueError('bad input')\ng()")
    rendered = "\n".join(exc.value._render_traceback_())
    assert "ValueError: bad input" in rendered and "raise ValueError" in rendered
    # --exclusive: the worker holds a region; its report is printed.
    ip.run_cell_magic("krex", "--exclusive", "pass")
    assert "KREX region" in out.text() and "on GPU" in out.text()


def test_krex_without_pool_is_a_short_message(
    ip: Any, arbiter: ArbiterProc, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    pytest.importorskip("krex_lab.workers.client")
    from krex_lab.workers.client import PoolClient

    def refuse(cls: Any, endpoint: str | None = None, start: bool = True) -> Any:
        from krex_lab.errors import PoolUnavailable

        raise PoolUnavailable(f"no KREX pool answers at {endpoint}")

    monkeypatch.setattr(PoolClient, "connect", classmethod(refuse))
    monkeypatch.setenv("KREX_POOL_ENDPOINT", f"ipc://{tmp_path}/nopool.sock")
    with capture_output() as cap:
        result = ip.run_cell("%%krex\nprint(1)")
    assert isinstance(result.error_in_exec, KrexCellError)
    assert "KREX: PoolUnavailable: no KREX pool answers" in cap.stdout and "Traceback" not in cap.stdout


def test_the_readme_first_snippet_runs_as_written(ip: Any, arbiter: ArbiterProc) -> None:
    readme = (ROOT / "README.md").read_text()
    first = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert first.startswith("%%krex_exclusive"), first
    with capture_output() as cap:
        result = ip.run_cell(first)
    assert result.error_in_exec is None and result.error_before_exec is None, cap.stdout + cap.stderr
    lines = cap.stdout.strip().splitlines()
    assert lines[0].endswith(" ms") and lines[-1].startswith("KREX region"), cap.stdout
