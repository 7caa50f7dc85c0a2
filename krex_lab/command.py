"""The ``krex`` command's entry point.

A ``krex run`` that this user's warm pool can serve goes the short way (:mod:`krex_lab.workers.
client.fast_run`: the standard library and a plain UNIX socket, so the command costs about what
``python`` costs to start); every other call, and a run the short way declines (it then has sent
nothing and read nothing), goes to the full command tree, :func:`krex_lab.cli.main`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        from .workers.client.fast_run import run

        try:
            code = run(argv[1:])
        except KeyboardInterrupt:  # before the job was sent (after it, the run handles Ctrl-C)
            code = 130
        except BrokenPipeError:  # a reader of stdout or stderr that has gone, as the full way ends
            from .workers.client.fast_run import quiet_stdout

            quiet_stdout()
            code = 141
        if code is not None:
            sys.exit(code)
    from .cli import main as full

    full(argv)


if __name__ == "__main__":
    main()
