"""``krex hub-config``: the output is a config that traitlets loads (as JupyterHub and
``krex arbiter --config`` do), with KREX wired in; the arbiter and the admin page read its quotas."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from traitlets.config.loader import PyFileConfigLoader

from krex_lab.hub import config as hubconfig


def generate(tmp_path: Path, *args: str) -> Path:
    """``krex hub-config -o …`` (``--allow-group students`` unless ``args`` choose an allow rule)."""
    parser = argparse.ArgumentParser()
    hubconfig.add_arguments(parser)
    out = tmp_path / "jupyterhub_config.py"
    if not any(a.startswith("--allow") for a in args):
        args = ("--allow-group", "students", *args)
    assert hubconfig.run(parser.parse_args(["-o", str(out), *args])) == 0
    return out


def load(out: Path) -> Any:
    return PyFileConfigLoader(out.name, path=str(out.parent)).load_config()


def test_loads_with_krex_wired_in(tmp_path: Path) -> None:
    out = generate(tmp_path, "--admin", "alice", "--queued-per-user", "3", "--max-hold", "120")
    c = PyFileConfigLoader(out.name, path=str(tmp_path)).load_config()
    assert c.Quotas.queued_per_user == 3 and c.Quotas.max_hold == 120.0 and c.Quotas.admin_group == "krex-admin"
    assert c.Arbiter.privacy == "private" and c.Arbiter.shield == "affinity"
    assert c.Spawner.environment["KREX_ENDPOINT"] == "ipc:///run/krex/arbiter.sock"
    assert "--KrexExtensionApp.embedded=False" in c.Spawner.args
    services = {s["name"]: s for s in c.JupyterHub.services}
    arbiter = services["krex-arbiter"]["command"]
    assert arbiter[arbiter.index("--") + 1 :][:4] == [sys.executable, "-m", "krex_lab.cli", "arbiter"]
    assert "--multi-user" in arbiter and arbiter[arbiter.index("--config") + 1] == str(out)
    admin = services["krex-admin"]
    assert admin["command"][:3] == [sys.executable, "-m", "krex_lab.hub.admin_page"]
    assert admin["oauth_client_allowed_scopes"] == ["custom:krex:admin"]
    assert "custom:krex:admin" in c.JupyterHub.custom_scopes
    role = c.JupyterHub.load_roles[0]
    assert role["users"] == ["alice"] and "access:services!service=krex-admin" in role["scopes"]
    assert c.Authenticator.admin_users == {"alice"}


def test_no_arbiter_service(tmp_path: Path) -> None:
    c = PyFileConfigLoader("jupyterhub_config.py", path=str(generate(tmp_path, "--no-arbiter-service").parent))
    assert [s["name"] for s in c.load_config().JupyterHub.services] == ["krex-admin"]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    out = generate(tmp_path)
    parser = argparse.ArgumentParser()
    hubconfig.add_arguments(parser)
    assert hubconfig.run(parser.parse_args(["-o", str(out), "--allow-all-users"])) == 2
    assert hubconfig.run(parser.parse_args(["-o", str(out), "--allow-all-users", "--force"])) == 0


def test_an_allow_rule_is_required(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JupyterHub 5 admits only admins without an allow rule: a config without one let no student
    in ("Invalid username or password"). Generation refuses it, saying what to choose."""
    parser = argparse.ArgumentParser()
    hubconfig.add_arguments(parser)
    out = tmp_path / "jupyterhub_config.py"
    assert hubconfig.run(parser.parse_args(["-o", str(out), "--admin", "alice"])) == 2
    err = capsys.readouterr().err
    assert "--allow-group" in err and "--allow-user" in err and "--allow-all-users" in err, err
    assert not out.exists(), "nothing written"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--allow-group", "students", "--allow-group", "staff"),
            {"LocalAuthenticator.allowed_groups": {"students", "staff"}},
        ),
        (("--allow-user", "carol"), {"Authenticator.allowed_users": {"carol", "alice"}}),
        (("--allow-all-users",), {"Authenticator.allow_all": True}),
    ],
)
def test_the_allow_rule_chosen(tmp_path: Path, args: tuple[str, ...], expected: dict[str, Any]) -> None:
    c = load(generate(tmp_path, "--admin", "alice", *args))
    for key, value in expected.items():
        section, name = key.split(".")
        assert c[section][name] == value
    assert "alice" in c.Authenticator.allowed_users, "an admin needs an allow rule too (JupyterHub 5)"
    if "Authenticator.allow_all" not in expected:
        assert "allow_all" not in c.Authenticator, "only the rule chosen"


def test_servers_run_the_venvs_singleuser_with_the_venv_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs start the hub by absolute path, with the venv not on PATH: the servers' command
    and PATH must come from the file (jupyterhub-singleuser was not found, krex not in terminals)."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    c = load(generate(tmp_path, "--python", "/opt/krex/bin/python"))
    assert c.Spawner.cmd == ["/opt/krex/bin/jupyterhub-singleuser"]
    assert c.Spawner.environment["PATH"] == "/opt/krex/bin:/usr/bin:/bin"


def test_the_krex_kernel_is_the_default_and_the_only_one(tmp_path: Path) -> None:
    args = load(generate(tmp_path)).Spawner.args
    assert "--MappingKernelManager.default_kernel_name=krex" in args
    assert [a for a in args if a.startswith("--KernelSpecManager.allowed_kernelspecs=")] == [
        "--KernelSpecManager.allowed_kernelspecs=krex"
    ]
    plain = load(generate(tmp_path, "--plain-kernel", "--force")).Spawner.args
    assert "--MappingKernelManager.default_kernel_name=krex" in plain
    assert "--KernelSpecManager.allowed_kernelspecs=python3" in plain


def test_fake_gpus_reach_the_arbiter_service(tmp_path: Path) -> None:
    c = load(generate(tmp_path, "--backend", "fake", "--fake-gpus", "1"))
    command = {s["name"]: s for s in c.JupyterHub.services}["krex-arbiter"]["command"]
    assert command[command.index("--fake-gpus") + 1] == "1" and command[command.index("--backend") + 1] == "fake"


def test_arbiter_and_admin_page_read_the_quotas(tmp_path: Path) -> None:
    out = generate(tmp_path, "--sessions-per-user", "7")
    from krex_lab.arbiter.app import ArbiterApp
    from krex_lab.arbiter.quotas import Quotas
    from krex_lab.hub.admin_page import load_quotas

    app = ArbiterApp()
    app.initialize(["--config", str(out)])
    assert Quotas(parent=app).sessions_per_user == 7
    quotas = load_quotas(str(out))
    assert quotas is not None and quotas.sessions_per_user == 7


@pytest.mark.skipif(not Path(sys.executable).with_name("jupyterhub").exists(), reason="jupyterhub not installed")
def test_jupyterhub_accepts_it(tmp_path: Path) -> None:
    """JupyterHub itself loads it (``--help-all`` after loading the file fails on a broken config)."""
    out = generate(tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from jupyterhub.app import JupyterHub; a = JupyterHub(); "
            f"a.load_config_file({str(out)!r}); print(len(a.services), a.custom_scopes and 'ok')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and r.stdout.split() == ["2", "ok"], r.stderr


def test_an_unknown_group_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate(tmp_path, "--allow-group", "no-such-group-krex")
    assert "no Unix group 'no-such-group-krex' on this machine" in capsys.readouterr().err


def test_a_python_students_cannot_run_is_warned_about(tmp_path: Path) -> None:
    """A venv made with root's pyenv Python links into /root (0700): every spawn then fails."""
    private = tmp_path / "private"
    (private / "bin").mkdir(parents=True)
    real = private / "bin" / "python3"
    real.symlink_to(sys.executable)
    private.chmod(0o700)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python3").symlink_to(real)
    common = ["--allow-group", "students", "-o", str(tmp_path / "c.py"), "--force"]
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "hub-config", "--python", str(venv / "python3"), *common],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "other users cannot enter or run" in out.stderr, out.stderr
    fine = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "hub-config", "--python", "/usr/bin/python3", *common],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fine.returncode == 0 and "cannot enter or run" not in fine.stderr, fine.stderr
