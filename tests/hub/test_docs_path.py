"""docs/jupyterhub.md's setup is the path the hub test takes: the same commands (the venv's
``krex hub-config`` with an allow rule, the venv's ``jupyterhub -f`` by absolute path in the
config's directory), the shipped systemd unit runs that same command, and the example config is
what the documented command generates today."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.hubsupport.hub import PLAIN_PATH, Hub
from tests.support import ROOT

DOC = ROOT / "docs" / "jupyterhub.md"
CONFIG = "/etc/jupyterhub/jupyterhub_config.py"


def _install_block() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## Install") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "docs/jupyterhub.md: no install block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_docs_start_the_hub_as_the_test_does() -> None:
    lines = _install_block()
    assert f"/opt/krex/bin/jupyterhub -f {CONFIG}" in lines
    assert "mkdir -p /etc/jupyterhub && cd /etc/jupyterhub" in lines, "the hub's working directory"
    generate = shlex.split(next(line for line in lines if "krex hub-config" in line))
    assert generate[0] == "/opt/krex/bin/krex", "the venv's krex, by absolute path"
    assert "--allow-group" in generate and generate[generate.index("-o") + 1] == CONFIG
    # the test's hub: the same program and file, only ports and timeouts added on the command line
    hub = Hub(Path("/etc/jupyterhub"), Path("/opt/krex"), Path(CONFIG))
    command = hub.command()
    assert command[:3] == ["/opt/krex/bin/jupyterhub", "-f", CONFIG]
    assert all(re.fullmatch(r"--(JupyterHub|ConfigurableHTTPProxy|Spawner)\.\w+=\S+", a) for a in command[3:])
    assert not any("authenticator" in a.lower() or "spawner_class" in a for a in command), command
    assert "/opt/krex" not in PLAIN_PATH


def test_the_systemd_unit_runs_the_documented_command() -> None:
    unit = (ROOT / "extension" / "systemd" / "jupyterhub.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["ExecStart"] == f"/opt/krex/bin/jupyterhub -f {CONFIG}"
    assert settings["WorkingDirectory"] == "/etc/jupyterhub"
    assert settings["Environment"] == f"PATH={PLAIN_PATH}", "the venv need not be on PATH"
    assert "ExecReload=/bin/kill -HUP $MAINPID" in (ROOT / "extension" / "systemd" / "krex-arbiter.service").read_text()


def test_the_example_config_is_what_the_command_generates(tmp_path: Path) -> None:
    example = ROOT / "extension" / "jupyterhub"
    argv = shlex.split(re.search(r"^    (krex hub-config .*)$", (example / "README.md").read_text(), re.M).group(1))  # type: ignore[union-attr]
    out = tmp_path / "jupyterhub_config.py"
    r = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", *argv[1:], "-o", str(out)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (example / "jupyterhub_config.py").read_text(), "regenerate the example"


def test_the_docs_say_what_a_region_stops() -> None:
    """Only the sessions on the region's GPU, the holder's own other kernels there included (shown
    by tests/arbiter/test_multi_gpu_fake.py, whose siblings are the holder's user's own)."""
    text = " ".join(DOC.read_text().split())
    assert "A region freezes the KREX sessions **on its GPU** only" in text
    assert "the holder's own other kernels on that GPU included" in text
    assert "Sessions on the node's other GPUs keep running" in text
