"""Root never trusts a path a user controls (issue "Hostile neighbours", item 1).

Each test plays the attack for real: a real unprivileged user prepares the runtime dir a root
arbiter would use; the root-owned files it points at must come out untouched.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab import paths
from krex_lab.arbiter import supervisor
from krex_lab.arbiter.journal import Journal
from krex_lab.paths import UnsafePath, prepare_runtime_dir, runtime_dir
from krex_lab.procutil import proc_state, start_time

from .users import User, make_user, needs_root_and_useradd

pytestmark = pytest.mark.usefixtures("as_root")


@pytest.fixture
def as_root() -> None:
    needs_root_and_useradd()


@pytest.fixture
def root_files(tmp_path: Path) -> dict[str, Path]:
    """What bob would love to reach: a root file, a root directory (0700), in a root-only parent."""
    base = tmp_path / "root-only"
    base.mkdir(mode=0o700)
    secret = base / "secret"
    secret.write_text("root's data\n")
    secret.chmod(0o600)
    private = base / "private"
    private.mkdir(mode=0o700)
    return {"file": secret, "dir": private}


@pytest.fixture
def stopped_by_admin(stopped: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """A root process that an admin stopped on purpose: no journal may resume it."""
    return stopped


@pytest.fixture
def tmp_name() -> Iterator[Path]:
    """A fresh predictable-looking name right in /tmp (like /tmp/krex-0), removed afterwards."""
    path = Path(f"/tmp/krex-sec-{secrets.token_hex(4)}")
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _unchanged(root_files: dict[str, Path]) -> None:
    assert root_files["file"].read_text() == "root's data\n"
    assert root_files["file"].stat().st_mode & 0o7777 == 0o600
    assert root_files["dir"].stat().st_mode & 0o7777 == 0o700


def _plant(bob: User, rt: Path, root_files: dict[str, Path], journal: str | None = None) -> None:
    """As bob: make ``rt`` and plant symlinks (and maybe a crafted journal) in it."""
    code = (
        "import os, sys; rt, f, d, j = sys.argv[1:5]; os.mkdir(rt, 0o777); os.chmod(rt, 0o777)\n"
        "os.symlink(f, rt + '/arbiter.lock'); os.symlink(d, rt + '/proof')\n"
        "if j: open(rt + '/journal.jsonl', 'w').write(j)\n"
        "else: os.symlink(f, rt + '/journal.jsonl')\n"
    )
    bob.python(code, str(rt), str(root_files["file"]), str(root_files["dir"]), journal or "")
    assert rt.stat().st_uid == bob.uid


def _crafted_journal(victim: subprocess.Popen[bytes], root_files: dict[str, Path]) -> str:
    return "".join(
        json.dumps(e) + "\n"
        for e in [
            {"t": "stop", "region": "x", "procs": [[victim.pid, start_time(victim.pid)]]},
            {"t": "cgfreeze", "region": "x", "paths": [str(root_files["dir"])]},
            {"t": "affinity", "region": "x", "threads": [[victim.pid, start_time(victim.pid), [0]]]},
        ]
    )


def test_a_runtime_dir_bob_made_first_is_refused(
    bob: User, tmp_name: Path, root_files: dict[str, Path], stopped_by_admin: subprocess.Popen[bytes]
) -> None:
    """/tmp/krex-0 made first by bob, with links to root's files: refused, nothing followed."""
    _plant(bob, tmp_name, root_files)
    (root_files["dir"] / "cgroup.freeze").write_text("1")
    with pytest.raises(UnsafePath, match=f"belongs to uid {bob.uid}") as err:
        prepare_runtime_dir(tmp_name, multi_user=True)
    assert "remove it" in str(err.value) or "KREX_RUNTIME_DIR" in str(err.value)
    _unchanged(root_files)
    assert tmp_name.stat().st_mode & 0o777 == 0o777, "refused, not chmod'ed"


def test_a_crafted_journal_is_never_replayed_as_root(
    bob: User, tmp_name: Path, root_files: dict[str, Path], stopped_by_admin: subprocess.Popen[bytes]
) -> None:
    """bob's journal would resume root's stopped process, re-pin it and write a root 'cgroup.freeze'."""
    (root_files["dir"] / "cgroup.freeze").write_text("1")
    _plant(bob, tmp_name, root_files, journal=_crafted_journal(stopped_by_admin, root_files))
    affinity = os.sched_getaffinity(stopped_by_admin.pid)
    with pytest.raises(UnsafePath):
        prepare_runtime_dir(tmp_name, multi_user=True)
    summary = supervisor.undo(tmp_name)  # the supervisor (and systemd's ExecStopPost) replays nothing
    assert summary.thawed == 0 and "not replayed" in summary.errors[0]
    with pytest.raises(UnsafePath):  # nor does the guardian
        paths.check_private_dir(tmp_name)
    guardian = subprocess.run(
        [
            sys.executable,
            "-m",
            "krex_lab.arbiter.guardian",
            "--pid",
            "999999999",
            "--journal",
            str(tmp_name / "journal.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert guardian.returncode == 2 and "refusing" in guardian.stderr
    assert proc_state(stopped_by_admin.pid) == "T", "an admin's stopped process stays stopped"
    assert os.sched_getaffinity(stopped_by_admin.pid) == affinity
    assert (root_files["dir"] / "cgroup.freeze").read_text() == "1"
    _unchanged(root_files)


def test_every_file_in_the_runtime_dir_is_opened_without_following_links(
    tmp_path: Path, root_files: dict[str, Path]
) -> None:
    """Even in root's own dir (links planted while it was writable, or by a bug): never followed."""
    rt = prepare_runtime_dir(tmp_path / "rt", multi_user=True)
    assert rt.stat().st_mode & 0o7777 == 0o755
    (rt / "arbiter.lock").symlink_to(root_files["file"])
    (rt / "journal.jsonl").symlink_to(root_files["file"])
    with pytest.raises(UnsafePath, match="symlink"):
        paths.open_private(rt / "arbiter.lock", os.O_RDWR | os.O_CREAT)
    with pytest.raises(UnsafePath, match="symlink"):
        Journal(rt / "journal.jsonl")
    _unchanged(root_files)


def test_a_link_to_the_runtime_dir_or_a_swappable_parent_is_refused(
    bob: User, tmp_name: Path, root_files: dict[str, Path]
) -> None:
    bob.python("import os, sys; os.symlink(sys.argv[2], sys.argv[1])", str(tmp_name), str(root_files["dir"]))
    with pytest.raises(UnsafePath, match="symlink"):
        prepare_runtime_dir(tmp_name, multi_user=True)
    _unchanged(root_files)
    os.unlink(tmp_name)
    # A root-owned dir below a bob-owned one: bob could rename it away and put his own there.
    bob.python("import os, sys; os.mkdir(sys.argv[1], 0o755)", str(tmp_name))
    inner = tmp_name / "krex"
    inner.mkdir(mode=0o700)
    with pytest.raises(UnsafePath, match=f"belongs to uid {bob.uid}"):
        prepare_runtime_dir(inner, multi_user=True)


def test_root_defaults_to_run_krex_never_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(paths.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = runtime_dir(create=False)
    assert path == Path("/run/krex")
    assert not str(path).startswith("/tmp")


def test_a_root_runtime_dir_bob_can_only_read(tmp_name: Path, bob: User) -> None:
    """A multi-user dir root made itself, even right in /tmp: 0755 (bob reaches the socket), nothing
    bob can plant in it, and its journal is not world-readable."""

    rt = prepare_runtime_dir(tmp_name, multi_user=True)
    assert rt == tmp_name and rt.stat().st_uid == 0 and rt.stat().st_mode & 0o7777 == 0o755
    Journal(rt / "journal.jsonl").close()
    assert (rt / "journal.jsonl").stat().st_mode & 0o777 == 0o600
    out = bob.run("cat", str(rt / "journal.jsonl"), check=False)
    assert out.returncode != 0 and "Permission denied" in out.stderr
    out = bob.run("ln", "-s", "/etc/shadow", str(rt / "journal2.jsonl"), check=False)
    assert out.returncode != 0 and "Permission denied" in out.stderr
    assert prepare_runtime_dir(tmp_name, multi_user=True) == tmp_name, "root's own /tmp dir stays accepted"


def test_bob_refuses_a_runtime_dir_someone_else_made(bob: User, tmp_name: Path) -> None:
    """For an ordinary user too: a /tmp/krex-<uid> made by another user (here root) is refused."""
    tmp_name.mkdir(mode=0o777)
    tmp_name.chmod(0o777)
    res = bob.python(
        "from krex_lab import paths; print(paths.runtime_dir())",
        check=False,
        env_extra={paths.RUNTIME_DIR_ENV: str(tmp_name)},
    )
    assert res.returncode != 0 and "UnsafePath" in res.stderr and "belongs to uid 0" in res.stderr


def test_the_root_arbiter_refuses_bobs_runtime_dir(bob: User, tmp_name: Path, root_files: dict[str, Path]) -> None:
    """End to end: `krex arbiter --multi-user --runtime-dir <bob's dir>` refuses to start, saying why."""
    _plant(bob, tmp_name, root_files)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "krex_lab.cli",
            "arbiter",
            "--backend",
            "fake",
            "--multi-user",
            "--no-guardian",
            "--runtime-dir",
            str(tmp_name),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    _unchanged(root_files)
    assert res.returncode != 0 and f"belongs to uid {bob.uid}" in res.stderr


def test_a_tmp_name_another_user_takes_first_is_passed_over(bob: User) -> None:
    """Without XDG_RUNTIME_DIR: mallory makes /tmp/krex-<bob's uid> (and a name of the new form)
    first; bob's runtime dir is still one of his own (before: "belongs to uid ...", no krex run)."""
    with make_user("krexmal") as mallory:
        squatted = [Path(f"/tmp/krex-{bob.uid}"), Path(f"/tmp/krex-{bob.uid}-0000")]
        made: set[str] = set()
        try:
            for path in squatted:
                mallory.run("mkdir", "-m", "0777", str(path))
            code = "from krex_lab import paths; print(paths.runtime_dir()); print(paths.runtime_dir())"
            res = bob.python(code, check=False)
            assert res.returncode == 0, res.stderr
            first, second = res.stdout.split()
            made.add(first)
            assert first == second, "every process of bob's finds the same dir"
            assert Path(first) not in squatted and Path(first).name.startswith(f"krex-{bob.uid}-")
            st = Path(first).stat()
            assert st.st_uid == bob.uid and st.st_mode & 0o7777 == 0o700
        finally:
            for path in [*squatted, *map(Path, made)]:
                subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def test_the_pool_of_a_user_of_any_system_runtime_dir_is_in_the_users_own(bob: User, tmp_name: Path) -> None:
    """`krex run` with KREX_RUNTIME_DIR naming a root runtime dir other than /run/krex: the pool's
    socket and log go in bob's own dir (before: PermissionError on <root dir>/pool.log)."""
    rt = prepare_runtime_dir(tmp_name, multi_user=True)
    xdg = Path(f"/tmp/krex-sec-xdg-{bob.uid}")
    xdg.mkdir(mode=0o700)
    os.chown(xdg, bob.uid, bob.gid)
    try:
        res = bob.python(
            "from krex_lab.workers.endpoint import default_endpoint; print(default_endpoint())",
            check=False,
            env_extra={paths.RUNTIME_DIR_ENV: str(rt), "XDG_RUNTIME_DIR": str(xdg)},
        )
        assert res.returncode == 0, res.stderr
        sock = Path(res.stdout.strip().removeprefix("ipc://"))
        assert sock.parent == xdg / "krex", sock
        assert sock.parent.stat().st_uid == bob.uid and sock.parent.stat().st_mode & 0o7777 == 0o700
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(xdg)], check=False)
