"""Inside a worker: run one job (a cell, a function, a script) and say what happened.

Everything the job prints goes to the worker's fd 1 and 2, which are pipes the pool reads and
streams to the client as it arrives. Exceptions are formatted as a plain ``python`` would
print them: the worker's own frames (this module, runpy) are cut from the traceback.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import itertools
import linecache
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ...cuda_errors import sticky_cuda_error
from ...region_report import RegionReport
from ..results import INTERRUPT_EXIT, JobResult
from ..wire import Run

_INTERNAL = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
_cells = itertools.count(1)


class State:
    """Process-wide flags the SIGINT handler reads."""

    in_job = False


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """KeyboardInterrupt inside a job; ignored between jobs, so an interrupt never kills a worker."""
    if State.in_job:
        raise KeyboardInterrupt


def install_sigint() -> None:
    signal.signal(signal.SIGINT, on_sigint)


def format_exception(exc: BaseException) -> str:
    """The traceback as ``python`` prints it, without the worker's own frames: those that ran
    the job (first) and the SIGINT handler that raised KeyboardInterrupt (last)."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _trim(te, set())
    return "".join(te.format())


def _internal(filename: str) -> bool:
    return filename in _INTERNAL or os.path.abspath(filename) in _INTERNAL


def _trim(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    stack = te.stack
    while stack and _internal(stack[0].filename):
        del stack[0]
    while stack and _internal(stack[-1].filename):
        del stack[-1]
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _trim(chained, seen)


def _error_line(exc: BaseException) -> str:
    line = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return (line[-1] if line else type(exc).__name__)[:500]


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    try:  # C-level stdio (printf in extensions) is block-buffered on a pipe
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def _guarded(fn: Callable[[], Any]) -> Any:
    """Run user code with interrupts enabled (a SIGINT raises KeyboardInterrupt only in here)."""
    State.in_job = True
    try:
        return fn()
    finally:
        State.in_job = False


@dataclass
class Ran:
    """What :meth:`Runner.run` gives the worker's loop: the job's result (sent to the pool as
    it is) and why the worker must be recycled (a sticky CUDA error; None: it may serve on)."""

    result: JobResult
    recycle: str | None = None


class Runner:
    """Runs jobs; ``namespace`` is the cell namespace (kept while a lease holds the worker):
    the user's own globals, any names and values."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = new_namespace()

    def clear(self) -> None:
        self.namespace.clear()
        self.namespace.update(new_namespace())

    def run(self, msg: Run) -> Ran:
        """Run the job in ``msg``: its result, and whether its worker must be recycled."""
        kind = msg.kind
        region: RegionReport | None = None
        ran: Ran
        excl = None
        try:
            if msg.exclusive:
                from ...client import exclusive

                # The client that waits for this job (a notebook, `krex run`) keeps running: it
                # only relays output, and freezing it would hold that output until the end.
                excl = exclusive(exempt=[msg.client_pid] if msg.client_pid else [])
                _guarded(excl.acquire)
            try:
                if kind == "code":
                    ran = self._code(msg)
                elif kind == "call":
                    ran = self._call(msg)
                elif kind == "script":
                    ran = self._script(msg)
                else:
                    ran = Ran(JobResult(ok=False, status="exception", error=f"unknown job kind {kind!r}"))
            finally:
                if excl is not None and excl.id is not None:
                    region = excl.release()
        except BaseException as exc:  # acquiring or releasing the region failed
            ran = self._failure(exc, kind)
            if excl is not None and excl.id is None:
                ran.result.error = f"exclusive=True: the region could not be acquired: {ran.result.error}"
        finally:
            flush_output()
        ran.result.region = region
        if ran.recycle:
            ran.recycle = f"sticky CUDA error: {ran.recycle}"
        return ran

    # -- kinds -----------------------------------------------------------------------------
    def _failure(self, exc: BaseException, kind: str) -> Ran:
        interrupted = isinstance(exc, KeyboardInterrupt)
        result = JobResult(
            ok=False,
            status="interrupted" if interrupted else "exception",
            error=_error_line(exc) if not interrupted else "KeyboardInterrupt",
            traceback=format_exception(exc),
        )
        if kind == "script":
            result.exit_code = INTERRUPT_EXIT if interrupted else 1
        return Ran(result, recycle=sticky_cuda_error(exc))

    def _exit(self, exc: SystemExit, kind: str) -> Ran:
        code = exc.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:  # sys.exit("message"): Python prints the message and exits 1
            print(code, file=sys.stderr)
            status = 1
        return Ran(
            JobResult(
                ok=status == 0,
                status="ok" if status == 0 else "exit",
                exit_code=status,
                error=None if status == 0 else f"SystemExit: {code}",
            )
        )

    def _code(self, msg: Run) -> Ran:
        code = msg.code or ""
        filename = f"<krex-cell-{next(_cells)}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
        ns = self.namespace
        if not msg.lease:
            self.clear()
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                expr = tree.body.pop()
                assert isinstance(expr, ast.Expr)
                last = ast.Expression(expr.value)
            body = compile(tree, filename, "exec")
            tail = compile(last, filename, "eval") if last is not None else None

            def execute() -> Any:
                exec(body, ns)
                return eval(tail, ns) if tail is not None else None

            value = _guarded(execute)
        except SystemExit as exc:
            return self._exit(exc, "code")
        except BaseException as exc:
            return self._failure(exc, "code")
        if value is not None:
            ns["_"] = value
        return Ran(JobResult(ok=True, status="ok", value=None if value is None else _safe_repr(value)))

    def _call(self, msg: Run) -> Ran:
        import cloudpickle

        try:
            fn, args, kwargs = cloudpickle.loads(msg.payload or b"")
            value = _guarded(lambda: fn(*args, **kwargs))
        except BaseException as exc:
            out = self._failure(exc, "call")
            try:
                out.result.exc_pickle = cloudpickle.dumps(exc)
            except Exception:
                out.result.exc_pickle = None
            return out
        try:
            return Ran(JobResult(ok=True, status="ok", value=cloudpickle.dumps(value)))
        except Exception as exc:
            return Ran(
                JobResult(
                    ok=False,
                    status="exception",
                    error=f"the function returned a value that cannot be pickled: {_error_line(exc)}",
                    traceback=format_exception(exc),
                )
            )

    def _script(self, msg: Run) -> Ran:
        path = os.path.abspath(os.path.join(msg.cwd or os.getcwd(), msg.path or ""))
        argv = list(msg.argv)
        env = msg.env
        if msg.cwd:
            os.chdir(msg.cwd)
        if env is not None:
            # The worker's placement, exactly: a caller's variable the worker does not set (a
            # CUDA_VISIBLE_DEVICES of the caller's shell on a simulated GPU) is dropped, not kept.
            placement = {k: os.environ.get(k) for k in msg.keep_env}
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items() if k not in placement})
            os.environ.update({k: v for k, v in placement.items() if v is not None})
        sys.argv = [path, *argv]
        extra = [p for p in ((env or {}).get("PYTHONPATH") or "").split(os.pathsep) if p]
        sys.path[:0] = [os.path.dirname(path), *extra]
        stdin = _StdinSwap(msg.stdin) if msg.stdin is not None else None
        try:
            _guarded(lambda: runpy.run_path(path, run_name="__main__"))
        except SystemExit as exc:
            return self._exit(exc, "script")
        except BaseException as exc:
            return self._failure(exc, "script")
        finally:
            if stdin is not None:
                stdin.restore()
        return Ran(JobResult(ok=True, status="ok", exit_code=0))


class _StdinSwap:
    """The client's stdin as the script's fd 0 and ``sys.stdin`` (a memfd, so that C code and
    children read it too), put back afterwards (a reset would too; a leased run does not reset)."""

    def __init__(self, data: bytes) -> None:
        self.saved_fd = os.dup(0)
        os.set_inheritable(self.saved_fd, False)
        self.saved = sys.stdin
        fd = os.memfd_create("krex-stdin")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
            os.dup2(fd, 0)
        finally:
            os.close(fd)
        sys.stdin = open(0, encoding=getattr(self.saved, "encoding", None), closefd=False)  # noqa: SIM115

    def restore(self) -> None:
        current = sys.stdin
        sys.stdin = self.saved
        try:
            current.close()
        except Exception:
            pass
        os.dup2(self.saved_fd, 0)
        os.close(self.saved_fd)


def new_namespace() -> dict[str, Any]:
    """A fresh ``__main__`` namespace for cells (the user's globals: any names and values)."""
    return {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<repr failed: {type(exc).__name__}: {exc}>"
    return text if len(text) <= 100_000 else text[:100_000] + "..."


def clear_tracebacks() -> None:
    """Drop the references a finished job's exception keeps to its frames (and their tensors)."""
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
