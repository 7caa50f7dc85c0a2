"""``krex``: one argparse tree. Each subcommand has its own usage, help and errors; ``arbiter``
and ``pool`` pass ``--Class.trait=value`` through to their traitlets application."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT


def krex(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_krex_alone_exits_2_with_the_top_usage() -> None:
    out = krex()
    assert out.returncode == 2
    usage = " ".join(out.stderr.split())
    assert usage.startswith(
        "usage: krex [-h] {arbiter,supervise,pool,status,history,exclusive,run,eval,mcp,lab,hub-config,slurm}"
    ), usage


@pytest.mark.parametrize(
    ("cmd", "option"),
    [
        ("arbiter", "--no-guardian"),
        ("pool", "--workers-per-gpu"),
        ("status", "--json"),
        ("exclusive", "--max-hold"),
        ("run", "--exclusive"),
        ("lab", "--no-pool"),
        ("supervise", "--undo-only"),
    ],
)
def test_each_subcommand_has_its_own_help(cmd: str, option: str) -> None:
    out = krex(cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: krex {cmd} "), out.stdout
    assert option in out.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--bogus"),
        ("arbiter", "--bogus"),
        ("arbiter", "--Arbiter.fake_gpus=2", "--bogus"),
        ("arbiter", "--fake-gpus", "two"),
        ("arbiter", "--backend", "cuda"),
        ("pool", "--bogus"),
        ("exclusive", "--bogus", "--", "true"),
        ("run", "--bogus", "script.py"),
        ("status", "extra"),
    ],
)
def test_a_bad_argument_prints_the_subcommand_usage_and_exits_2(args: tuple[str, ...]) -> None:
    out = krex(*args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"usage: krex {args[0]} "), out.stderr
    assert f"krex {args[0]}: error:" in out.stderr


def test_arbiter_help_all_lists_every_traitlets_option() -> None:
    out = krex("arbiter", "--help-all")
    assert out.returncode == 0, out.stderr
    assert "--Arbiter.telemetry_interval=" in out.stdout and "--Arbiter.max_hold_limit=" in out.stdout


def test_argparse_declares_exactly_the_applications_aliases_and_flags() -> None:
    """One source of truth: the app's aliases/flags are the subcommand's options, mapped back as given."""
    from krex_lab.arbiter.app import ArbiterApp
    from krex_lab.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(
        [
            "arbiter",
            "--backend=fake",
            "--fake-gpus",
            "3",
            "--no-guardian",
            "--Arbiter.telemetry_interval=0.5",
            "--max-hold",
            "7",
        ]
    )
    assert ArbiterApp.argv_from(args) == [
        "--Arbiter.backend_name=fake",
        "--Arbiter.fake_gpus=3",
        "--Arbiter.max_hold=7",
        "--no-guardian",
        "--Arbiter.telemetry_interval=0.5",
    ]
    arbiter_help = krex("arbiter", "--help").stdout
    for name in [*ArbiterApp.aliases, *ArbiterApp.flags]:
        assert f"--{name}" in arbiter_help


def test_pool_options_map_to_the_pool_application() -> None:
    from krex_lab.cli import build_parser
    from krex_lab.workers.pool import PoolApp

    args = build_parser().parse_args(
        ["pool", "--preload", "torch", "cupy", "--on-demand", "--workers-per-gpu=2", "--Pool.job_timeout=3"]
    )
    argv = PoolApp.argv_from(args)
    assert argv == [
        "--Pool.workers_per_gpu=2",
        "--Pool.preload=torch",
        "--Pool.preload=cupy",
        "--on-demand",
        "--Pool.job_timeout=3",
    ]
    app = PoolApp()
    app.parse_command_line(argv)
    assert app.config.Pool.preload == ["torch", "cupy"] and app.config.Pool.job_timeout == 3.0
    assert app.config.Pool.on_demand is True


def test_a_traitlets_option_reaches_the_arbiter(tmp_path: Path) -> None:
    """``--Arbiter.max_hold_limit=5`` (no alias) is in force: a 10 s lease is refused, a 2 s one granted."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(
        runtime, gpus=1, extra=("--no-guardian", f"--runtime-dir={runtime}", "--Arbiter.max_hold_limit=5")
    ).start()
    try:
        refused = krex("exclusive", "--quiet", "--max-hold", "10", "--", "true", env=arb.env())
        assert refused.returncode == 2 and "max_hold must be in (0, 5]" in refused.stderr, refused.stderr
        granted = krex("exclusive", "--quiet", "--max-hold", "2", "--", "true", env=arb.env())
        assert granted.returncode == 0, granted.stderr
        status = krex("status", "--json", env=arb.env())
        assert status.returncode == 0 and len(json.loads(status.stdout)["gpus"]) == 1, status.stderr
    finally:
        arb.stop()


def test_lab_passes_other_options_to_jupyterlab_unchanged() -> None:
    from krex_lab.cli import build_parser

    args = build_parser().parse_args(
        ["lab", "--ServerApp.token=", "--backend=fake", "--no-pool", "--port", "9999", "--no-browser"]
    )
    assert (args.backend, args.no_pool) == ("fake", True)
    assert args.jupyterlab_args == ["--ServerApp.token=", "--port", "9999", "--no-browser"]


def test_importing_the_cli_is_cheap() -> None:
    code = (
        "import sys, krex_lab.cli\n"
        "heavy = ('zmq', 'jupyter_server', 'jupyterlab', 'jupyter_core', 'tornado', 'traitlets')\n"
        "print([m for m in sys.modules if m.split('.')[0] in heavy or m.startswith('krex_lab.workers')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("exclusiv",), "did you mean exclusive?"),
        (("hisotry",), "did you mean history?"),
        (("status", "--josn"), "did you mean --json?"),
        (("run", "--exclusve", "s.py"), "did you mean --exclusive?"),
    ],
)
def test_a_typo_gets_the_nearest_command_or_option(args: tuple[str, ...], hint: str) -> None:
    out = krex(*args)
    assert out.returncode == 2 and out.stderr.rstrip().endswith(hint), out.stderr
    assert "did you mean" not in krex("zzzzzz").stderr  # nothing near: no guess


def test_status_json_without_an_arbiter_is_json(tmp_path: Path) -> None:
    env = {**os.environ, "KREX_ENDPOINT": f"ipc://{tmp_path}/nobody.sock"}
    out = krex("status", "--json", env=env)
    assert out.returncode == 1
    answer = json.loads(out.stdout)
    assert answer["type"] == "ArbiterUnavailable" and "no KREX arbiter answers" in answer["error"]
    assert out.stderr == "", "with --json, the answer is the JSON alone"
    prose = krex("status", env=env)
    assert prose.returncode == 1 and prose.stdout == "" and "no KREX arbiter answers" in prose.stderr
