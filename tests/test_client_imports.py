"""The client commands start light: ``krex run``, ``krex exclusive`` and ``krex status`` import no
GPU backend, no framework and no evaluator (each import is start-up time of every command an
agent runs), and what ``krex run`` no longer filters itself the worker does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT

from . import test_kernels

pool = test_kernels.pool  # fixture

#: what a client command must not import (module name prefixes)
HEAVY = ("krex_lab.gpu", "krex_lab.evaluate", "krex_lab.bench", "torch", "numpy", "numba", "importlib.metadata")

#: where the probe writes (an environment variable, not an argument: run by hand without it, the
#: probe once took the command's first word for its output and left ``run`` and ``status`` files)
OUT_VAR = "KREX_IMPORT_PROBE_OUT"

#: what ``krex run`` (the warm path: a script handed to a worker) must not import besides: argparse's
#: terminal sizing (shutil, and bz2 and lzma with it) and dataclasses (inspect, ast, dis)
NOT_ON_THE_WARM_PATH = ("shutil", "bz2", "lzma", "dataclasses")

#: runs ``krex ARGS`` in this interpreter and writes, at exit, the modules it imported
PROBE = (
    "import atexit, json, os, sys\n"
    f"out = os.environ.get({OUT_VAR!r})\n"
    "if not out or not os.path.isabs(out):\n"
    f"    sys.exit('give the output file, an absolute temporary path, in ${OUT_VAR}')\n"
    "def dump():\n"
    "    with open(out, 'w') as f:\n"
    "        json.dump(sorted(sys.modules), f)\n"
    "atexit.register(dump)\n"
    "from krex_lab.cli import main\n"
    "main(sys.argv[1:])\n"
)


Ran = subprocess.CompletedProcess[str]


def imported(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[Ran, list[str]]:
    out = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**env, OUT_VAR: str(out)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = json.loads(out.read_text())
    light = NOT_ON_THE_WARM_PATH if args[:1] == ["run"] else ()
    return proc, [m for m in modules if m.startswith(HEAVY) or m in light]


def test_the_probe_run_by_hand_writes_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != OUT_VAR}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "status", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode != 0 and OUT_VAR in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_status_and_exclusive_import_no_backend(arbiter: ArbiterProc, tmp_path: Path) -> None:
    proc, heavy = imported(["status", "--json"], arbiter.env(), tmp_path)
    assert proc.returncode == 0 and heavy == [], (heavy, proc.stderr)
    proc, heavy = imported(["exclusive", "--quiet", "--", "true"], arbiter.env(), tmp_path)
    assert proc.returncode == 0 and heavy == [], (heavy, proc.stderr)


@pytest.mark.timeout(120)
def test_run_imports_no_backend_and_the_callers_placement_stays_behind(
    pool: str, arbiter: ArbiterProc, tmp_path: Path
) -> None:
    script = tmp_path / "where.py"
    script.write_text("import os\nprint(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('KREX_GPU'))\n")
    env = {**arbiter.env(), "KREX_POOL_ENDPOINT": pool, "CUDA_VISIBLE_DEVICES": "7", "KREX_GPU": "9"}
    proc, heavy = imported(["run", "--gpu", "1", str(script)], env, tmp_path)
    assert proc.returncode == 0 and heavy == [], (heavy, proc.stderr)
    # The fake backend places nothing: the caller's CUDA_VISIBLE_DEVICES does not reach the script,
    # and KREX_GPU is the worker's own.
    assert proc.stdout.split() == ["None", "1"], proc.stdout + proc.stderr
