"""Which start-up code makes the judge refuse: a ``sitecustomize`` a user's process could have
planted, never the distribution's own (Debian's Python ships one in its standard library, and a
judge that refused it refused every evaluation of a non-root user there)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate.judge.startup import root_only

PROBE = "from krex_lab.evaluate.judge.startup import planted_startup_code as p; print(p())"


def test_a_sitecustomize_planted_on_the_import_path_is_named(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("RAN = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"sitecustomize ({tmp_path / 'sitecustomize.py'})"


def test_an_interpreter_without_one_runs_the_judge() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-S", "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A directory only root can write, on a path only root can write (not under /tmp)."""
    if os.geteuid() != 0:
        pytest.skip("root-owned files need root to make")
    d = Path(tempfile.mkdtemp(dir="/run", prefix="krex-trust-"))
    try:
        d.chmod(0o755)
        yield d
    finally:
        for p in sorted(d.rglob("*"), reverse=True):
            p.unlink() if p.is_symlink() or p.is_file() else p.rmdir()
        d.rmdir()


def test_root_only_follows_every_link_and_directory(root_dir: Path, tmp_path: Path) -> None:
    real = root_dir / "real.py"
    real.write_text("")
    real.chmod(0o644)
    assert root_only(str(real))

    linked = root_dir / "sitecustomize.py"
    linked.symlink_to(real)
    assert root_only(str(linked)), "a link to a root-only file, from a root-only directory"

    real.chmod(0o664)
    assert not root_only(str(linked)) and not root_only(str(real)), "a group-writable target"
    real.chmod(0o644)

    out_there = tmp_path / "planted.py"  # under /tmp: anyone may add files beside it
    out_there.write_text("")
    out_there.chmod(0o644)
    away = root_dir / "away.py"
    away.symlink_to(out_there)
    assert not root_only(str(away)), "a link into a world-writable directory"

    os.chown(real, 65534, -1)
    assert not root_only(str(linked)), "a target another user owns"

    loop = root_dir / "loop.py"
    loop.symlink_to(loop)
    assert not root_only(str(loop))
    assert not root_only(str(root_dir / "missing.py"))


def test_the_distributions_own_sitecustomize_is_trusted() -> None:
    """Debian's /usr/bin/python3 runs /usr/lib/python3.X/sitecustomize.py (a link into /etc)."""
    system = "/usr/bin/python3"
    where = subprocess.run(
        [system, "-c", "import sys; m = sys.modules.get('sitecustomize'); print(getattr(m, '__file__', None) or '')"],
        capture_output=True,
        text=True,
    )
    if where.returncode != 0 or not where.stdout.strip():
        pytest.skip(f"{system} runs no sitecustomize of its own here")
    # that interpreter has none of the package's dependencies: the module is loaded by its file
    here = Path(__file__).resolve().parents[2] / "krex_lab" / "evaluate" / "judge" / "startup.py"
    probe = (
        "import importlib.util as u\n"
        f"s = u.spec_from_file_location('startup', {str(here)!r}); m = u.module_from_spec(s); s.loader.exec_module(m)\n"
        "print(m.planted_startup_code())\n"
    )
    out = subprocess.run([system, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None", (where.stdout, out.stdout)
