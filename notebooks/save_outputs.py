"""Run a notebook for real and save a copy with its outputs: ``python notebooks/save_outputs.py NOTEBOOK``.

The run is nbclient's, on the ``krex`` kernel of this checkout and a fresh ``krex arbiter --backend
fake`` with 2 simulated GPUs in a scratch runtime dir; the copy goes to ``test-artifacts/`` (the
repository keeps its notebooks without outputs: ``notebooks/strip_outputs.py``).
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


def save_outputs(path: Path, out: Path, gpus: int = 2, timeout: float = 120) -> None:
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
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--fake-gpus", type=int, default=2)
    args = parser.parse_args()
    for path in args.notebooks:
        out = Path(__file__).resolve().parents[1] / "test-artifacts" / path.name
        save_outputs(path, out, gpus=args.fake_gpus)
        print(f"saved a real run of {path} into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
