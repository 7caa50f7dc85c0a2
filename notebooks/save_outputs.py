"""Run a notebook for real and save its outputs into it: ``python notebooks/save_outputs.py NOTEBOOK``.

The outputs kept in the repository are those of a real run (nbclient, the ``krex`` kernel of this
checkout, a fresh ``krex arbiter --backend fake`` with 2 simulated GPUs in a scratch runtime dir),
never hand-edited, so that what a reader sees is what a user gets; the fake backend says so in them.
``tests/dashboard/test_dashboard_notebook.py`` checks the saved outputs of ``03_dashboard.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from krex_lab.pytest_plugin import ArbiterProc
from krex_lab.serverext.lab import jupyter_env


def save_outputs(path: Path, gpus: int = 2, timeout: float = 120) -> None:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="krex-nb-") as scratch:  # short: ipc socket paths are limited
        runtime = Path(scratch) / "rt"
        runtime.mkdir(mode=0o700)
        arbiter = ArbiterProc(runtime, gpus=gpus).start()
        saved = dict(os.environ)
        try:
            os.environ.update(jupyter_env(arbiter.env()))
            for var in ("KREX_POOL_ENDPOINT", "KREX_GPU"):
                os.environ.pop(var, None)
            client = NotebookClient(nb, timeout=timeout, kernel_name="krex", resources={"metadata": {"path": scratch}})
            client.execute()
        finally:
            os.environ.clear()
            os.environ.update(saved)
            arbiter.stop()
    nbformat.write(nb, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--fake-gpus", type=int, default=2)
    args = parser.parse_args()
    for path in args.notebooks:
        save_outputs(path, gpus=args.fake_gpus)
        print(f"saved the outputs of a real run into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
