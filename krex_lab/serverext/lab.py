"""``krex lab``: JupyterLab with the KREX extension, an arbiter (embedded when none answers) and
the ``krex`` kernelspec, from an installed package or straight from a source checkout.

    krex lab [--backend auto|nvidia|amd|fake] [--fake-gpus N] [--no-pool] [JUPYTERLAB OPTIONS...]

From a checkout (``pip install -e .``) the repository's ``extension/`` directories are put
first on ``JUPYTER_PATH`` and ``JUPYTER_CONFIG_PATH``, so the kernelspec and the extension's
config in the tree are the ones used, whatever the install copied.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..gpu import FAKE_GPUS
from ..gpu.vendors import backend_names

REPO_EXTENSION = Path(__file__).resolve().parent.parent.parent / "extension"


def jupyter_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with the source tree's ``extension/`` dirs first, when they exist."""
    env = dict(os.environ if base is None else base)
    share, etc = REPO_EXTENSION / "share" / "jupyter", REPO_EXTENSION / "etc" / "jupyter"
    for var, path in (("JUPYTER_PATH", share), ("JUPYTER_CONFIG_PATH", etc)):
        if path.is_dir():
            parts = [p for p in env.get(var, "").split(os.pathsep) if p and p != str(path)]
            env[var] = os.pathsep.join([str(path), *parts])
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``krex lab``'s own options; whatever else is given goes to JupyterLab (``jupyterlab_args``)."""
    parser.add_argument(
        "--backend",
        default="auto",
        choices=backend_names(),
        help="GPU backend of the embedded arbiter (default: auto)",
    )
    parser.add_argument(
        "--fake-gpus",
        type=int,
        default=FAKE_GPUS,
        metavar="N",
        help=f"simulated GPUs when the backend is fake (default: {FAKE_GPUS}, as krex arbiter's)",
    )
    parser.add_argument("--no-pool", action="store_true", help="do not start the pool service")
    parser.add_argument(
        "jupyterlab_args",
        nargs=argparse.REMAINDER,
        metavar="JUPYTERLAB OPTIONS",
        help="options of JupyterLab (jupyter lab --help-all), passed on unchanged",
    )


def launch(args: argparse.Namespace) -> int:
    """Replace this process with JupyterLab (``args`` from :func:`add_arguments`)."""
    rest: list[str] = list(args.jupyterlab_args)
    # Nothing is said here of the arbiter: the server says which it uses, once, when it has found
    # it (the node's, this user's, or an embedded one; with the FAKE backend loudly).
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--KrexExtensionApp.backend={args.backend}",
        f"--KrexExtensionApp.fake_gpus={args.fake_gpus}",
        "--KrexExtensionApp.stop_on_interrupt=True",  # one Ctrl-C stops it cleanly
        # A new notebook runs on KREX (JupyterLab takes the kernelspecs' default), unless the
        # user names another (traitlets refuses the option twice)
        *([] if any("default_kernel_name" in a for a in rest) else ["--MappingKernelManager.default_kernel_name=krex"]),
        *(["--KrexExtensionApp.start_pool=False"] if args.no_pool else []),
        *rest,
    ]
    if os.geteuid() == 0 and "--allow-root" not in rest:
        print("krex lab: running as root (a container?): passing --allow-root to JupyterLab", file=sys.stderr)
        cmd.append("--allow-root")
    os.execve(sys.executable, cmd, jupyter_env())
    return 0  # not reached
