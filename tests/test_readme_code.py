"""The README's first code example ("In code") runs as written, in a fresh Python process of the
user's, where an arbiter answers and a pool serves: a region, its report, a job on a warm worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT
from tests.support.pool import PoolProc


def _first_code_block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index(marker) :]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match is not None, f"no python block after {marker!r}"
    return match.group(1)


def test_the_readmes_code_example_runs_as_written(tmp_path: Path) -> None:
    code = _first_code_block_after("In code")
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=2).start()
    pool = PoolProc(arb.env(), f"ipc://{runtime / 'pool.sock'}", "--no-preload", "--spares=0", log=runtime / "pool.log")
    try:
        pool.start(timeout=90)
        r = subprocess.run([sys.executable, "-c", code], env=pool.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = r.stdout.splitlines()
        assert lines[-1] == "1024", r.stdout
        assert "region" in lines[0].lower() and "gpu 0" in lines[0].lower(), r.stdout
    finally:
        pool.stop()
        arb.stop()
