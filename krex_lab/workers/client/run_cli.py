"""``krex run [--gpu N] [--exclusive] SCRIPT.py [ARGS...]``: a script on a warm context worker.

Behaves like ``python SCRIPT.py ARGS...`` run here: same arguments, working directory and
environment; stdout and stderr stream as the script writes them; an uncaught exception prints
its traceback to stderr and exits 1, ``sys.exit(n)`` exits ``n``, a KeyboardInterrupt exits 130,
a worker killed by signal N exits 128 + N (as a shell reports it). Differences: the interpreter
is warm (frameworks imported, CUDA context made), and a crash costs a worker, not the caller.
"""

from __future__ import annotations

import argparse
import os
import sys

from .fast_run import no_arbiter_line
from .run_report import report

__all__ = ["add_arguments", "report", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", type=int, default=None, help="run on this GPU (default: any with a free worker)")
    p.add_argument("--exclusive", action="store_true", help="run the whole script inside a region held by its worker")
    p.add_argument(
        "--timeout", type=_positive, default=None, metavar="SECONDS", help="seconds before the script is interrupted"
    )
    p.add_argument("--quiet", action="store_true", help="do not print the region report (--exclusive)")
    p.add_argument("script", help="the Python script to run")
    rest = p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    rest.required = False  # argparse counts a REMAINDER as required: "required: script, args"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, not {text!r}")
    return value


def _write(stream: str, text: str) -> None:
    target = sys.stderr if stream == "stderr" else sys.stdout
    target.write(text)
    target.flush()


def run(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.script)
    if not os.path.exists(path):
        print(f"{sys.executable}: can't open file {path!r}: [Errno 2] No such file or directory", file=sys.stderr)
        return 2
    from ... import paths
    from ...errors import InvalidRequest
    from .pool_client import PoolClient, read_stdin
    from .stdin import UNREAD_PIPE, stdin_is_pipe

    try:
        stdin = read_stdin()
    except InvalidRequest as exc:
        print(f"krex run: {exc}", file=sys.stderr)
        return 2
    if stdin is None and stdin_is_pipe():  # what arrives later is never read: say so, not silently
        print(f"krex run: {UNREAD_PIPE}", file=sys.stderr, flush=True)
    # The placement is the pool's to decide: its worker keeps its own placement variables and
    # drops the caller's (Run.keep_env), so that this command needs no GPU backend registry.
    env = dict(os.environ)
    client = PoolClient.connect(start=True)
    if args.gpu is not None and client.info is not None and args.gpu not in client.info.gpus:
        from .follow import serve_gpu  # a pool started before the node's arbiter: it follows it

        try:
            client = serve_gpu(client, args.gpu)
        except InvalidRequest as exc:
            client.close()
            print(f"krex run: {exc}", file=sys.stderr)
            return 2
    if client.info is not None and client.info.no_arbiter and not args.exclusive and not paths.quiet():
        # (--exclusive says it in its own error) Without an arbiter nothing is protected: say so
        # here, not only in the pool's log.
        print(no_arbiter_line(client.info.no_arbiter), file=sys.stderr, flush=True)
    try:
        result = client.run_script(
            path,
            list(args.args),
            gpu=args.gpu,
            exclusive=args.exclusive,
            cwd=os.getcwd(),
            env=env,
            timeout=args.timeout,
            on_output=_write,
            stdin=stdin,
        )
    finally:
        client.close()
    return report(result, quiet=args.quiet)
