"""The ``krex`` command: ``arbiter``, ``status``, ``exclusive``, ``run``, ``lab``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from .errors import KrexError


def _status(args: argparse.Namespace) -> int:
    from .arbiter.status import format_table
    from .client import status

    table = status()
    print(json.dumps(table, indent=2) if args.json else format_table(table))
    return 0


def _exclusive(args: argparse.Namespace) -> int:
    from .client import attach, exclusive

    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        print("krex exclusive: give a command after --", file=sys.stderr)
        return 2
    attach(gpu=args.gpu, name=f"krex exclusive {os.path.basename(cmd[0])}", role="cli")
    with exclusive(gpu=args.gpu, max_hold=args.max_hold) as region:
        if not args.quiet:
            print(region.report.summary(), file=sys.stderr)
        env = dict(os.environ, KREX_REGION=region.id or "")
        proc = subprocess.Popen(cmd, env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
    if not args.quiet:
        print(region.report.summary(), file=sys.stderr)
    # Like a shell: a command killed by signal N exits 128 + N.
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["arbiter"]:
        from .arbiter.app import main as arbiter_main

        arbiter_main(argv[1:])
        return
    if argv[:1] == ["pool"]:
        from .workers.pool import main as pool_main

        pool_main(argv[1:])
        return
    if argv[:1] == ["lab"]:  # its options go on to JupyterLab: argparse must not see them
        sys.exit(_lab(argv[1:]))
    parser = argparse.ArgumentParser(prog="krex", description="KREX Lab: region-granular GPU exclusivity")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("arbiter", help="run the node arbiter (krex arbiter --help-all for every option)")
    p = sub.add_parser("status", help="GPUs, holders, queues and sessions of this node")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_status)
    p = sub.add_parser("exclusive", help="run a command with the GPU to itself")
    p.add_argument("--gpu", type=int, default=None)
    p.add_argument("--max-hold", type=float, default=None, help="lease in seconds")
    p.add_argument("--quiet", action="store_true", help="do not print the region report")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=_exclusive)
    sub.add_parser("pool", help="run this user's pool of warm context workers in the foreground "
                   "(krex pool --help-all for every option)")
    p = sub.add_parser("run", help="run SCRIPT.py on a warm context worker, as `python SCRIPT.py` would")
    from .workers.run_cli import add_arguments

    add_arguments(p)
    p.set_defaults(func=_run)
    p = sub.add_parser("lab", help="JupyterLab with KREX (embedded arbiter; fake backend without a GPU)")
    p.set_defaults(func=_lab)
    args = parser.parse_args(argv)
    try:
        sys.exit(args.func(args))
    except KrexError as exc:
        print(f"krex: {exc}", file=sys.stderr)
        sys.exit(1)


def _run(args: argparse.Namespace) -> int:
    from .workers.run_cli import run

    return run(args)


def _lab(args: argparse.Namespace | list[str]) -> int:
    """JupyterLab with the KREX extension, arbiter and kernelspec (see krex_lab.serverext.lab)."""
    from .serverext.lab import main as lab_main

    return lab_main(args if isinstance(args, list) else [])


if __name__ == "__main__":
    main()
