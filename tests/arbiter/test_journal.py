"""The journal survives bad data and never follows a link (issue "Hostile neighbours", item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from krex_lab.arbiter.journal import Journal, Stop, read_outstanding, undo_outstanding
from krex_lab.paths import UnsafePath
from krex_lab.procutil import proc_state, start_time
from krex_lab.pytest_plugin import wait_for


def _stop_entry(proc: subprocess.Popen[bytes], region: str = "r1") -> str:
    return json.dumps({"t": "stop", "region": region, "procs": [[proc.pid, start_time(proc.pid)]]})


MALFORMED = {
    "array": "[]",
    "string": '"stop"',
    "number": "42",
    "null": "null",
    "no t": '{"region": "r1", "procs": [[1, 2]]}',
    "unknown t": '{"t": "explode", "region": "r1"}',
    "no region": '{"t": "stop", "procs": [[1, 2]]}',
    "region not str": '{"t": "stop", "region": 7, "procs": [[1, 2]]}',
    "stop without procs": '{"t": "stop", "region": "r1"}',
    "procs not a list": '{"t": "stop", "region": "r1", "procs": "1 2"}',
    "proc not a pair": '{"t": "stop", "region": "r1", "procs": [[1]]}',
    "proc of strings": '{"t": "stop", "region": "r1", "procs": [["1", "2"]]}',
    "pid -1 (every process)": '{"t": "stop", "region": "r1", "procs": [[-1, 0]]}',
    "pid 0 (own group)": '{"t": "stop", "region": "r1", "procs": [[0, 0]]}',
    "bool pid": '{"t": "stop", "region": "r1", "procs": [[true, 2]]}',
    "cgfreeze without paths": '{"t": "cgfreeze", "region": "r1"}',
    "cgfreeze paths of ints": '{"t": "cgfreeze", "region": "r1", "paths": [1, 2]}',
    "affinity with 2 fields": '{"t": "affinity", "region": "r1", "threads": [[1, 2]]}',
    "affinity cpus not a list": '{"t": "affinity", "region": "r1", "threads": [[1, 2, 3]]}',
    "affinity negative cpu": '{"t": "affinity", "region": "r1", "threads": [[1, 2, [-1]]]}',
    "threads with 3 fields": '{"t": "threads", "region": "r1", "threads": [[1, 2, [0]]]}',
    "threads pid 0": '{"t": "threads", "region": "r1", "threads": [[1, 0, 5, [0]]]}',
    "threads without a start": '{"t": "threads", "region": "r1", "threads": [[1, 2, null, [0]]]}',
    "lock without backend": '{"t": "lock", "region": "r1", "procs": [[1, 2]]}',
    "lock backend not str": '{"t": "lock", "region": "r1", "backend": 3, "procs": [[1, 2]]}',
    "end without region": '{"t": "end"}',
    "torn": '{"t": "stop", "region": "r1", "pro',
    "not utf-8": "\udcff\udcfe",
}


@pytest.mark.parametrize("bad", list(MALFORMED), ids=list(MALFORMED))
def test_a_malformed_entry_is_skipped_and_the_good_ones_undone(
    tmp_path: Path, stopped: subprocess.Popen[bytes], bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.jsonl"
    text = MALFORMED[bad] + "\n" + _stop_entry(stopped) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, text.encode(errors="surrogateescape"))
    os.close(fd)
    assert [type(e) for e in read_outstanding(path)] == [Stop]
    summary = undo_outstanding(path)
    assert summary.thawed == 1, summary
    wait_for(lambda: proc_state(stopped.pid) in ("S", "R"), timeout=2.0)
    assert "skipped" in caplog.text
    assert path.stat().st_size == 0


def test_a_journal_full_of_bad_data_still_undoes_what_it_can(tmp_path: Path, stopped: subprocess.Popen[bytes]) -> None:
    """Every kind at once; affinity restored, process resumed, a non-KREX cgfreeze path untouched."""
    victim = tmp_path / "not-a-cgroup"
    victim.mkdir()
    (victim / "cgroup.freeze").write_text("1")
    pinned = subprocess.Popen(["sleep", "60"])
    try:
        wait_for(lambda: start_time(pinned.pid) is not None)
        original = sorted(os.sched_getaffinity(pinned.pid))
        lines = list(MALFORMED.values())
        lines.insert(
            5,
            json.dumps({"t": "affinity", "region": "r2", "threads": [[pinned.pid, start_time(pinned.pid), original]]}),
        )
        lines.insert(9, _stop_entry(stopped, "r3"))
        lines.insert(12, json.dumps({"t": "cgfreeze", "region": "r4", "paths": [str(victim)]}))
        path = tmp_path / "journal.jsonl"
        Journal(path).close()
        with open(path, "w", errors="surrogateescape") as f:
            f.write("\n".join(lines[:-2] + lines[-1:] + lines[-2:-1]))  # the torn line last, as in a crash
        if len(original) > 1:
            os.sched_setaffinity(pinned.pid, {original[0]})
        summary = undo_outstanding(path)
        assert summary.thawed == 1 and summary.restored == 1, summary
        assert sorted(os.sched_getaffinity(pinned.pid)) == original
        wait_for(lambda: proc_state(stopped.pid) in ("S", "R"), timeout=2.0)
        assert (victim / "cgroup.freeze").read_text() == "1", "only cgroups KREX manages are thawed"
    finally:
        pinned.kill()
        pinned.wait()


def test_the_journal_is_never_opened_through_a_symlink(tmp_path: Path, stopped: subprocess.Popen[bytes]) -> None:
    """A symlink planted at journal.jsonl: the file it names is neither written, read as a journal
    nor truncated, and opening fails saying why."""
    target = tmp_path / "root-file"
    crafted = _stop_entry(stopped) + "\n"
    target.write_text(crafted)
    target.chmod(0o644)
    path = tmp_path / "rt" / "journal.jsonl"
    path.parent.mkdir(mode=0o700)
    path.symlink_to(target)
    with pytest.raises(UnsafePath, match="symlink"):
        Journal(path)
    with pytest.raises(UnsafePath, match="symlink"):
        read_outstanding(path)
    with pytest.raises(UnsafePath, match="symlink"):
        undo_outstanding(path)
    assert target.read_text() == crafted
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert proc_state(stopped.pid) == "T", "a journal reached through a symlink is never replayed"


def test_the_journal_is_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        Journal(tmp_path / "journal.jsonl").close()
    finally:
        os.umask(old)
    assert (tmp_path / "journal.jsonl").stat().st_mode & 0o777 == 0o600
    (tmp_path / "j2").write_text("")
    (tmp_path / "j2").chmod(0o644)
    Journal(tmp_path / "j2").close()
    assert (tmp_path / "j2").stat().st_mode & 0o777 == 0o600, "an existing journal is narrowed to 0600"


def test_undo_waits_for_no_live_arbiter(tmp_path: Path, stopped: subprocess.Popen[bytes]) -> None:
    """The guardian and the supervisor undo only while no live arbiter holds arbiter.lock."""
    path = tmp_path / "journal.jsonl"
    path.write_text(_stop_entry(stopped) + "\n")
    path.chmod(0o600)
    lock = tmp_path / "arbiter.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
                "print('held', flush=True); time.sleep(60)"
            ),
            str(lock),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        summary = undo_outstanding(path, lock_path=lock, wait=0.2)
        assert summary.thawed == 0 and "live arbiter" in summary.errors[0]
        assert proc_state(stopped.pid) == "T"
    finally:
        holder.kill()
        holder.wait()
    assert undo_outstanding(path, lock_path=lock)["thawed"] == 1
