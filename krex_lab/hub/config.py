"""``krex hub-config``: a ``jupyterhub_config.py`` with KREX wired in.

One file configures both the hub and the node arbiter. The hub starts the arbiter as the managed
service ``krex-arbiter`` (``krex supervise -- krex arbiter --multi-user --config <this file>``),
so the quotas (``c.Quotas.*``) and the privacy rule (``c.Arbiter.privacy``) sit next to the hub's
own settings: traitlets hands each application only its own classes' sections. The admins' page
is the managed service ``krex-admin`` (:mod:`krex_lab.hub.admin_page`, OAuth, scope
``custom:krex:admin``). Every user's server gets the node endpoint and no embedded arbiter, and
the ``krex`` kernelspec's provisioner places kernels over the whole node (fewest sessions, then
most free memory, counting every user's sessions: the node arbiter sees them all).

``--no-arbiter-service`` leaves the arbiter to systemd (``extension/systemd/krex-arbiter.service``
with ``--config`` pointing at the generated file, so the quotas still live there).

The file works as generated, started by the venv's ``jupyterhub`` by absolute path from a plain
``PATH``: who may log in is chosen at generation (``--allow-group``, ``--allow-user`` or
``--allow-all-users``; JupyterHub 5 lets nobody but admins in otherwise), the servers run the venv's
``jupyterhub-singleuser`` with the venv's ``bin`` first on their ``PATH`` (``krex`` in terminals),
and the launcher offers the ``krex`` kernelspec alone (``--plain-kernel`` offers ipykernel's too,
the KREX one staying the default).
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__

ADMIN_SCOPE = "custom:krex:admin"
ADMIN_SERVICE = "krex-admin"
ARBITER_SERVICE = "krex-arbiter"


@dataclass
class HubConfig:
    """What :func:`render` writes (the ``krex hub-config`` options)."""

    python: str = sys.executable
    runtime_dir: str = "/run/krex"
    admin_port: int = 10101
    admins: list[str] = field(default_factory=list)
    admin_group: str = "krex-admin"
    sessions_per_user: int = 64
    queued_per_user: int = 8
    max_hold: float = 0.0
    privacy: str = "private"
    #: Arbiter.shield: what keeps everyone but a holder off its reserved cores
    shield: str = "affinity"
    arbiter_service: bool = True
    backend: str = "auto"
    default_url: str = "/lab"
    arbiter_args: list[str] = field(default_factory=list)
    #: who may log in (JupyterHub 5 admits only admins without an allow rule): Unix groups, users, or all
    allow_groups: list[str] = field(default_factory=list)
    allow_users: list[str] = field(default_factory=list)
    allow_all: bool = False
    #: offer ipykernel's plain ``python3`` kernelspec too (the KREX one stays the default)
    plain_kernel: bool = False
    #: GPUs the fake backend simulates (``--backend fake`` only; 0: the arbiter's default)
    fake_gpus: int = 0


#: what ``krex hub-config`` says when no allow rule was chosen
NO_ALLOW_RULE = (
    "choose who may log in: --allow-group GROUP (Unix group, repeatable), --allow-user USER "
    "(repeatable) or --allow-all-users (every user the authenticator accepts; with the default PAM "
    "authenticator, every account of this machine). Without one, JupyterHub 5 lets only admins in."
)


def _py(value: object) -> str:
    """A Python literal for ``value`` (str, number, list/dict of those)."""
    return json.dumps(value) if not isinstance(value, bool) else repr(value)


def _set(names: list[str]) -> str:
    """A set literal of ``names`` (in their order, without repeats)."""
    return "{" + ", ".join(_py(n) for n in dict.fromkeys(names)) + "}"


def _allow_section(cfg: HubConfig) -> str:
    """The allow rule chosen at generation, as config lines."""
    lines = [
        "# -- who may log in -------------------------------------------------------------------------------",
        "# JupyterHub 5 admits only admins unless an allow rule says otherwise. Chosen by `krex hub-config`",
        "# (--allow-group / --allow-user / --allow-all-users). Admins too need a rule: KREX_ADMINS are",
        "# allowed by name below.",
    ]
    if cfg.allow_all:
        lines.append("c.Authenticator.allow_all = True  # every user the authenticator accepts (PAM: every account)")
    if cfg.allow_groups:
        lines.append(
            f"c.LocalAuthenticator.allowed_groups = {_set(cfg.allow_groups)}  # Unix groups (PAM, the default)"
        )
    users = f" | {_set(cfg.allow_users)}" if cfg.allow_users else ""
    lines.append(f"c.Authenticator.allowed_users = set(KREX_ADMINS){users}")
    return "\n".join(lines)


def render(cfg: HubConfig) -> str:
    """The text of ``jupyterhub_config.py``; ``ValueError`` without an allow rule."""
    if not (cfg.allow_all or cfg.allow_groups or cfg.allow_users):
        raise ValueError(NO_ALLOW_RULE)
    endpoint = f"ipc://{cfg.runtime_dir.rstrip('/')}/arbiter.sock"
    arbiter_args = [*cfg.arbiter_args, *(["--fake-gpus", str(cfg.fake_gpus)] if cfg.fake_gpus else [])]
    kernels = ["krex", "python3"] if cfg.plain_kernel else ["krex"]
    arbiter_cmd = (
        "[KREX_PYTHON, '-m', 'krex_lab.cli', 'supervise', '--runtime-dir', KREX_RUNTIME_DIR, '--',\n"
        "             KREX_PYTHON, '-m', 'krex_lab.cli', 'arbiter', '--multi-user',\n"
        f"             '--runtime-dir', KREX_RUNTIME_DIR, '--backend', {_py(cfg.backend)},\n"
        f"             '--config', THIS_FILE, *{_py(arbiter_args)}]"
    )
    arbiter_service = (
        f"""    {{
        # The node's one root arbiter, under its supervisor (undo + restart after a crash). It
        # reads this very file: the c.Quotas / c.Arbiter sections above.
        "name": "{ARBITER_SERVICE}",
        "command": {arbiter_cmd},
    }},
"""
        if cfg.arbiter_service
        else """    # The arbiter runs under systemd (extension/systemd/krex-arbiter.service); give its
    # ExecStart `--config` with this file's path so that the quotas above apply.
"""
    )
    return f'''\
# jupyterhub_config.py with KREX wired in: generated by `krex hub-config` (krex-lab {__version__}).
# See docs/jupyterhub.md. This one file configures the hub AND the node's KREX arbiter (the
# c.Quotas and c.Arbiter sections): the hub starts the arbiter as the managed service
# "{ARBITER_SERVICE}" with `--config` pointing here. Start the hub as root by the venv's absolute
# path (`/opt/krex/bin/jupyterhub -f THIS_FILE`): nothing here needs the venv on root's PATH.
# Quota edits apply without a restart: SIGHUP to the arbiter, whose pid is the first line of
# KREX_RUNTIME_DIR/arbiter.lock. Other edits: restart the hub.
import os

c = get_config()  # noqa: F821 - provided by traitlets when the file is loaded

KREX_PYTHON = {_py(cfg.python)}
KREX_BIN = os.path.dirname(KREX_PYTHON)  # the venv's bin: jupyterhub-singleuser, krex
KREX_RUNTIME_DIR = {_py(cfg.runtime_dir)}  # the root arbiter's runtime dir (root's, 0755)
KREX_NODE_ENDPOINT = {_py(endpoint)}
KREX_ADMIN_PORT = {cfg.admin_port}
KREX_ADMINS = {_py(cfg.admins)}  # hub users with the KREX admin page (also hub admins)
KREX_ADMIN_GROUP = {_py(cfg.admin_group)}  # hub group with the page; also the arbiter's admin Unix group
THIS_FILE = os.path.abspath(__file__)
# Kernelspecs the users' launchers offer; the first is the default. ipykernel's plain "python3"
# starts kernels that are not KREX sessions: a region neither freezes nor places them, so on a shared
# node a loop in one runs on through other users' regions. Add "python3" here to offer it anyway.
KREX_KERNELS = {_py(kernels)}

{_allow_section(cfg)}

# -- the node arbiter: quotas (per user, per group) and privacy ------------------------------------
# `krex arbiter --help-all` lists every option. Root and the Unix group KREX_ADMIN_GROUP are exempt
# from quotas and may end any region.
c.Quotas.sessions_per_user = {cfg.sessions_per_user}
c.Quotas.queued_per_user = {cfg.queued_per_user}
c.Quotas.max_hold = {float(cfg.max_hold)}  # longest lease one user may ask for (s); 0: Arbiter.max_hold_limit
c.Quotas.users = {{}}  # e.g. {{"alice": {{"queued_per_user": 32, "max_hold": 3600}}}}
c.Quotas.groups = {{}}  # e.g. {{"students": {{"queued_per_user": 2, "max_hold": 120}}}} (Unix groups)
c.Quotas.admin_group = KREX_ADMIN_GROUP
c.Arbiter.privacy = {_py(cfg.privacy)}  # users see others' sessions as names and counts; "open" shows all
# Who leaves a region holder's reserved cores: "affinity" moves every process of the node (and gives
# the cores back after), "sessions" only KREX sessions (other work of the node keeps running there).
c.Arbiter.shield = {_py(cfg.shield)}

# -- every user's server: the KREX extension on the node arbiter, never an embedded one ------------
# The `krex` kernelspec (Python 3 (KREX)) ships with krex-lab; its provisioner asks the node arbiter
# for a GPU (fewest sessions, then most free memory, over every user's sessions).
# The servers run the venv's jupyterhub-singleuser with the venv's bin first on PATH (krex in
# terminals and `!krex` cells), whatever PATH the hub was started with.
c.Spawner.cmd = [os.path.join(KREX_BIN, "jupyterhub-singleuser")]
c.Spawner.environment = {{
    "KREX_NODE_ENDPOINT": KREX_NODE_ENDPOINT,
    "KREX_ENDPOINT": KREX_NODE_ENDPOINT,
    "PATH": os.pathsep.join([KREX_BIN, os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"]),
}}
c.Spawner.args = [
    "--KrexExtensionApp.embedded=False",
    "--KrexExtensionApp.node_endpoint=" + KREX_NODE_ENDPOINT,
    "--MappingKernelManager.default_kernel_name=" + KREX_KERNELS[0],
    *["--KernelSpecManager.allowed_kernelspecs=" + k for k in KREX_KERNELS],
]
c.Spawner.default_url = {_py(cfg.default_url)}

# -- managed services: the arbiter and the admins' page --------------------------------------------
c.JupyterHub.services = [
{arbiter_service}    {{
        # The admins' page: every GPU, holders, queues, sessions by user, region history, quota
        # use, and buttons that end a region. Runs as root (the arbiter's full view).
        "name": "{ADMIN_SERVICE}",
        "url": f"http://127.0.0.1:{{KREX_ADMIN_PORT}}",
        "command": [KREX_PYTHON, "-m", "krex_lab.hub.admin_page", "--config", THIS_FILE],  # reads c.Quotas
        "environment": {{"KREX_ENDPOINT": KREX_NODE_ENDPOINT}},
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": ["{ADMIN_SCOPE}"],
        "display": True,
    }},
]
c.JupyterHub.custom_scopes = {{
    "{ADMIN_SCOPE}": {{"description": "Use the KREX admin page: see every GPU and session, end regions."}},
}}
c.JupyterHub.load_groups = {{KREX_ADMIN_GROUP: {{"users": KREX_ADMINS}}}}
c.JupyterHub.load_roles = [
    {{
        "name": "krex-admin",
        "description": "KREX node administrators",
        "scopes": ["{ADMIN_SCOPE}", "access:services!service={ADMIN_SERVICE}"],
        "users": KREX_ADMINS,
        "groups": [KREX_ADMIN_GROUP],
    }},
]
c.Authenticator.admin_users = set(KREX_ADMINS)
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``krex hub-config``'s options."""
    d = HubConfig()
    parser.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --output file")
    parser.add_argument("--python", default=d.python, help="the Python of krex-lab, for the services (default: this)")
    parser.add_argument(
        "--runtime-dir", default=d.runtime_dir, help="the root arbiter's runtime dir (default /run/krex)"
    )
    parser.add_argument(
        "--admin-port", type=int, default=d.admin_port, help="port of the admin page service (127.0.0.1)"
    )
    parser.add_argument(
        "--admin", action="append", default=[], metavar="USER", help="hub user with the KREX admin page (repeatable)"
    )
    parser.add_argument("--admin-group", default=d.admin_group, help="hub and Unix group of KREX admins")
    parser.add_argument("--sessions-per-user", type=int, default=d.sessions_per_user, help="Quotas.sessions_per_user")
    parser.add_argument("--queued-per-user", type=int, default=d.queued_per_user, help="Quotas.queued_per_user")
    parser.add_argument("--max-hold", type=float, default=d.max_hold, help="Quotas.max_hold (s; 0: no user limit)")
    parser.add_argument("--privacy", choices=["private", "open"], default=d.privacy, help="Arbiter.privacy")
    parser.add_argument(
        "--shield",
        choices=["affinity", "cpuset", "auto", "sessions"],
        default=d.shield,
        help="Arbiter.shield: who leaves a holder's reserved cores (default: every process, affinity)",
    )
    parser.add_argument("--backend", default=d.backend, help="the arbiter's GPU backend (auto, nvidia, amd, fake)")
    parser.add_argument(
        "--fake-gpus", type=int, default=d.fake_gpus, help="GPUs the fake backend simulates (--backend fake)"
    )
    allow = parser.add_argument_group("who may log in (one is required)")
    allow.add_argument(
        "--allow-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="Unix group whose members may log in (repeatable)",
    )
    allow.add_argument(
        "--allow-user", action="append", default=[], metavar="USER", help="user who may log in (repeatable)"
    )
    allow.add_argument(
        "--allow-all-users",
        action="store_true",
        help="every user the authenticator accepts (with PAM: every account of this machine)",
    )
    parser.add_argument(
        "--plain-kernel",
        action="store_true",
        help="offer ipykernel's plain Python 3 kernel too (not a KREX session; the KREX kernel stays the default)",
    )
    parser.add_argument(
        "--no-arbiter-service",
        dest="arbiter_service",
        action="store_false",
        help="do not start the arbiter from the hub (systemd runs it: extension/systemd)",
    )


def config_from(args: argparse.Namespace) -> HubConfig:
    return HubConfig(
        python=args.python,
        runtime_dir=args.runtime_dir,
        admin_port=args.admin_port,
        admins=list(args.admin),
        admin_group=args.admin_group,
        sessions_per_user=args.sessions_per_user,
        queued_per_user=args.queued_per_user,
        max_hold=args.max_hold,
        privacy=args.privacy,
        shield=args.shield,
        arbiter_service=args.arbiter_service,
        backend=args.backend,
        fake_gpus=args.fake_gpus,
        allow_groups=list(args.allow_group),
        allow_users=list(args.allow_user),
        allow_all=args.allow_all_users,
        plain_kernel=args.plain_kernel,
    )


def run(args: argparse.Namespace) -> int:
    """Write the config (``-o``) or print it; 2 (a bad call, nothing written) when ``-o`` exists
    and ``--force`` is not given."""
    try:
        text = render(config_from(args))
    except ValueError as exc:
        print(f"krex hub-config: {exc}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    for group in args.allow_group:  # a typo lets nobody in: say so (the file may be meant for another node)
        try:
            grp.getgrnam(group)
        except KeyError:
            print(f"krex hub-config: warning: no Unix group {group!r} on this machine", file=sys.stderr)
    hidden = _unrunnable_by_others(args.python)
    if hidden:
        print(
            f"krex hub-config: warning: {args.python} resolves through {hidden}, which other users cannot "
            "enter or run: every student's server would fail to start (PermissionError). Make the venv "
            "with a Python they can run, e.g. /usr/bin/python3 -m venv",
            file=sys.stderr,
        )
    out = Path(args.output)
    if out.exists() and not args.force:
        print(f"krex hub-config: {out} exists (--force overwrites it)", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.chmod(0o644)
    hub = Path(args.python).with_name("jupyterhub")
    print(f"krex hub-config: wrote {out}; start the hub as root with `{hub} -f {out.resolve()}`", file=sys.stderr)
    return 0


def _unrunnable_by_others(python: str) -> str:
    """The first directory (or the file) on the way to ``python``'s real file that a user other
    than its owner cannot pass or run ("" when none): students' servers run that Python. Each
    link of the way counts, not only the real file's directories: a venv's link into a private
    directory (root's pyenv in /root) stops them at that link."""
    path = Path(os.path.abspath(python))
    for _ in range(40):  # the kernel's own bound on a chain of links
        where = Path(os.path.realpath(path.parent))
        for part in [*reversed(where.parents), where]:
            closed = _closed_to_others(part)
            if closed:
                return closed
        if not path.is_symlink():
            return _closed_to_others(path)
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
    return str(path)


def _closed_to_others(path: Path) -> str:
    """``path`` when a user other than its owner cannot pass (a directory) or run (a file) it."""
    try:
        return "" if path.stat().st_mode & stat.S_IXOTH else str(path)
    except OSError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="krex hub-config", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
