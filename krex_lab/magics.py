"""The ``krex_lab`` IPython extension: ``%%krex_exclusive``, ``%%krex`` and ``%krex_status``.

    %load_ext krex_lab                 # the krex kernelspec loads it for you
    %%krex_exclusive [--gpu N] [--max-hold S] [--no-freeze] [--no-isolate] [--cores N] [--quiet]
    %%krex [--exclusive] [--timeout S] [--quiet]
    %krex_status

``%%krex_exclusive`` runs the cell in this kernel as a region (the GPU alone) and prints the
region's one-line report (the whole report is then ``_krex_report``). ``%%krex`` runs the cell
on this kernel's context worker (the pool service), with live output; its namespace persists
from one ``%%krex`` cell to the next, and a crash there costs a worker, never this kernel.
Failures of KREX itself (no arbiter, lease expired, a dead worker) show as a short message, not
as a traceback from inside KREX; errors of the cell's own code show as usual.

In a kernel of the ``krex`` kernelspec (``KREX_KERNEL_ID`` is set) loading the extension
registers the kernel as a session on its GPU (``KREX_GPU``), so the session ends with it.
"""

from __future__ import annotations

import ast
import atexit
import os
import sys
import threading
import time
from types import CodeType
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import paths
from .errors import KrexError, UnknownSession

RED, RESET = "\x1b[0;31m", "\x1b[0m"


class KrexCellError(Exception):
    """A failure of KREX (not of the cell's code), shown as a short message, not a traceback."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail

    def _render_traceback_(self) -> list[str]:
        lines = [f"{RED}KREX: {self}{RESET}"]
        if self.detail:
            lines += ["  " + line for line in self.detail.rstrip().splitlines()]
        return lines


class RemoteCellError(Exception):
    """The cell raised on the context worker: shows the worker's traceback as a traceback."""

    def __init__(self, summary: str, traceback: str) -> None:
        super().__init__(summary)
        self.traceback = traceback

    def _render_traceback_(self) -> list[str]:
        return [*self.traceback.rstrip().splitlines(), f"{RED}(raised on the context worker){RESET}"]


class CellSyntaxError(Exception):
    """The cell's own syntax error (``error``), shown as IPython shows a plain cell's: the cell's
    line and the error, no frames. Not a ``SyntaxError`` itself: IPython shows every exception of
    that kind raised while code runs with the frames it came through (IPython's and KREX's)."""

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(str(error))
        self.error = error

    def _render_traceback_(self) -> list[str]:
        from IPython.core.getipython import get_ipython

        shell: Any = get_ipython()
        if shell is None:
            return [f"{type(self.error).__name__}: {self.error}"]
        return list(shell.SyntaxTB.structured_traceback(type(self.error), self.error, []))


class _Repr:
    """Shows a repr computed elsewhere (the worker's ``Out``) as this cell's ``Out``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _explain(exc: KrexError) -> KrexCellError:
    return KrexCellError(f"{type(exc).__name__}: {exc}")


def session_name() -> str:
    kernel = os.environ.get("KREX_KERNEL_ID", "")
    notebook = os.environ.get("JPY_SESSION_NAME", "")  # the notebook's path, set by jupyter_server
    notebook = os.path.basename(notebook.rstrip("/")) or notebook
    if notebook:
        return f"{notebook} [{kernel[:8]}]" if kernel else notebook
    return f"kernel {kernel[:8]}" if kernel else f"ipython-{os.getpid()}"


@magics_class
class KrexMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._pool: Any = None
        self._atexit = False
        self._lease = f"kernel-{os.environ.get('KREX_KERNEL_ID', 'ipython')[:8]}-{os.getpid()}"

    # -- sessions -------------------------------------------------------------------------
    def session(self, fresh: bool = False) -> Any:
        from . import client

        current = client.current_session()
        if current is not None and fresh:
            current.close()
            current = None
        if current is None:
            kernel = bool(os.environ.get("KREX_KERNEL_ID"))
            current = client.attach(role="kernel" if kernel else "client", name=session_name())
        return current

    # -- %%krex_exclusive -----------------------------------------------------------------
    @magic_arguments()
    @argument("--gpu", type=int, default=None, help="GPU to hold (default: this kernel's)")
    @argument("--max-hold", type=float, default=None, help="lease in seconds (default: the arbiter's)")
    @argument("--no-freeze", action="store_true", help="do not stop the GPU's other processes")
    @argument("--no-isolate", action="store_true", help="do not reserve CPU cores for this kernel")
    @argument("--cores", type=int, default=None, help="how many cores to reserve")
    @argument("--quiet", action="store_true", help="do not print the region report")
    @cell_magic
    def krex_exclusive(self, line: str, cell: str) -> Any:
        """Run the cell with the GPU to this kernel alone (a KREX region); print its report."""
        __tracebackhide__ = True
        from .client import Exclusive

        args = parse_argstring(self.krex_exclusive, line)
        # Compiled before the GPU is taken: a cell that cannot run (a syntax error) takes no region,
        # freezes no neighbour and leaves no completed region in the history.
        compiled = self.compile_here(cell)
        began = time.monotonic()
        for attempt in (0, 1):
            try:
                region = Exclusive(
                    gpu=args.gpu,
                    max_hold=args.max_hold,
                    freeze=not args.no_freeze,
                    isolate=not args.no_isolate,
                    cores=args.cores,
                    session=(session := self.session(fresh=attempt == 1)),
                )
                region.acquire()
                # Stopped by another session's region (this kernel on its GPU) until the cell began:
                # the cell was sent meanwhile and waited that long, which its own request did not see.
                stopped = session.stopped_until(began)
                break
            except UnknownSession:  # the arbiter restarted: register again, once
                if attempt:
                    raise KrexCellError("the arbiter forgot this kernel's session twice; try again") from None
            except KrexError as exc:
                raise _explain(exc) from None
        tail = _Tail.install()
        try:
            value = self.run_compiled(compiled)
        except BaseException:
            tail.remove()
            self._release(region, args.quiet, failed=True, dangling=tail.dangling, stopped=stopped)
            raise
        tail.remove()
        self._release(region, args.quiet, failed=False, dangling=tail.dangling, stopped=stopped)
        return value

    def _release(self, region: Any, quiet: bool, failed: bool, dangling: bool = False, stopped: float = 0.0) -> None:
        __tracebackhide__ = True
        try:
            report = region.release()
        except KrexError as exc:
            if failed:  # the cell's own exception matters more
                print(f"KREX: releasing the region failed too: {exc}", file=sys.stderr)
                return
            raise _explain(exc) from None
        if stopped > (report.stopped_before_request_s or 0.0):
            import msgspec

            report = msgspec.structs.replace(report, stopped_before_request_s=round(stopped, 6))
        if self.shell is not None:  # the last region's report, like ``_`` for values
            self.shell.user_ns["_krex_report"] = report
        if not quiet:
            _print_own_line(report.summary(), dangling)
        why = report.cut_short("cell")
        if why and not failed:
            raise KrexCellError(why)

    def compile_here(self, cell: str) -> tuple[CodeType, CodeType | None]:
        """``cell`` compiled as IPython compiles a cell: its body, and its last expression apart
        (None when it does not end in one). A syntax error is raised here, before anything runs."""
        __tracebackhide__ = True
        shell: Any = self.shell
        source = shell.transform_cell(cell)
        filename = shell.compile.cache(source, _cell_number(shell), raw_code=cell)
        try:
            tree = shell.transform_ast(shell.compile.ast_parse(source, filename))
        except SyntaxError as exc:
            raise CellSyntaxError(exc) from None
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = shell.compile(tree, filename, "exec")
        return body, shell.compile(last, filename, "eval") if last is not None else None

    def run_compiled(self, compiled: tuple[CodeType, CodeType | None]) -> Any:
        """Run what :meth:`compile_here` made in the user namespace; the last expression's value."""
        __tracebackhide__ = True
        shell: Any = self.shell
        body, last = compiled
        exec(body, shell.user_global_ns, shell.user_ns)
        if last is not None:
            return eval(last, shell.user_global_ns, shell.user_ns)
        return None

    def parse_here(self, cell: str) -> None:
        """Raise the syntax error the context worker would find in ``cell`` (it parses the cell as
        it is, without IPython's transformations), shown as a plain cell's."""
        shell: Any = self.shell
        # Under the name IPython gives this cell, so that the error reads like a plain cell's.
        filename = shell.compile.cache(cell, _cell_number(shell), raw_code=cell) if shell is not None else "<cell>"
        try:
            ast.parse(cell, filename)
        except SyntaxError as exc:
            raise CellSyntaxError(exc) from None

    # -- %%krex ---------------------------------------------------------------------------
    @magic_arguments()
    @argument("--exclusive", action="store_true", help="run it as a region on the worker's GPU")
    @argument("--timeout", type=float, default=None, help="seconds before the job is stopped")
    @argument("--quiet", action="store_true", help="do not print the region report (with --exclusive)")
    @cell_magic
    def krex(self, line: str, cell: str) -> Any:
        """Run the cell on this kernel's context worker (warm, on this kernel's GPU), with live output."""
        __tracebackhide__ = True
        args = parse_argstring(self.krex, line)
        self.parse_here(cell)  # a cell that cannot run is not sent to the worker
        pool = self.pool()
        current = _current_session()
        gpu = current.gpu if current is not None else _env_gpu()
        _live.dangling = False
        try:
            result = pool.run_code(
                cell, gpu=gpu, lease=self._lease, exclusive=args.exclusive, timeout=args.timeout, on_output=_write_live
            )
        except KrexError as exc:
            raise _explain(exc) from None
        sys.stdout.flush()
        sys.stderr.flush()
        if result.notice:
            print(f"KREX: {result.notice}", file=sys.stderr, flush=True)
        if args.exclusive and result.region and not args.quiet:
            _print_own_line(result.region.summary(), _live.dangling)
        if not result.ok:
            raise _job_error(result)
        return _Repr(result.value) if result.value is not None else None

    def pool(self) -> Any:
        try:
            from .workers.client import PoolClient
            from .workers.endpoint import default_endpoint
        except ImportError as exc:
            raise KrexCellError(
                f"%%krex needs the pool service (krex_lab.workers), which is not available here: {exc}"
            ) from None
        endpoint = default_endpoint()
        if self._pool is not None and self._pool.endpoint != endpoint:  # KREX_POOL_ENDPOINT changed
            threading.Thread(target=_release_and_close, args=(self._pool, self._lease), daemon=True).start()
            self._pool = None
        if self._pool is None:
            try:
                self._pool = PoolClient.connect(endpoint)
            except KrexError as exc:
                raise _explain(exc) from None
            if not self._atexit:
                atexit.register(self._release_lease)
                self._atexit = True
        return self._pool

    def _release_lease(self) -> None:
        """At exit: give the lease back (its worker is reset for others), waiting at most 1 s."""
        if self._pool is not None:
            t = threading.Thread(target=_release_and_close, args=(self._pool, self._lease), daemon=True)
            t.start()
            t.join(1.0)

    # -- %krex_status ---------------------------------------------------------------------
    @line_magic
    def krex_status(self, line: str = "") -> None:
        """Print the node's GPUs, holders, queues and sessions."""
        __tracebackhide__ = True
        from .client import status
        from .node_status import format_table
        from .serverext.arbiter_kind import describe, kind_of_current

        try:
            table = status(timeout=5.0)
        except KrexError as exc:
            raise _explain(exc) from None
        endpoint = table.get("arbiter", {}).get("endpoint") or os.environ.get("KREX_ENDPOINT", "")
        print(f"KREX: {describe(kind_of_current(), endpoint)}")
        print(format_table(table))


def _job_error(result: Any) -> Exception:
    status = getattr(result, "status", "")
    error = result.error or "the job failed"
    if status == "exception" and result.traceback:
        return RemoteCellError(error, result.traceback)
    if status == "died":  # what the worker printed as it died was already streamed to the cell
        return KrexCellError(
            f"%%krex: the context worker died ({error}). This kernel is fine; the worker's "
            "namespace is lost and the next %%krex cell gets a fresh worker."
        )
    return KrexCellError(f"%%krex: {error}", result.traceback or "")


class _Tail:
    """Stands in for ``sys.stdout`` while a cell runs, remembering whether its output ended
    inside a line (``print(i, end=" ")``): the report must not be glued onto it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.dangling = False

    @classmethod
    def install(cls) -> _Tail:
        tail = cls(sys.stdout)
        sys.stdout = tail
        return tail

    def remove(self) -> None:
        if sys.stdout is self:  # the cell may have replaced it itself: then leave its choice
            sys.stdout = self._stream

    def write(self, text: str) -> int:
        if text:
            self.dangling = not text.endswith("\n")
        return int(self._stream.write(text) or 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


#: the live output of the last ``%%krex`` job on this kernel's stdout
_live = _Tail(None)


def _print_own_line(text: str, dangling: bool) -> None:
    """``text`` on a line of its own, after output that did not end its line."""
    print(("\n" if dangling else "") + text, flush=True)


def _write_live(stream: str, text: str) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(text)
    out.flush()
    if stream != "stderr" and text:
        _live.dangling = not text.endswith("\n")


def _release_and_close(pool: Any, lease: str) -> None:
    """In a thread of its own: the client's sockets are used and closed by that thread alone."""
    try:
        pool.release_lease(lease)
    except Exception:
        pass
    finally:
        pool.close()


def _cell_number(shell: Any) -> int:
    """The number IPython gives the running cell (``Cell In[N]``): the count has already moved on
    to the next cell while a cell runs."""
    return max(shell.execution_count - 1, 0)


def _current_session() -> Any:
    from .client import current_session

    return current_session()


def _env_gpu() -> int | None:
    value = os.environ.get(paths.GPU_ENV, "").strip()
    return int(value) if value.isdigit() else None


def _exit_with(pid: int) -> None:
    """End this process when ``pid`` exits (a :class:`~krex_lab.provisioner.SiblingKernel`'s owner)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        os._exit(0)
    select.select([fd], [], [])
    os._exit(0)


def load_ipython_extension(ipython: Any) -> None:
    from .wait_notice import mark_cell_stderr

    ipython.register_magics(KrexMagics)
    mark_cell_stderr()  # the processes this kernel starts say their waits in one line of the cell
    owner = os.environ.get("KREX_EXIT_WITH", "")
    if owner.isdigit():
        threading.Thread(target=_exit_with, args=(int(owner),), name="krex-exit-with", daemon=True).start()
    if os.environ.get("KREX_KERNEL_ID"):  # a kernel of the krex kernelspec: register it now
        magics = ipython.magics_manager.registry["KrexMagics"]
        try:
            magics.session()
        except KrexError as exc:
            print(
                f"KREX: this kernel is not registered with an arbiter ({exc}); %%krex_exclusive will try again",
                file=sys.stderr,
            )
