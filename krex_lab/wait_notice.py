"""While a region request waits: who holds the GPU, and the caller's place in the queue.

An ``exclusive()`` (``krex exclusive``, ``krex run --exclusive``, ``%%krex_exclusive``) that is not
granted within :data:`DELAY` seconds says so::

    krex: waiting for GPU 0: held by bob (pid 4242, "train", region r7, 3.1 of 60 s); you are 2nd in the queue

How depends on where it goes, so that many waiters never flood a log:

- on a terminal (stderr a TTY): one line, rewritten in place as the holder, the place or the hold
  time change, and replaced by ``krex: GPU 0 granted after 3.2 s`` at the grant;
- in a notebook (an IPython kernel): one display, updated the same way (``display_id``);
- in a process a notebook's kernel started (a background loop, ``subprocess.run``) whose stderr
  is still the kernel's, which ipykernel forwards into the running cell: one line of that cell,
  rewritten in place with carriage returns (as Jupyter renders them), the grant's line left on it
  until the next wait. (ipykernel also echoes the cell's stderr to the kernel's own, the server's
  terminal or log: a log keeps the rewrites, carriage returns and all; the cell comes first.)
  Such a process is no kernel and its stderr no terminal, so without this it would take the
  rule of a pipe and add two lines to the cell at every wait. The kernel tells its children
  which stderr is the cell's (:func:`mark_cell_stderr`, ``KREX_CELL_STDERR``);
- anywhere else (a pipe, a file, a worker's job output): at most one line per wait, plus one when
  it is granted.

``KREX_QUIET=1`` silences it (and KREX's other informational lines, :func:`krex_lab.paths.quiet`).
What is said of another user's holder is what the arbiter's privacy setting shows this user (on a
private shared node: the user name and the region, no pid or name). The place is the caller's
position in the GPU's queue as the arbiter lists it; fair share across users may grant a later
user first.

The notice reads the arbiter's status from its own thread and connection (the waiting thread is
blocked in the acquire); it never changes what is waited for, and any failure only stops it. A
waiter on the held GPU itself is stopped with the region's other sessions as soon as it queues: the
arbiter's ``drain`` message comes first, and the session says its line then (:meth:`say_now`),
before it answers; that line cannot count up while the process is stopped, so it says so
("stopped with the region's other sessions until it ends (at most 18 s)") and stays until the
grant. (A process the driver locks instead, one with a CUDA context on that GPU, gets
no drain message: it says nothing until granted; ``krex status`` and the dashboard show the queue.)

``KREX_WAIT_NOTICE=0`` in the environment turns the notice off: a harness that queues many
regions on purpose (``benchmarks/agent/agent_study.py``) wants neither the lines nor the status
requests, which would load the arbiter it measures.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .paths import quiet

if TYPE_CHECKING:
    from .node_status import HolderRow

#: set by a notebook's kernel for the processes it starts: the identity (``st_dev:st_ino``) of its
#: stderr, the pipe ipykernel forwards into the running cell
CELL_STDERR_ENV = "KREX_CELL_STDERR"

#: seconds an acquire waits before the first line
DELAY = 1.0
#: seconds between two looks at the arbiter's status while waiting
PERIOD = 0.5


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def holder_text(holder: HolderRow | None) -> str:
    """``held by bob (pid 4242, "train", region r7, 3.1 of 60 s)``; only the fields the status gave."""
    if holder is None:
        return "free (being granted)"
    details = []
    if holder.pid is not None:
        details.append(f"pid {holder.pid}")
    if holder.name:
        details.append(f'"{holder.name}"')
    if holder.region:
        details.append(f"region {holder.region}")
    if holder.held_s is not None and holder.max_hold_s is not None:
        details.append(f"{holder.held_s:.1f} of {holder.max_hold_s:g} s")
    who = holder.user or "another session"
    return f"held by {who}" + (f" ({', '.join(details)})" if details else "")


def wait_line(status: object, gpu: int, session: str, stopped: bool = False) -> tuple[tuple[object, ...], str] | None:
    """What to say of ``session``'s wait for ``gpu`` in ``status`` (the arbiter's ``Status`` answer, or
    its JSON form): a key that changes only when the holder or the place changes, and the line; None
    when the session is not (or no longer) queued. ``stopped``: the region is about to stop this
    process (it waits on the held GPU itself), so its line cannot count up: it says so, and until when."""
    from .node_status import NodeStatus  # only while a request waits

    entry = next((g for g in NodeStatus.of(status).gpus if g.index == gpu), None)
    if entry is None:
        return None
    place = next((i for i, q in enumerate(entry.queue, 1) if q.session == session), None)
    if place is None:
        return None
    holder = entry.holder
    who = (holder.region, holder.user, holder.pid) if holder else None
    line = f"krex: waiting for GPU {gpu}: {holder_text(holder)}; you are {_ordinal(place)} in the queue"
    if stopped:
        line += "; stopped with the region's other sessions until it ends"
        if holder is not None and holder.held_s is not None and holder.max_hold_s is not None:
            line += f" (at most {max(0.0, holder.max_hold_s - holder.held_s):.0f} s)"
    return (who, place), line


class _Lines:
    """No terminal: the first line of a wait, and one more at its grant (only if it said one)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.said = False

    def show(self, line: str) -> None:
        if not self.said:
            self.said = True
            self.write(line)

    def end(self, final: str | None) -> None:
        if self.said and final is not None:
            self.write(final)


class _Terminal:
    """A TTY: one line, rewritten in place; the grant replaces it and ends it."""

    def __init__(self) -> None:
        self.said = False

    def show(self, line: str) -> None:
        self.said = True
        with contextlib.suppress(Exception):
            sys.stderr.write(f"\r\x1b[K{line}")
            sys.stderr.flush()

    def end(self, final: str | None) -> None:
        if self.said:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"\r\x1b[K{final}\n" if final is not None else "\n")
                sys.stderr.flush()


class _Display:
    """A notebook: one display of the cell's output, updated in place (its ``display_id``)."""

    def __init__(self) -> None:
        self.handle: Any = None

    def show(self, line: str) -> None:
        from IPython.display import display

        if self.handle is None:
            self.handle = display({"text/plain": line}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": line}, raw=True)

    def end(self, final: str | None) -> None:
        if self.handle is not None and final is not None:
            self.handle.update({"text/plain": final}, raw=True)


class _CellLine:
    """A notebook cell's stderr, written by a process the kernel started: one line for all of the
    process's waits, rewritten in place by carriage returns (no terminal escapes: Jupyter renders
    ``\\r``, not those) and padded to cover the longer line before it (``\\r`` cannot shorten a
    line). The grant's line stays on it, unended, until the next wait rewrites it: a loop that waits
    at each region keeps to one line of the cell, which says the last grant, never a blank strip."""

    #: the longest text on this process's line so far (a later wait's padding covers it)
    width = 0

    def __init__(self) -> None:
        self.wrote = False

    def _write(self, text: str) -> None:
        padded = text.ljust(_CellLine.width)
        _CellLine.width = max(_CellLine.width, len(text))
        self.wrote = True
        with contextlib.suppress(Exception):
            sys.stderr.write("\r" + padded)
            sys.stderr.flush()

    def show(self, line: str) -> None:
        self._write(line)

    def end(self, final: str | None) -> None:
        if not self.wrote:
            return
        if final is not None:
            self._write(final)
            return
        # not granted: the last wait line stays, ended, as on a terminal; the next starts afresh
        _CellLine.width = 0
        with contextlib.suppress(Exception):
            sys.stderr.write("\n")
            sys.stderr.flush()


def mark_cell_stderr() -> None:
    """In a notebook's kernel whose stderr (fd 2) is the pipe ipykernel forwards into the cells,
    tell the processes it starts (:data:`CELL_STDERR_ENV`): their waits then keep to one line there."""
    # ipykernel forwards fd 2 only where it watches it (not under pytest, nor with
    # capture_fd_output off: then fd 2 is the server's log, where a pipe's rule is right).
    if not _in_a_kernel() or not getattr(sys.stderr, "_should_watch", False):
        return
    try:
        st = os.fstat(2)
    except OSError:
        return
    if stat.S_ISFIFO(st.st_mode):
        os.environ[CELL_STDERR_ENV] = f"{st.st_dev}:{st.st_ino}"


def _stderr_is_a_cell() -> bool:
    """Whether this process's stderr is still the notebook cell's its kernel named."""
    mark = os.environ.get(CELL_STDERR_ENV)
    if not mark:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):
        return False  # redirected to something that is no file (a worker's job output)
    return mark == f"{st.st_dev}:{st.st_ino}"


def _in_a_kernel() -> bool:
    """Whether this process is an IPython kernel (a notebook's), whose stderr is a cell's output."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def _stderr_is_a_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class WaitNotice:
    """Says who holds ``gpu`` and the place of ``session`` in its queue while an acquire waits.

    ``fetch`` returns the arbiter's status as this process may see it (a ``Status`` request with
    an identity ticket); ``write`` prints one line (given: lines, as without a terminal; default:
    a notebook's display, a terminal's line in place, else lines on stderr, looked up at each
    line so that a redirected ``sys.stderr``, such as a worker's job output, gets them).
    """

    def __init__(
        self,
        fetch: Callable[[], object],
        gpu: int,
        session: str,
        write: Callable[[str], None] | None = None,
        delay: float = DELAY,
        period: float = PERIOD,
    ) -> None:
        self.fetch, self.gpu, self.session = fetch, gpu, session
        self.delay, self.period = delay, period
        self.began = time.monotonic()
        self.lines: list[str] = []  # every line it showed (a terminal's or a display's rewrites too)
        self._lock = threading.Lock()  # the waiting thread's look, the drain's and the end
        self._stop = threading.Event()
        self._out: _Lines | _Terminal | _Display | _CellLine
        if write is not None:
            self._out = _Lines(write)
        elif _in_a_kernel():
            self._out = _Display()
        elif _stderr_is_a_cell():
            self._out = _CellLine()
        elif _stderr_is_a_tty():
            self._out = _Terminal()
        else:
            self._out = _Lines(_stderr)
        if os.environ.get("KREX_WAIT_NOTICE", "1") == "0" or quiet():
            self._stop.set()  # off: no thread, and say_now says nothing
        self._thread = threading.Thread(target=self._run, name="krex-wait-notice", daemon=True)

    def start(self) -> WaitNotice:
        """Start looking now, in a thread of its own. The waiter calls this once its wait has
        lasted ``delay`` (most grants come sooner, and a thread started for each cost about half
        a millisecond of every region on a 2-core machine)."""
        if not self._stop.is_set():
            self._thread.start()
        return self

    def stop(self, granted: bool = False) -> None:
        """Stop looking; ``granted``: say so where the wait was said (the grant ends a terminal's line)."""
        off = self._stop.is_set() and not self.lines
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)
        if off:
            return
        with self._lock, contextlib.suppress(Exception):
            final = f"krex: GPU {self.gpu} granted after {time.monotonic() - self.began:.1f} s" if granted else None
            self._out.end(final)

    def say_now(self) -> None:
        """Look and say at once: this process is about to be stopped by the region it waits behind
        (the arbiter's drain comes just before the freeze), and could not say it later."""
        if not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._look(stopped=True)

    def _look(self, stopped: bool = False) -> None:
        said = wait_line(self.fetch(), self.gpu, self.session, stopped)
        with self._lock:
            if said is None or self._stop.is_set() or self.done_saying():
                return
            if not self.lines or said[1] != self.lines[-1]:
                self.lines.append(said[1])
                self._out.show(said[1])

    def done_saying(self) -> bool:
        """Without a terminal or a display: once its line is out, nothing more until the grant."""
        return isinstance(self._out, _Lines) and self._out.said

    def _run(self) -> None:
        while not self._stop.is_set() and not self.done_saying():  # then no more status requests
            try:
                self._look()
            except Exception:  # the arbiter went away, or the status could not be read: stay quiet
                return
            self._stop.wait(self.period)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
