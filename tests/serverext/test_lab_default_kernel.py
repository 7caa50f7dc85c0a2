"""``krex lab``'s default kernel is the KREX kernel: a new notebook (JupyterLab takes the
kernelspecs' ``default``) runs on KREX without the user picking it; one the user names stays."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .test_lab_and_cli_agree import _env, lab, lab_url  # noqa: F401  (lab: the fixture)

pytestmark = pytest.mark.timeout(180)


def _kernelspecs(log: Path) -> dict[str, Any]:
    url = lab_url(log)
    assert url, log.read_text()
    try:
        with urllib.request.urlopen(f"{url}/api/kernelspecs", timeout=30) as r:
            specs: dict[str, Any] = json.load(r)
    except OSError as exc:
        raise AssertionError(f"{url}: {exc}\n{log.read_text()}") from None
    return specs


def test_the_labs_default_kernel_is_krexs(lab: Any, tmp_path: Path) -> None:  # noqa: F811
    own = tmp_path / "own-rt"
    own.mkdir(mode=0o700)
    _proc, log = lab(_env(tmp_path, own, ""))
    specs = _kernelspecs(log)
    assert specs["default"] == "krex", specs["default"]
    assert "krex" in specs["kernelspecs"] and "python3" in specs["kernelspecs"]


def test_a_default_the_user_names_stays(lab: Any, tmp_path: Path) -> None:  # noqa: F811
    own = tmp_path / "own-rt"
    own.mkdir(mode=0o700)
    env = _env(tmp_path, own, "")
    _proc, log = lab(env, "--MappingKernelManager.default_kernel_name=python3")
    assert _kernelspecs(log)["default"] == "python3"
