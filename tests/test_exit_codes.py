"""One rule for every ``krex`` subcommand's exit code (docs/troubleshooting.md): 2 when the call
itself is wrong and nothing was done, 1 when the work was tried and failed; ``exclusive`` and
``run`` otherwise exit as their command does. Real ``python -m krex_lab.cli`` processes."""

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
from .evaluate.helpers import problem

pool = test_kernels.pool  # fixture

KREX = [sys.executable, "-m", "krex_lab.cli"]


def krex(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KREX, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


#: one bad call of each subcommand that needs no server: (arguments, what its one line says)
BAD_CALLS = [
    (("arbiter", "--fake-gpus", "0"), "argument --fake-gpus"),
    (("supervise",), "no arbiter command given"),
    (("pool", "--workers-per-gpu", "x"), "invalid int value"),
    (("status", "--bogus"), "unrecognized arguments"),
    (("history", "--by", "job"), "--by groups --usage: give --usage too"),
    (("exclusive",), "give a command after --"),
    (("run", "no-such-script.py"), "can't open file"),
    (("eval", "no-such-reference.py", "no-such-candidate.py"), "exists"),
    (("eval", str(problem("kb_softmax"))), "REFERENCE and CANDIDATE are required"),
    (("mcp", "--bogus"), "unrecognized arguments"),
    (("lab", "--backend", "cuda"), "invalid choice"),
    (("hub-config", "--bogus"), "unrecognized arguments"),
    (("slurm", "teardown"), "invalid choice"),
]


@pytest.mark.parametrize(("args", "says"), BAD_CALLS, ids=[a[0] for a, _ in BAD_CALLS])
def test_a_bad_call_exits_2(args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    env = {**os.environ, "KREX_RUNTIME_DIR": str(tmp_path), "KREX_ENDPOINT": f"ipc://{tmp_path}/none.sock"}
    out = krex(*args, env=env)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_config_file_that_exists_is_a_bad_call(tmp_path: Path) -> None:
    target = tmp_path / "jupyterhub_config.py"
    target.write_text("kept\n")
    out = krex("hub-config", "--allow-group", "students", "-o", str(target))
    assert out.returncode == 2 and "--force" in out.stderr and target.read_text() == "kept\n", out.stderr


@pytest.mark.parametrize(
    ("format", "candidate", "says"),
    [("gpumode", "correct.py", "are a kernelbench pair"), ("auto", "../../../conftest.py", "cannot tell the format")],
)
def test_eval_a_format_that_does_not_fit_is_a_bad_call_and_json_says_it(format: str, candidate: str, says: str) -> None:
    """Said before any worker is asked (no pool runs here), on stderr and, with --json, on stdout."""
    pair = [str(problem("kb_softmax")), str(problem("kb_softmax", candidate)), "--format", format]
    if format == "auto":
        pair[0] = str(ROOT / "tests" / "conftest.py")
    out = krex("eval", *pair)
    assert out.returncode == 2 and says in out.stderr and out.stdout == "", out.stderr
    out = krex("eval", *pair, "--json")
    assert out.returncode == 2 and says in json.loads(out.stdout)["error"], out.stdout + out.stderr


def test_eval_json_on_a_missing_file_is_json() -> None:
    out = krex("eval", "no-such-reference.py", str(problem("kb_softmax", "correct.py")), "--json")
    data = json.loads(out.stdout)
    assert out.returncode == 2 and "no-such-reference.py" in data["error"] and data["type"] == "FileNotFoundError"
    assert out.stderr == "" and data["command"] == "krex eval", out.stderr


def test_a_gpu_the_node_does_not_have_is_a_bad_call(arbiter: ArbiterProc, pool: str, tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    env = {**arbiter.env(), "KREX_POOL_ENDPOINT": pool}
    for args in (("exclusive", "--gpu", "9", "--", "true"), ("run", "--gpu", "9", str(script))):
        out = krex(*args, env=env)
        assert out.returncode == 2 and "GPU 9" in out.stderr and "ran" not in out.stdout, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_work_that_fails_exits_1(tmp_path: Path) -> None:
    env = {**os.environ, "KREX_RUNTIME_DIR": str(tmp_path), "KREX_ENDPOINT": f"ipc://{tmp_path}/none.sock"}
    out = krex("status", env=env)
    assert out.returncode == 1 and "no KREX arbiter answers" in out.stderr, out.stderr
    out = krex("exclusive", "--", "true", env=env)
    assert out.returncode == 1 and "no KREX arbiter answers" in out.stderr, out.stderr
