"""``krex hub-config``: the output is a config that traitlets loads (as JupyterHub and
``krex arbiter --config`` do), with KREX wired in; the arbiter and the admin page read its quotas."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

from krex_lab.hub import config as hubconfig


def generate(tmp_path: Path, *args: str) -> Path:
    parser = argparse.ArgumentParser()
    hubconfig.add_arguments(parser)
    out = tmp_path / "jupyterhub_config.py"
    assert hubconfig.run(parser.parse_args(["-o", str(out), *args])) == 0
    return out


def test_loads_with_krex_wired_in(tmp_path: Path) -> None:
    out = generate(tmp_path, "--admin", "alice", "--queued-per-user", "3", "--max-hold", "120")
    c = PyFileConfigLoader(out.name, path=str(tmp_path)).load_config()
    assert c.Quotas.queued_per_user == 3 and c.Quotas.max_hold == 120.0 and c.Quotas.admin_group == "krex-admin"
    assert c.Arbiter.privacy == "private"
    assert c.Spawner.environment["KREX_ENDPOINT"] == "ipc:///run/krex/arbiter.sock"
    assert "--KrexExtensionApp.embedded=False" in c.Spawner.args
    services = {s["name"]: s for s in c.JupyterHub.services}
    arbiter = services["krex-arbiter"]["command"]
    assert arbiter[arbiter.index("--") + 1 :][:4] == [sys.executable, "-m", "krex_lab.cli", "arbiter"]
    assert "--multi-user" in arbiter and arbiter[arbiter.index("--config") + 1] == str(out)
    admin = services["krex-admin"]
    assert admin["command"][:3] == [sys.executable, "-m", "krex_lab.hub.service"]
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
    assert hubconfig.run(parser.parse_args(["-o", str(out)])) == 1
    assert hubconfig.run(parser.parse_args(["-o", str(out), "--force"])) == 0


def test_arbiter_and_admin_page_read_the_quotas(tmp_path: Path) -> None:
    out = generate(tmp_path, "--sessions-per-user", "7")
    from krex_lab.arbiter.app import ArbiterApp
    from krex_lab.arbiter.quotas import Quotas
    from krex_lab.hub.service import load_quotas

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
