"""``krex run`` the short way: a warm pool's plain UNIX socket, the standard library only.

A warm ``krex run`` is worth what it costs to start: ZeroMQ and msgspec alone take longer to
import than the whole budget of a command that should cost what ``python`` costs. So the pool
also listens on a plain stream socket next to its ZeroMQ one (:func:`socket_path`: the ipc path
plus ``.run``), and :func:`run` speaks to it with the C parts of ``socket`` and ``json`` (their
Python modules bring ``re``, ``enum`` and ``selectors``: a third of the budget). Each message is
one frame: a 4-byte big-endian length, then a JSON object. The objects are the pool's own wire
structs (:mod:`krex_lab.workers.wire`) encoded as JSON; this module only names their fields
(``tests/workers/test_fast_run.py`` ties each name here to its struct)::

    pool -> client   PoolInfo                         on accept, before anything is read
    client -> pool   FastRun {op: run, job: JobSpec}  one job, a script
    pool -> client   Accepted, Output*, FastResult {kind: result, result: JobResult}
                     or FastError {kind: error, type, message}
    client -> pool   FastInterrupt {op: interrupt, force}   on Ctrl-C, any number

Trust is the kernel's, as on the ZeroMQ path (:mod:`.trust`), and tighter: the credentials are
read (``SO_PEERCRED``) on the very connection that carries the job, before a byte is sent, so no
path can be swapped between a check and a connect; a listener of another uid gets nothing. The
pool checks the client's credentials the same way (its own uid only, root included).

:func:`run` returns None, having sent nothing and read nothing of stdin, whenever this path
cannot serve the call as the full one would: no pool listens here (the full path starts one),
a listener of another user (the full path says who), options it does not handle (``--exclusive``,
``--help``, a bad value: the full parser says what is wrong), a GPU the pool does not serve (the
full path makes it serve it), a process inside a region, text JSON cannot carry. The caller then
runs the full ``krex run`` (:mod:`.run_cli`) with the same arguments.
"""

from __future__ import annotations

import os
import sys

# The C halves of `socket` and `json`, which those modules wrap: the same code, without the
# Python layers' imports. Where an interpreter lacks them, the modules themselves.
try:
    from _socket import AF_UNIX, SO_PEERCRED, SOCK_CLOEXEC, SOCK_STREAM, SOL_SOCKET
    from _socket import socket as _unix_socket
except ImportError:  # pragma: no cover - CPython has it
    from socket import AF_UNIX, SO_PEERCRED, SOCK_CLOEXEC, SOCK_STREAM, SOL_SOCKET
    from socket import socket as _unix_socket  # type: ignore[assignment]

TYPE_CHECKING = False  # `typing` costs this path's start; the checker alone reads these names
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypedDict

    class RunArgs(TypedDict):
        """``krex run``'s arguments, as :func:`parse` reads them (the full parser's names)."""

        gpu: int | None
        timeout: float | None
        quiet: bool
        script: str
        args: list[str]

    class ResultFields(TypedDict, total=False):
        """A ``JobResult`` as JSON: the fields :class:`_Result` reads (any may be missing)."""

        ok: bool
        status: str
        exit_code: int | None
        error: str | None
        traceback: str | None
        notice: str | None

    class PoolFrame(TypedDict, total=False):
        """Any frame the pool sends (``FIELDS``): its greeting (``PoolInfo``) or, by ``kind``,
        ``Accepted``, ``Output``, ``FastResult`` or ``FastError``. Read with ``get``: a frame
        is JSON from another process, checked where it is used."""

        pid: int
        uid: int
        gpus: list[int]
        no_arbiter: str | None
        kind: str
        stream: str
        text: str
        result: ResultFields
        type: str
        message: str


#: the suffix of the plain socket next to the pool's ipc socket (``pool.sock`` -> ``pool.sock.run``)
SUFFIX = ".run"
#: the largest frame either side accepts (the pool's own message limit: a script's stdin travels whole)
MAX_FRAME = 256 << 20
#: seconds a pool has to greet a connection (it does so before reading anything)
HELLO_TIMEOUT = 2.0
#: the fields of the frames, by struct (the test checks each against the struct of that name)
FIELDS = {
    "PoolInfo": ("pid", "uid", "gpus", "no_arbiter"),
    "FastRun": ("op", "job"),
    "JobSpec": ("kind", "path", "argv", "cwd", "env", "gpu", "timeout", "stdin"),
    "FastInterrupt": ("op", "force"),
    "Accepted": ("kind",),
    "Output": ("kind", "stream", "text"),
    "FastResult": ("kind", "result"),
    "FastError": ("kind", "type", "message"),
    "JobResult": ("ok", "status", "exit_code", "error", "traceback", "notice", "region"),
}


def _json_codec() -> tuple[Callable[[object], str], Callable[[str], object]]:
    """``(dumps, loads)``: ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`` and
    ``json.loads``, made of ``_json`` (the accelerator ``json`` itself uses) where it exists."""
    try:
        import _json
    except ImportError:  # pragma: no cover - CPython has it
        import json

        return (lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":"))), json.loads

    def no_constant(name: str) -> object:
        raise ValueError(f"{name} is not a value a pool sends")

    class Context:  # what json.JSONDecoder hands the scanner: plain JSON, nothing hooked
        strict = True
        object_hook = object_pairs_hook = None
        parse_float, parse_int, parse_constant = float, int, no_constant
        memo: dict[str, str] = {}

    scan = _json.make_scanner(Context())  # type: ignore[arg-type]  # typeshed wants a JSONDecoder
    # (markers, default, encoder, indent, separators, sort_keys, skipkeys, allow_nan), as json.encoder
    encode = _json.make_encoder(None, None, _json.encode_basestring, None, ":", ",", False, False, False)  # type: ignore[arg-type]

    def dumps(obj: object) -> str:
        return "".join(encode(obj, 0))

    def loads(text: str) -> object:
        obj, end = scan(text, 0)
        if end != len(text):
            raise ValueError("extra data after the JSON value")
        return obj

    return dumps, loads


_dumps, _loads = _json_codec()


def no_arbiter_line(why: str) -> str:
    """What ``krex run`` says on stderr when its pool has no arbiter (both paths print this)."""
    return (
        f"krex run: {why}: this run has no GPU exclusivity and regions are unavailable; start one with `krex arbiter`"
    )


def pool_died_line(pid: object) -> str:
    """The error of a run whose pool went away before its result (both paths)."""
    return f"the pool (pid {pid}) exited while the job ran"


def socket_path(env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The plain socket of this user's pool, as :func:`krex_lab.workers.endpoint.default_endpoint`
    and :func:`krex_lab.paths.own_runtime_dir` place its ipc socket; None where only they can say
    (a tcp endpoint, a runtime dir that is not this user's, none found yet): the full path decides.
    Reads the filesystem only (lstat, a listing of /tmp): it creates nothing."""
    endpoint = env.get("KREX_POOL_ENDPOINT")
    if endpoint:
        return endpoint[len("ipc://") :] + SUFFIX if endpoint.startswith("ipc://") else None
    directory = _own_runtime_dir(env)
    return None if directory is None else os.path.join(directory, "pool.sock" + SUFFIX)


def _own_runtime_dir(env: dict[str, str] | os._Environ[str]) -> str | None:
    euid = os.geteuid()
    for directory in (env.get("KREX_RUNTIME_DIR"), "/run/krex" if euid == 0 else None):
        if directory:  # krex_lab.paths.runtime_dir: the first of these that is set, if it is ours
            try:
                st = os.lstat(directory)
            except OSError:
                return None
            return os.path.abspath(directory) if st.st_uid == euid else None
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.access(xdg, os.W_OK):
        return os.path.join(xdg, "krex")
    return _own_tmp_dir()


def _own_tmp_dir() -> str | None:
    """The first of :func:`krex_lab.paths._own_tmp_dirs` (``krex-<uid>``, then ``krex-<uid>-*`` by
    name; real directories of this uid closed to others); None if there is none."""
    euid = os.geteuid()
    legacy, prefix, found = f"krex-{euid}", f"krex-{euid}-", []
    try:
        with os.scandir("/tmp") as entries:
            for entry in entries:
                if entry.name == legacy or entry.name.startswith(prefix):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if entry.is_dir(follow_symlinks=False) and st.st_uid == euid and not st.st_mode & 0o077:
                        found.append(entry.name)
    except OSError:
        return None
    found.sort(key=lambda name: (name != legacy, name))
    return os.path.join("/tmp", found[0]) if found else None


def parse(argv: list[str]) -> RunArgs | None:
    """``krex run``'s arguments as its parser reads them, for the forms this path serves; None for
    anything else (the full parser then reads them, errors and help included)."""
    gpu: int | None = None
    timeout: float | None = None
    quiet = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            return {"gpu": gpu, "timeout": timeout, "quiet": quiet, "script": arg, "args": argv[i + 1 :]}
        name, eq, value = arg.partition("=")
        if name == "--quiet" and not eq:
            quiet = True
        elif name in ("--gpu", "--timeout"):
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            if name == "--gpu":
                if not (value.isascii() and value.isdigit()):
                    return None
                gpu = int(value)
            else:
                try:
                    seconds = float(value)
                except ValueError:
                    return None
                if not 0 < seconds < float("inf"):
                    return None
                timeout = seconds
        else:
            return None  # --exclusive, --help, --, an abbreviation, a typo: the full parser's
        i += 1
    return None


def _frame(obj: object) -> bytes:
    body = _dumps(obj).encode()  # raises UnicodeEncodeError on surrogates (bytes that were no text)
    return len(body).to_bytes(4, "big") + body


class _Frames:
    """The pool's frames, read from ``sock``. What has arrived is kept across a Ctrl-C that
    interrupts a read (the frame it cut goes on where it stopped)."""

    def __init__(self, sock: _unix_socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def next(self) -> PoolFrame | None:
        """The next object; None at EOF (the pool went away) or on a frame no pool sends."""
        while True:
            if len(self.buf) >= 4:
                size = int.from_bytes(self.buf[:4], "big")
                if size > MAX_FRAME:
                    return None
                if len(self.buf) >= 4 + size:
                    body = bytes(self.buf[4 : 4 + size])
                    del self.buf[: 4 + size]
                    try:
                        obj = _loads(body.decode())
                    except (ValueError, StopIteration):  # StopIteration: the scanner found no value
                        return None
                    # a map is taken for a frame: each field is checked where it is read
                    return obj if isinstance(obj, dict) else None  # type: ignore[return-value]
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionError, TimeoutError):  # the pool went away
                return None
            if not chunk:
                return None
            self.buf += chunk


def _connect(path: str) -> _unix_socket | None:
    """A connection to this user's own listener at ``path``; None (nothing sent) otherwise."""
    sock = _unix_socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)
    try:
        sock.connect(path)
        creds = sock.getsockopt(SOL_SOCKET, SO_PEERCRED, 12)
    except OSError:
        sock.close()
        return None
    if int.from_bytes(creds[4:8], sys.byteorder) != os.geteuid():  # struct ucred {pid, uid, gid}
        sock.close()
        return None
    return sock


class _Result:
    """A JobResult read from JSON: the attributes :func:`report` reads."""

    def __init__(self, fields: ResultFields) -> None:
        self.ok = bool(fields.get("ok"))
        self.status = fields.get("status", "ok")
        self.exit_code = fields.get("exit_code")
        self.error = fields.get("error")
        self.traceback = fields.get("traceback")
        self.notice = fields.get("notice")
        self.region = None  # only --exclusive has one, and it goes the full way


def run(argv: list[str]) -> int | None:
    """``krex run ARGV`` through the pool's plain socket: the exit code, or None (nothing done,
    nothing sent, stdin unread) where the full path must serve it (see the module's docstring)."""
    opts = parse(argv)
    if opts is None or os.environ.get("KREX_REGION", "").strip():
        return None  # a process inside a region: its jobs join it, which the full path arranges
    path = os.path.abspath(opts["script"])
    where = socket_path()
    if where is None or not os.path.exists(path):
        return None
    sock = _connect(where)
    if sock is None:
        return None
    try:
        return _run_on(sock, path, opts)
    finally:
        sock.close()


def _run_on(sock: _unix_socket, path: str, opts: RunArgs) -> int | None:
    frames = _Frames(sock)
    sock.settimeout(HELLO_TIMEOUT)  # a pool greets at once; a listener that does not is no pool
    info = frames.next()
    sock.settimeout(None)
    if info is None or info.get("uid") != os.geteuid() or not isinstance(info.get("gpus"), list):
        return None
    if opts["gpu"] is not None and opts["gpu"] not in info["gpus"]:
        return None  # the full path makes the pool serve it
    try:
        job = {
            "kind": "script",
            "path": path,
            "argv": list(opts["args"]),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "gpu": opts["gpu"],
            "timeout": opts["timeout"],
            "stdin": None,
        }
        _frame({"op": "run", "job": job})
    except (OSError, UnicodeEncodeError):  # a cwd gone, bytes that are no text: the full way says what
        return None
    # From here on this path serves the call: stdin is read, so no other path can.
    from ...errors import InvalidRequest  # imported already, by krex_lab itself
    from .stdin import UNREAD_PIPE, read_stdin, stdin_is_pipe

    try:
        stdin = read_stdin()
    except InvalidRequest as exc:  # larger than a job carries
        print(f"krex run: {exc}", file=sys.stderr)
        return 2
    if stdin is None and stdin_is_pipe():
        print(f"krex run: {UNREAD_PIPE}", file=sys.stderr, flush=True)
    if stdin is not None:
        import binascii  # msgspec reads bytes in JSON as base64

        job["stdin"] = binascii.b2a_base64(stdin, newline=False).decode()
    quiet = os.environ.get("KREX_QUIET", "") not in ("", "0")  # krex_lab.paths.quiet(), without pathlib
    why = info.get("no_arbiter")
    if why and not quiet:
        print(no_arbiter_line(str(why)), file=sys.stderr, flush=True)
    sock.sendall(_frame({"op": "run", "job": job}))
    result = _follow(frames)
    if result is None:
        print(f"krex run: {pool_died_line(info.get('pid', '?'))}", file=sys.stderr)
        return 1
    if isinstance(result, int):
        return result
    from .run_report import report

    return report(result, quiet=opts["quiet"])


def _follow(frames: _Frames) -> _Result | int | None:
    """Stream the job's output until its result; Ctrl-C interrupts it, a second kills its worker,
    a third gives up waiting (as the full path does). An int: the exit code already decided."""
    sock, interrupts = frames.sock, 0
    while True:
        try:
            msg = frames.next()
            if msg is None:
                return None
            kind = msg.get("kind")
            if kind == "output":
                target = sys.stderr if msg.get("stream") == "stderr" else sys.stdout
                try:
                    target.write(msg.get("text", ""))
                    target.flush()
                except BrokenPipeError:  # `krex run big.py | head`: the job ends too
                    _send_quietly(sock, {"op": "interrupt", "force": True})
                    quiet_stdout()
                    return 141
            elif kind == "result":
                return _Result(msg.get("result") or {})
            elif kind == "error":
                from ...errors import error_from_wire, exit_code

                exc = error_from_wire(str(msg.get("type")), str(msg.get("message")))
                print(f"krex run: {exc}", file=sys.stderr)
                return exit_code(exc)
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 3:
                return 130
            _send_quietly(sock, {"op": "interrupt", "force": interrupts >= 2})


def _send_quietly(sock: _unix_socket, obj: object) -> None:
    try:
        sock.sendall(_frame(obj))
    except OSError:
        pass  # the pool went away: the next read says so


def quiet_stdout() -> None:
    """stdout's reader has gone: point it at /dev/null, so that nothing fails on the way out (as cli's)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
