"""Install a CPU build of torch into this Python's environment when it has no torch at all.

The evaluator's tests need torch; any build will do. A torch already installed (a CUDA or ROCm
build the user chose) is left alone. Otherwise a CPU build: a ``torch-*+cpu`` wheel for this
interpreter in a directory pip is configured to find links in (a machine's local wheel cache,
so that it works offline), else PyTorch's CPU index (``KREX_TORCH_INDEX``). The package's own
requirement on torch is unpinned, so ``pip install -e '.[test]'`` afterwards keeps whichever is
there. Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

INDEX = os.environ.get("KREX_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
WHEEL = re.compile(r"^torch-(?P<version>[0-9][^-]*)\+cpu-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], text=True, capture_output=True)


def find_links() -> list[Path]:
    """The local directories pip is told to find links in (its configuration, PIP_FIND_LINKS)."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    listed = _pip("config", "list").stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            values += value.strip().strip("'\"").split()
    dirs = []
    for value in values:
        path = Path(value.removeprefix("file://"))
        if path.is_dir() and path not in dirs:
            dirs.append(path)
    return dirs


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def local_cpu_wheel(dirs: list[Path]) -> Path | None:
    """The newest ``torch-*+cpu`` wheel for this interpreter and machine in ``dirs``."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = platform.machine()
    best: tuple[tuple[int, ...], Path] | None = None
    for d in dirs:
        for wheel in d.glob("torch-*+cpu-*.whl"):
            m = WHEEL.match(wheel.name)
            if m is None or m["py"] != py or machine not in m["plat"] or sys.platform not in m["plat"]:
                continue
            key = _release(m["version"])
            if best is None or key > best[0]:
                best = (key, wheel)
    return best[1] if best else None


def main() -> int:
    if importlib.util.find_spec("torch") is not None:
        print(f"torch {importlib.metadata.version('torch')} is installed: kept")
        return 0
    wheel = local_cpu_wheel(find_links())
    args = [str(wheel)] if wheel is not None else ["torch", "--index-url", INDEX]
    print(f"no torch here: installing a CPU build ({' '.join(args)})")
    return subprocess.call([sys.executable, "-m", "pip", "install", "-q", *args])


if __name__ == "__main__":
    sys.exit(main())
