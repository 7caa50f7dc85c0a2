"""The ``krex`` command, one argparse tree: ``krex {arbiter,pool,status,exclusive,run,lab,slurm,...}``.

Each subcommand's parser owns its errors: ``krex status --bogus`` prints ``krex status``'s usage
and exits 2. ``arbiter`` and ``pool`` are traitlets applications: their common options (the
applications' ``aliases`` and ``flags``) are declared here from the applications themselves,
and any ``--Class.trait=value`` goes through to the application unchanged (``krex arbiter
--help-all`` lists them all). ``lab``'s own options are declared here; the rest go to JupyterLab.

The parsers themselves (a subcommand's own errors, its arguments added when first used, near
misses suggested) are :mod:`krex_lab.cli_parsers`. Importing this module is cheap: what a
subcommand needs (jupyter, zmq, the pool) is imported when that subcommand's parser is first
used, or when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .cli_parsers import AppLoader, AppMain, AppOptions, CommandParser, SuggestingParser
from .errors import BAD_CALL, FAILED, KrexError, exit_code, fail_as_json

if TYPE_CHECKING:
    import subprocess

# json, shutil and subprocess are imported by the subcommands that use them: every `krex run`
# pays for what this module imports.

# -- arbiter, pool: traitlets applications -----------------------------------------------------


def _arbiter_app() -> tuple[AppOptions, AppMain]:
    from .arbiter.app import ArbiterApp, main

    return ArbiterApp, main


def _pool_app() -> tuple[AppOptions, AppMain]:
    from krex_lab.workers.pool import PoolApp, main

    return PoolApp, main


def _app_command(load: AppLoader) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        app, main = load()
        main(app.argv_from(args))
        return 0

    return run


def _app_populate(load: AppLoader) -> Callable[[argparse.ArgumentParser], None]:
    def populate(parser: argparse.ArgumentParser) -> None:
        load()[0].add_arguments(parser)

    return populate


# -- status, exclusive, run, lab ----------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    if args.ray:  # every node of a Ray cluster, gathered through Ray (docs/cluster.md)
        from .ray.status import run

        return int(run(args))
    import json

    from .client import status
    from .node_status import format_table

    try:
        table = status()
    except KrexError as exc:
        if not args.json:
            raise
        # Whoever asked for JSON parses stdout: the failure is JSON too (and the exit code says it).
        return fail_as_json("krex status", exc)
    print(json.dumps(table, indent=2) if args.json else format_table(table))
    return 0


#: ``krex exclusive --strict``: the exit code when the command succeeded but its region did not
#: hold to the end (the lease expired, or an admin ended it)
STRICT_EXIT = 3


def _command_problem(name: str) -> tuple[int, str] | None:
    """What a shell would say before running ``name``: (127, "command not found"),
    (126, "Permission denied" / "Is a directory"), or None when it can be run."""
    import shutil

    if os.sep not in name:
        found = shutil.which(name)
        if found is None:
            return 127, "command not found"
        name = found
    if not os.path.exists(name):
        return 127, "No such file or directory"
    if os.path.isdir(name):
        return 126, "Is a directory"
    if not os.access(name, os.X_OK):
        return 126, "Permission denied"
    return None


def _exit_code(code: int) -> int:
    """Like a shell: a command killed by signal N exits 128 + N."""
    return code if code >= 0 else 128 - code


def _run_in_region(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` to its end and return its exit code, as a shell reports it. Ctrl-C, SIGTERM
    and SIGHUP go to the command (as ``timeout`` and ``env`` pass them on), from before it is
    forked: one that arrives while it starts is noted, and passed on once it runs. After a
    Ctrl-C krex exits 130 whatever the command did. No handler here raises: one that did
    (SIGTERM's default, Ctrl-C's KeyboardInterrupt) had gaps around ``Popen`` in which krex
    died and left the command running outside the region."""
    import subprocess

    proc: subprocess.Popen[bytes] | None = None
    noted: list[int] = []
    interrupted: list[bool] = []

    def forward(signum: int, _frame: object) -> None:
        interrupted.append(signum == signal.SIGINT)
        if proc is None:
            noted.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    passed_on = [signal.SIGTERM, signal.SIGHUP]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # nohup'd or backgrounded: stays ignored
        passed_on.append(signal.SIGINT)
    kept = {s: signal.signal(s, forward) for s in passed_on}
    try:
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as exc:  # removed or changed since the check before the region
            print(f"krex exclusive: {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        for signum in noted:
            proc.send_signal(signum)
        code = _exit_code(proc.wait())
        return 130 if any(interrupted) else code  # as Python exits on Ctrl-C, whatever the command did
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)


def _exclusive(args: argparse.Namespace) -> int:
    from .client import attach, exclusive
    from .errors import LeaseExpired, RegionRevoked

    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        print("krex exclusive: give a command after --", file=sys.stderr)
        return BAD_CALL
    problem = _command_problem(cmd[0])
    if problem is not None:  # said before the GPU is taken, as a shell says it
        print(f"krex exclusive: {cmd[0]}: {problem[1]}", file=sys.stderr)
        return problem[0]
    code = 0
    cut_short = False
    try:
        session = attach(gpu=args.gpu, name=f"krex exclusive {os.path.basename(cmd[0])}", role="cli")
        region = exclusive(gpu=args.gpu, max_hold=args.max_hold)
        # The session ends with its region: a session left registered while this process exits is a
        # sibling of the next region on the GPU, which froze it on its way out (a Slurm job cancelled
        # mid-region stayed stopped for the whole of the next job's region).
        region.leave = True
        region.protects = "command"
        try:
            with contextlib.closing(session), region:
                if not args.quiet:
                    print(region.report.summary(), file=sys.stderr)
                env = dict(os.environ, KREX_REGION=region.id or "")
                code = _run_in_region(cmd, env)
        except (LeaseExpired, RegionRevoked) as exc:
            print(f"krex exclusive: {exc}", file=sys.stderr)
            cut_short = True
    except KeyboardInterrupt:  # while waiting for the region: nothing ran
        return 130
    if not args.quiet:
        print(region.report.summary(), file=sys.stderr)
    if cut_short and args.strict and code == 0:
        return STRICT_EXIT
    return code


def _delegate(module: str, run: str = "run") -> tuple[Callable[[argparse.ArgumentParser], None], Callable[..., int]]:
    """(populate, func) of a subcommand whose options and body live in ``module`` (relative to this
    package: ``add_arguments(parser)`` and ``run(args)``), imported only when that subcommand is used,
    so that ``import krex_lab.cli`` stays cheap."""

    def populate(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module, __package__).add_arguments(parser)

    def func(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module, __package__), run)(args))

    return populate, func


RUN_HELP = "run SCRIPT.py on a warm context worker, as `python SCRIPT.py` would"
RUN_DESCRIPTION = "Run SCRIPT.py on a warm context worker, as `python SCRIPT.py` would."


def parse_run_args(argv: list[str]) -> argparse.Namespace:
    """``krex run ARGS``'s parse alone: the warm path builds no other subcommand's parser (the
    same parser the tree holds under ``run``, its errors and help the same)."""
    populate, func = _delegate(".workers.client.run_cli")
    parser = CommandParser(prog="krex run", description=RUN_DESCRIPTION, populate=populate)
    args = parser.parse_args(argv)
    args.cmd, args.func = "run", func
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(prog="krex", description="KREX Lab: region-granular GPU exclusivity")
    sub = parser.add_subparsers(
        dest="cmd",
        required=True,
        metavar="{arbiter,supervise,pool,status,history,exclusive,run,eval,mcp,lab,hub-config,slurm}",
        parser_class=CommandParser,
    )
    p = sub.add_parser(
        "arbiter",
        help="run the node arbiter (krex arbiter --help-all for every option)",
        description="The KREX node arbiter: region-granular GPU exclusivity for every session "
        "on this node. Any --Class.trait=value option goes to the arbiter application.",
        populate=_app_populate(_arbiter_app),
        app_options=True,
    )
    p.set_defaults(func=_app_command(_arbiter_app))
    p = sub.add_parser(
        "pool",
        help="run this user's pool of warm context workers in the foreground (krex pool --help-all for every option)",
        description="This user's KREX pool of warm context workers. Any --Class.trait=value "
        "option goes to the pool application.",
        populate=_app_populate(_pool_app),
        app_options=True,
    )
    p.set_defaults(func=_app_command(_pool_app))
    populate, func = _delegate(".arbiter.supervisor")
    p = sub.add_parser(
        "supervise",
        help="run an arbiter under a supervisor that undoes and restarts it after a crash (where systemd does not)",
        description="Run a KREX arbiter, undo its journal whenever it exits and restart it unless "
        "it stopped cleanly. Example: krex supervise --runtime-dir /run/krex -- krex arbiter "
        "--multi-user",
        populate=populate,
    )
    p.set_defaults(func=func)
    p = sub.add_parser(
        "status",
        help="GPUs, holders, queues and sessions of this node",
        description="GPUs, holders, queues and sessions of this node.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--ray", action="store_true", help="every KREX node of the Ray cluster (needs krex-lab[ray])")
    p.add_argument("--ray-address", default="auto", help="with --ray: the cluster's address (default: auto)")
    p.set_defaults(func=_status)
    populate, func = _delegate(".arbiter.history_cli")
    p = sub.add_parser(
        "history",
        help="finished regions (kept across arbiter restarts), or GPU-hours per user with --usage",
        description="Finished regions from the arbiter's history database, or with --usage the "
        "GPU-hours held per user and per GPU.",
        populate=populate,
    )
    p.set_defaults(func=func)
    p = sub.add_parser(
        "exclusive",
        help="run a command with the GPU to itself",
        description="Run a command inside one region: the GPU to itself. Exits with the command's own "
        "code, as a shell would: 127 when it is not found, 126 when it cannot be run, 128+N when "
        "killed by signal N, 130 on Ctrl-C. A lease that expires before the command ends is "
        f"reported on stderr and changes the code only with --strict (then {STRICT_EXIT}).",
    )
    p.add_argument("--gpu", type=int, default=None, help="the GPU (default: KREX_GPU, else the arbiter places)")
    p.add_argument("--max-hold", type=float, default=None, help="lease in seconds")
    p.add_argument("--quiet", action="store_true", help="do not print the region report")
    p.add_argument(
        "--strict",
        action="store_true",
        help=f"exit {STRICT_EXIT} when the command succeeded but its region did not hold to the end "
        "(the lease expired, or an admin ended it); without it that is reported on stderr only",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=_exclusive)
    populate, func = _delegate(".workers.client.run_cli")
    p = sub.add_parser("run", help=RUN_HELP, description=RUN_DESCRIPTION, populate=populate)
    p.set_defaults(func=func)
    populate, func = _delegate(".evaluate.cli")
    p = sub.add_parser(
        "eval",
        help="evaluate a candidate kernel against its reference (KernelBench or GPU MODE): a verdict",
        description="Compile, check and time CANDIDATE against REFERENCE (KernelBench or GPU MODE format) on "
        "a warm context worker, timed inside a region. Exit 0 when the candidate is correct, 1 otherwise; "
        "--batch MANIFEST writes one JSON line per pair.",
        populate=populate,
    )
    p.set_defaults(func=func)
    populate, func = _delegate(".evaluate.mcp_server")
    p = sub.add_parser(
        "mcp",
        help="an MCP server on stdio (evaluate_kernel, gpu_status, region_history) for LLM agents",
        description="A Model Context Protocol server on stdin/stdout with the tools evaluate_kernel, "
        "gpu_status and region_history (needs the mcp package: pip install 'krex-lab[eval]').",
        populate=populate,
    )
    p.set_defaults(func=func)
    populate, func = _delegate(".serverext.lab", run="launch")
    p = sub.add_parser(
        "lab",
        help="JupyterLab with KREX (embedded arbiter; fake backend without a GPU)",
        description="JupyterLab with KREX: the extension, an arbiter (embedded when none "
        "answers) and the krex kernelspec. Any other option goes to JupyterLab.",
        populate=populate,
        keep_unknown="jupyterlab_args",
        allow_abbrev=False,
    )
    p.set_defaults(func=func)
    populate, func = _delegate(".hub.config")
    p = sub.add_parser(
        "hub-config",
        help="write a jupyterhub_config.py with KREX wired in (node arbiter, admin page, quotas)",
        description="A jupyterhub_config.py for a GPU node: the node arbiter and the KREX admin page as "
        "managed services, every user's server on the node arbiter, quotas (c.Quotas) in the same file.",
        populate=populate,
    )
    p.set_defaults(func=func)
    populate, func = _delegate(".slurm")
    p = sub.add_parser(
        "slurm",
        help="a Slurm node's prolog and epilog for KREX (run by slurmd as root; extension/slurm)",
        description="prolog: refuse the job (drain the node, saying why) unless the node's arbiter answers, "
        "and record the job for it; epilog: end what the job's sessions still hold. See docs/cluster.md.",
        populate=populate,
    )
    p.set_defaults(func=func)
    return parser


def _quiet_stdout() -> None:
    """The reader of stdout has gone (``krex ... | head``): point stdout at /dev/null so that
    nothing more fails on the way out, as ``python`` and any filter end."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


#: set to see the traceback of an unexpected error instead of its one line
DEBUG_ENV = "KREX_DEBUG"


def main(argv: list[str] | None = None) -> None:
    """Every path ends in one line on stderr, ``krex CMD: ...``, and exit 1 when the work failed,
    2 when the call was wrong (:func:`krex_lab.errors.exit_code`; argparse's usage errors too),
    130 on Ctrl-C, 141 when stdout's reader has gone."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_run_args(argv[1:]) if argv[:1] == ["run"] else build_parser().parse_args(argv)
    prog = f"krex {args.cmd}"
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except KrexError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        code = exit_code(exc)  # 2 for a value the node cannot serve (a GPU it lacks), else 1
    except BrokenPipeError:  # `krex status | head -1`, `krex run big.py | head`
        _quiet_stdout()
        code = 141
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        if os.environ.get(DEBUG_ENV) or args.cmd == "pool":  # the pool's crashes keep their traceback
            raise
        print(f"{prog}: {type(exc).__name__}: {exc} (unexpected; {DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)
        code = FAILED
    sys.exit(code)


if __name__ == "__main__":
    main()
