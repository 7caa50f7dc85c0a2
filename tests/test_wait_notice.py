"""A wait longer than a second says who holds the GPU and the caller's place in the queue: without a
terminal one line per wait and one at the grant, on a terminal (a real pty) one line rewritten in
place, nothing with KREX_QUIET=1. A real arbiter, a real holder (``krex exclusive``) and real
waiting processes."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.wait_notice import holder_text, wait_line

pytestmark = pytest.mark.timeout(120)

# Registered on GPU 1 and waiting for GPU 0: a region on GPU 0 leaves it running (a waiter on
# GPU 0 itself is stopped with the region's other sessions; it says its line at the drain).
WAITER = """
import sys, time, krex_lab
from krex_lab.client import Exclusive
session = krex_lab.attach(gpu=1, name=sys.argv[1])
print("attached", flush=True)
with Exclusive(gpu=0, session=session):
    print("granted", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _waiter(arbiter: ArbiterProc, name: str, hold: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, name, str(hold)],
        env=arbiter.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "attached\n"
    return proc


def _queue(arbiter: ArbiterProc) -> list[dict[str, Any]]:
    queue: list[dict[str, Any]] = arbiter.status()["gpus"][0]["queue"]
    return queue


def _holding(arbiter: ArbiterProc, seconds: float) -> subprocess.Popen[str]:
    """``krex exclusive`` holding GPU 0 (region r1) for ``seconds``, once granted."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--gpu", "0", "--", "sleep", str(seconds)],
        env=arbiter.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stderr is not None and holder.stderr.readline().startswith("KREX region r1")
    return holder


def _said(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(("krex: waiting", "krex: GPU"))]


def test_without_a_terminal_a_wait_is_one_line_and_its_grant_another(arbiter: ArbiterProc) -> None:
    holder = _holding(arbiter, 4)
    procs = [holder]
    try:
        first = _waiter(arbiter, "first-waiter", 1.5)
        procs.append(first)
        wait_for(lambda: len(_queue(arbiter)) == 1, 10)
        second = _waiter(arbiter, "second-waiter", 0.0)
        procs.append(second)
        for p in procs:
            assert p.wait(60) == 0
        out_first = _said(first.stderr.read())  # type: ignore[union-attr]
        out_second = _said(second.stderr.read())  # type: ignore[union-attr]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    held_by_cli = f'held by {_user()} (pid {holder.pid}, "krex exclusive sleep", region r1, '
    assert len(out_first) == 2, out_first
    assert out_first[0].startswith(f"krex: waiting for GPU 0: {held_by_cli}"), out_first
    assert out_first[0].endswith("you are 1st in the queue"), out_first
    assert re.fullmatch(r"krex: GPU 0 granted after \d+\.\d s", out_first[1]), out_first
    # The holder and its place changed while it waited (r1, then the first waiter's r2): still
    # one line for the wait, then its grant.
    assert len(out_second) == 2, out_second
    assert out_second[0].startswith(f"krex: waiting for GPU 0: {held_by_cli}")
    assert out_second[0].endswith("you are 2nd in the queue"), out_second
    assert re.fullmatch(r"krex: GPU 0 granted after \d+\.\d s", out_second[1]), out_second
    assert float(out_second[1].split()[-2]) >= 3.0, out_second


def test_on_a_terminal_the_wait_is_one_line_rewritten_in_place(arbiter: ArbiterProc) -> None:
    holder = _holding(arbiter, 3.5)
    main, term = pty.openpty()
    waiter = None
    try:
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, "on-a-tty", "0"],
            env=arbiter.env(),
            stdout=subprocess.PIPE,
            stderr=term,
            text=True,
        )
        os.close(term)
        assert waiter.stdout is not None and waiter.stdout.readline() == "attached\n"
        assert waiter.wait(60) == 0 and holder.wait(30) == 0
        seen = b""
        while select.select([main], [], [], 0.5)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the pty's last writer has gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(main)
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    text = seen.decode()
    rewrites = text.split("\r\x1b[K")
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)  # one line on the terminal, ended at the grant
    waits = [r for r in rewrites if r.startswith("krex: waiting for GPU 0: held by")]
    assert len(waits) >= 2, repr(text)  # the hold time moves on: the line is rewritten, not repeated
    assert re.fullmatch(r"krex: GPU 0 granted after \d+\.\d s\r?\n", rewrites[-1]), repr(text)


@pytest.mark.parametrize("off", [{"KREX_QUIET": "1"}, {"KREX_WAIT_NOTICE": "0"}])
def test_it_can_be_turned_off(arbiter: ArbiterProc, off: dict[str, str]) -> None:
    holder = _holding(arbiter, 2.5)
    try:
        quiet = subprocess.Popen(
            [sys.executable, "-c", WAITER, "quiet", "0"],
            env={**arbiter.env(), **off},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _, err = quiet.communicate(timeout=60)
        assert quiet.returncode == 0 and holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert "krex:" not in err, err  # it waited about 2 s, twice the notice's delay


def test_a_quick_grant_says_nothing(arbiter: ArbiterProc) -> None:
    quick = _waiter(arbiter, "quick", 0.0)
    _, err = quick.communicate(timeout=30)
    assert quick.returncode == 0 and "krex: waiting" not in err, err


def test_what_a_private_view_leaves_out_is_not_said() -> None:
    status = {
        "gpus": [
            {
                "index": 0,
                "holder": {"region": "r9", "user": "bob", "held_s": 3.14, "max_hold_s": 60.0},
                "queue": [{"region": "r10", "user": "bob"}, {"region": "r11", "session": "s5", "pid": 7}],
            }
        ]
    }
    said = wait_line(status, 0, "s5")
    assert said is not None
    assert said[1] == "krex: waiting for GPU 0: held by bob (region r9, 3.1 of 60 s); you are 2nd in the queue"
    assert wait_line(status, 0, "s6") is None and wait_line(status, 1, "s5") is None
    assert holder_text(None) == "free (being granted)"


def _user() -> str:
    import os
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_a_waiter_on_the_held_gpu_says_it_before_it_is_stopped(arbiter: ArbiterProc) -> None:
    # `krex exclusive` on the GPU it waits for registers mid-region: the region drains and stops
    # it as an intruder, and it must say why it waits before that (it looked hung, state T).
    holder = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--gpu", "0", "--", "sleep", "3"],
        env=arbiter.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    waiter = None
    try:
        assert holder.stderr is not None and holder.stderr.readline().startswith("KREX region r1")
        waiter = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "exclusive", "--gpu", "0", "--", "true"],
            env=arbiter.env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.wait(60) == 0
        err = waiter.stderr.read()  # type: ignore[union-attr]
        said = [line for line in err.splitlines() if line.startswith("krex: waiting")]
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert said and said[0].startswith("krex: waiting for GPU 0: held by"), err
    # It will not count up while stopped: the line says so, and until when at most
    assert re.search(
        r"you are 1st in the queue; stopped with the region's other sessions until it ends "
        r"\(at most \d+ s\)$",
        said[0],
    ), said


CELL_CHILD = """
import os, sys
from krex_lab.wait_notice import CELL_STDERR_ENV, WaitNotice
if sys.argv[1] == "cell":  # what a notebook's kernel says of its stderr, which this process inherited
    st = os.fstat(2)
    os.environ[CELL_STDERR_ENV] = f"{st.st_dev}:{st.st_ino}"
else:  # the kernel's stderr was another file: this one is not the cell's
    os.environ[CELL_STDERR_ENV] = "1:1"
notice = WaitNotice(lambda: {}, 0, "s")
print(type(notice._out).__name__, flush=True)
notice._out.show("krex: waiting for GPU 0: held by bob (pid 4242); you are 2nd in the queue")
notice._out.show("krex: waiting for GPU 0: held by ann; you are 1st in the queue")
notice._out.end("krex: GPU 0 granted after 1.2 s")
again = WaitNotice(lambda: {}, 0, "s")  # the process's next wait, on the same line
again._out.show("krex: waiting for GPU 0: held by cy; you are 1st in the queue")
again._out.end("krex: GPU 0 granted after 0.4 s")
"""


@pytest.mark.parametrize("where", ["cell", "elsewhere"])
def test_a_notebook_kernels_child_rewrites_one_line_of_the_cell(where: str) -> None:
    """A process whose stderr is still its notebook kernel's (ipykernel forwards it into the running
    cell) keeps all its waits to one line there, rewritten with carriage returns; the grant's line
    stays on it until the next wait, so nothing blank is left behind (``\\r`` cannot shorten a line:
    a blanked one stayed as a strip of spaces) and a loop that waits at every region does not add a
    line each time. Any other stderr keeps a pipe's rule."""
    done = subprocess.run([sys.executable, "-c", CELL_CHILD, where], capture_output=True, timeout=60)
    out, err = done.stdout.decode(), done.stderr.decode()  # bytes: text mode would turn \r into \n
    assert done.returncode == 0, err
    if where == "elsewhere":
        assert out.strip() == "_Lines"
        assert err.count("\n") == 4 and "\r" not in err, repr(err)
        return
    assert out.strip() == "_CellLine"
    assert "\x1b" not in err and "\n" not in err, f"one line for every wait: {err!r}"
    shown = ""
    for part in err.split("\r"):  # as Jupyter renders it: each part overwrites the line from its start
        shown = part + shown[len(part) :]
    assert shown.rstrip() == "krex: GPU 0 granted after 0.4 s", f"the last grant is the line: {shown!r}"
    parts = err.split("\r")
    assert parts[2].startswith("krex: waiting for GPU 0: held by ann") and parts[2].endswith(" "), (
        "padded over the first"
    )
    assert parts[4].startswith("krex: waiting for GPU 0: held by cy") and len(parts[4]) >= len(parts[1]), (
        "the next wait covers the longest text the line had"
    )


def _kernel_marks(stderr: Any) -> bool:
    """Whether a real kernel whose own stderr is ``stderr`` tells its children that their stderr
    is the cell's (``%load_ext krex_lab``)."""
    from jupyter_client.manager import KernelManager

    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # ipykernel then captures fd 2
    km = KernelManager(kernel_name="python3")
    km.start_kernel(stderr=stderr, stdout=subprocess.DEVNULL, env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        said: list[str] = []

        def output(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                said.append(msg["content"]["text"])

        code = "%load_ext krex_lab\nimport os\nprint(repr(os.environ.get('KREX_CELL_STDERR')))"
        reply = kc.execute_interactive(code, timeout=60, output_hook=output)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(said).strip() != "None"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.timeout(180)
def test_a_real_kernel_names_the_cells_pipe_to_its_children_wherever_its_own_stderr_goes(tmp_path: Path) -> None:
    """ipykernel forwards fd 2 into the running cell and echoes it to the kernel's own stderr (the
    server's terminal or log): the cell is what the user reads, so the kernel names the pipe to its
    children whether that echo goes to a log file or nowhere."""
    with open(tmp_path / "server.log", "wb") as log:
        assert _kernel_marks(log)
    assert _kernel_marks(subprocess.DEVNULL)
