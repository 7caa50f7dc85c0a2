"""``krex history`` with no arbiter answering reads the history database itself: all of it for the
file's owner and root, only the caller's own regions for another user who may read the file, and
a clear refusal for one who may not. Its WAIT column says that it is the queue wait."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import krex_lab.client  # noqa: F401 - loaded before a forked child drops root (see _as_nobody)
from krex_lab.arbiter import history_cli
from krex_lab.arbiter.history import RegionHistory
from krex_lab.pytest_plugin import subprocess_pythonpath
from krex_lab.region_report import RegionReport
from tests.security.users import User, as_user

NOBODY = 65534


def _report(user: str, uid: int, gpu: int, released: float) -> RegionReport:
    return RegionReport(
        region=f"r{gpu}-{released}",
        uid=uid,
        user=user,
        holder_pid=4242,
        gpu=gpu,
        wait_s=0.0002,
        acquire_s=0.001,
        hold_s=2.0,
        released_at=released,
        released_by="released by holder",
        frozen=[11],
    )


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A runtime dir with a history database of three regions (two of root, one of nobody) and no
    arbiter; readable by others (0755), as a node arbiter's /run/krex is."""
    path = Path(tempfile.mkdtemp(prefix="krex-history-offline-"))
    path.chmod(0o755)
    db = RegionHistory(path / "history.sqlite").open()
    now = time.time()
    for report in (_report("root", 0, 0, now - 30), _report("nobody", NOBODY, 1, now - 20), _report("root", 0, 1, now)):
        db.add(report)
    assert db.flush()
    db.close()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cli(runtime: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(KREX_RUNTIME_DIR=str(runtime), PYTHONPATH=subprocess_pythonpath())
    return subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "history", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_history_reads_the_database_when_no_arbiter_answers(runtime: Path) -> None:
    proc = _cli(runtime, "--json")
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "no KREX arbiter answers" in line and f"read its history database {runtime / 'history.sqlite'}" in line
    rows = json.loads(proc.stdout)
    assert [(r["user"], r["gpu"]) for r in rows] == [("root", 0), ("nobody", 1), ("root", 1)], "root sees all"
    assert rows[1]["holder_pid"] == 4242 and rows[1]["frozen"] == [11]
    table = _cli(runtime, "--user", "root", "--since", "1h").stdout.splitlines()
    assert table[0].split() == ["TIME", "USER", "GPU", "QUEUE-WAIT", "HOLD", "DEGRADED", "ENDED"]
    assert len(table) == 3 and all(" root " in x for x in table[1:])
    usage = json.loads(_cli(runtime, "--usage", "--json", "--since", "1d").stdout)
    assert {u["user"]: u["regions"] for u in usage["users"]} == {"root": 2, "nobody": 1}
    assert "GPU-hours held from" in _cli(runtime, "--usage").stdout
    # a reader leaves the directory as it found it: no -wal or -shm beside a file no one writes
    assert sorted(p.name for p in runtime.iterdir()) == ["history.sqlite"]


def test_without_arbiter_or_database_it_says_both(runtime: Path) -> None:
    (runtime / "history.sqlite").unlink()
    proc = _cli(runtime, "--db", str(runtime / "history.sqlite"))
    assert proc.returncode == 1
    assert "no KREX arbiter answers" in proc.stderr and "there is no history database" in proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    # Whoever asked for JSON parses stdout: the failure is JSON there too, as `krex status --json`'s.
    for args in (["--json"], ["--usage", "--json"]):
        proc = _cli(runtime, "--db", str(runtime / "history.sqlite"), *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        failure = json.loads(proc.stdout)
        assert "there is no history database" in failure["error"] and failure["type"] == "KrexError", failure


def _as_nobody(runtime: Path, *args: str) -> tuple[int, str, str]:
    """``krex history ARGS`` in a forked child that became uid 65534 (nobody): code, stdout, stderr."""

    def history() -> int:
        for key in [k for k in os.environ if k.startswith("KREX_")]:
            del os.environ[key]
        os.environ["KREX_RUNTIME_DIR"] = str(runtime)
        history_cli.main(list(args))
        return 0

    return as_user(User("nobody", NOBODY, NOBODY), history)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_user_reads_only_their_own_regions_and_only_when_the_file_lets_them(runtime: Path) -> None:
    db = runtime / "history.sqlite"
    assert db.stat().st_mode & 0o777 == 0o600
    before = set(Path("/tmp").glob(f"krex-{NOBODY}-*"))
    code, out, err = _as_nobody(runtime, "--json")
    # a reader makes no runtime dir of its own to look for a lab in (nobody has no XDG_RUNTIME_DIR)
    assert set(Path("/tmp").glob(f"krex-{NOBODY}-*")) == before
    refusal = f"its history database {db} (uid 0's, mode 0600) is not readable by you (uid {NOBODY})"
    assert code == 1 and refusal in json.loads(out)["error"] and refusal not in err  # said once, as JSON
    db.chmod(0o644)  # an administrator let everyone read it
    code, out, err = _as_nobody(runtime, "--json")
    assert code == 0, err
    assert [(r["user"], r["uid"]) for r in json.loads(out)] == [("nobody", NOBODY)], "only the caller's own rows"
    (line,) = err.splitlines()
    assert "read its history database" in line and f"showing only your own regions (uid {NOBODY}" in line
    code, out, err = _as_nobody(runtime, "--json", "--user", "root")
    assert code == 0 and json.loads(out) == [], "no other user's rows, whatever --user asks"
