"""Region history: the SQLite class itself (retention, usage, a full queue, no symlinks) and real
arbiter processes (regions outlive a restart, `krex history --usage`, a locked database never
delays the event loop, other users' rows reduced)."""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab import protocol
from krex_lab.arbiter.history import RegionHistory
from krex_lab.arbiter.history_cli import parse_time, week_start
from krex_lab.client import Connection, hello
from krex_lab.paths import UnsafePath
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.region_report import RegionReport
from tests.support import ME
from tests.support.procs import kill_tree


def _report(user: str, gpu: int, released: float, hold: float, **extra: Any) -> RegionReport:
    return RegionReport(
        **{
            "region": f"r{int(released)}",
            "uid": 1000 if user == "alice" else 1001,
            "user": user,
            "gpu": gpu,
            "wait_s": 0.01,
            "acquire_s": 0.001,
            "hold_s": hold,
            "released_at": released,
            "released_by": "released by holder",
            "frozen": [11, 12],
            "not_drained": {"13": "did not answer drain"},
            "degraded": True,
            "backend": "fake",
            "simulated": True,
            **extra,
        }
    )


@pytest.fixture
def db(tmp_path: Path) -> Any:
    history = RegionHistory(tmp_path / "state" / "history.sqlite", retention_days=1.0).open()
    yield history
    history.close()


def test_the_cap_per_user_keeps_the_newest_across_a_reopen_and_a_prune(tmp_path: Path) -> None:
    """The cap deletes exactly what is past it, the oldest first, from a file that an earlier
    arbiter filled (its rows counted once, not scanned at every insert), and still after a prune."""
    path, now = tmp_path / "state" / "history.sqlite", time.time()
    first = RegionHistory(path, retention_days=1.0).open()
    for i in range(8):
        first.add(_report("alice", 0, now - 100 + i, 1.0))
    first.add(_report("bob", 0, now - 50, 1.0))
    first.close()
    db = RegionHistory(path, retention_days=1.0, per_user=5).open()
    try:
        db.add(_report("alice", 0, now - 10, 1.0))
        assert db.flush()

        def released(user: str) -> list[float]:
            return sorted(round(now - r.released_at) for r in db.recent(limit=100, user=user))

        assert released("alice") == [10, 93, 94, 95, 96], "the newest five: the oldest four went"
        assert released("bob") == [50], "another user's rows stay"
        for i in range(3):
            db.add(_report("alice", 0, now - 5 + i, 1.0))
        db.add(_report("alice", 0, now - 3 * 86400, 1.0))  # past the retention: the prune takes it
        assert db.prune_now()
        db.add(_report("alice", 0, now - 1, 1.0))
        assert db.flush()
        assert released("alice") == [1, 3, 4, 5, 10]
    finally:
        db.close()


def test_rows_keep_the_report(db: RegionHistory) -> None:
    now = time.time()
    assert db.add(_report("alice", 1, now - 10, 5.0))
    assert db.flush()
    (row,) = db.recent()
    assert (row.user, row.uid, row.gpu, row.hold_s, row.outcome) == ("alice", 1000, 1, 5.0, "completed")
    assert row.frozen == [11, 12]
    assert row.not_drained == {"13": "did not answer drain"}
    assert row.degraded is True and row.simulated is True and row.expired is False
    assert row.granted_at == pytest.approx(now - 15)
    assert stat.S_IMODE(os.stat(db.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(db.path.parent).st_mode) == 0o700


def test_retention_deletes_old_rows(db: RegionHistory) -> None:
    now = time.time()
    db.add(_report("alice", 0, now - 3 * 86400, 1.0))  # older than the 1-day retention
    db.add(_report("bob", 0, now - 3600, 1.0))
    assert db.flush() and db.count() == 2, "rows are written whatever their age; pruning deletes them"
    assert db.prune_now()
    assert [r.user for r in db.recent()] == ["bob"]


def test_usage_sums_hold_per_user_and_gpu_within_the_window(db: RegionHistory) -> None:
    since = time.time() - 10 * 3600
    db.add(_report("alice", 0, since + 2 * 3600, 3600.0))
    db.add(_report("alice", 1, since + 3 * 3600, 1800.0))
    db.add(_report("bob", 1, since + 4 * 3600, 900.0))
    db.add(_report("bob", 0, since + 600, 1200.0))  # began 600 s before the window: half counts
    db.add(_report("carol", 0, since - 60, 50.0))  # entirely before the window
    db.add(_report("carol", 0, since + 60, 0.0, acquire_s=None))  # withdrawn: held nothing
    assert db.flush()
    users = {u.user: u for u in db.usage(since)}
    assert set(users) == {"alice", "bob"}
    assert users["alice"].gpu_hours == pytest.approx(1.5)
    assert users["bob"].gpu_hours == pytest.approx((900 + 600) / 3600)
    assert users["alice"].regions == 2
    gpus = {g.gpu: g.gpu_hours for g in db.usage(since, by="gpu")}
    assert gpus == {0: pytest.approx(1 + 600 / 3600), 1: pytest.approx(0.75)}
    pairs = {(r.user, r.gpu): r.gpu_hours for r in db.usage(since, by="user,gpu")}
    assert pairs[("alice", 1)] == pytest.approx(0.5)
    assert db.usage(since, user="bob")[0].user == "bob"
    assert db.usage(since, until=since + 1800)[0].gpu_hours == pytest.approx(600 / 3600)


def test_recent_filters_and_orders_newest_last(db: RegionHistory) -> None:
    now = time.time()
    for i in range(5):
        db.add(_report("alice" if i % 2 else "bob", 0, now - 100 + i, 1.0))
    assert db.flush()
    assert [r.released_at for r in db.recent(3)] == [now - 98, now - 97, now - 96]
    assert {r.user for r in db.recent(user="alice")} == {"alice"}
    assert len(db.recent(since=now - 97.5)) == 2


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    history = RegionHistory(tmp_path / "h.sqlite", queue_size=2)  # not opened: nothing drains the queue
    t0 = time.monotonic()
    results = [history.add(_report("alice", 0, time.time(), 1.0)) for _ in range(4)]
    assert time.monotonic() - t0 < 0.1
    assert results == [True, True, False, False] and history.dropped == 2


def test_a_planted_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "history.sqlite").symlink_to(target)
    with pytest.raises(UnsafePath):
        RegionHistory(tmp_path / "history.sqlite").open()
    (tmp_path / "history.sqlite").unlink()
    (tmp_path / "history.sqlite-wal").symlink_to(target)
    with pytest.raises(UnsafePath):
        RegionHistory(tmp_path / "history.sqlite").open()


def test_outcome() -> None:
    assert RegionReport(acquire_s=0.1, released_by="released by holder").outcome == "completed"
    assert RegionReport(acquire_s=0.1, expired=True).outcome == "expired"
    assert RegionReport(acquire_s=0.1, released_by="ended by admin uid 0").outcome == "revoked"
    assert RegionReport(released_by="enforcement failed: boom").outcome == "failed"
    assert RegionReport(released_by="session ended").outcome == "withdrawn"


def test_parse_time() -> None:
    now = dt.datetime(2026, 12, 3, 15, 30).timestamp()  # a Thursday
    assert parse_time("7d", now) == now - 7 * 86400
    assert parse_time("24h", now) == now - 86400
    assert parse_time("90s", now) == now - 90
    assert parse_time("this-week", now) == dt.datetime(2026, 11, 30).timestamp() == week_start(now)
    assert parse_time("today", now) == dt.datetime(2026, 12, 3).timestamp()
    assert parse_time("2026-12-01", now) == dt.datetime(2026, 12, 1).timestamp()
    assert parse_time("2026-12-01T09:30", now) == dt.datetime(2026, 12, 1, 9, 30).timestamp()
    assert (
        parse_time("2026-12-01T09:30+00:00", now) == dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.timezone.utc).timestamp()
    )
    with pytest.raises(ValueError, match="cannot read the time"):
        parse_time("last tuesday", now)


# -- real arbiters -------------------------------------------------------------------------------


def _region(arb: ArbiterProc, *cmd: str, gpu: int = 0) -> None:
    subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--quiet", "--gpu", str(gpu), "--", *(cmd or ("true",))],
        env=arb.env(),
        check=True,
        timeout=60,
    )


def _history_cli(arb: ArbiterProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "history", *args],
        env=arb.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "rt"
    path.mkdir(mode=0o700)
    return path


def test_regions_outlive_an_arbiter_restart(runtime: Path) -> None:
    first = ArbiterProc(runtime).start()
    holding: subprocess.Popen[bytes] | None = None
    try:
        _region(first, "sleep", "0.2", gpu=1)
        _region(first, gpu=0)
        holding = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "exclusive", "--quiet", "--gpu", "1", "--", "sleep", "30"],
            env=first.env(),
        )
        # Granted once its command runs (krex exclusive starts it only then). Not read from status
        # requests: one went unanswered for 10 s here in two fresh-clone runs (see ArbiterProc.status).
        wait_for(lambda: bool(psutil.Process(holding.pid).children()), timeout=20)
    finally:
        first.stop()  # the held region ends with the arbiter, and is recorded too
        if holding is not None:
            kill_tree(holding)  # krex exclusive and its `sleep 30`
    assert stat.S_IMODE(os.stat(runtime / "history.sqlite").st_mode) == 0o600
    second = ArbiterProc(runtime).start()
    try:
        rows = json.loads(_history_cli(second, "--json").stdout)
        assert [(r["gpu"], r["released_by"]) for r in rows] == [
            (1, "released by holder"),
            (0, "released by holder"),
            (1, "arbiter shutting down"),
        ]
        assert rows[0]["hold_s"] >= 0.2 and rows[0]["user"] == ME and rows[0]["uid"] == os.geteuid()
        assert rows[0]["requested_at"] <= rows[0]["granted_at"] <= rows[0]["released_at"] <= time.time()
        _region(second, gpu=0)
        assert len(json.loads(_history_cli(second, "--json").stdout)) == 4
        assert [r["gpu"] for r in json.loads(_history_cli(second, "--json", "--limit", "2").stdout)] == [1, 0]
        table = _history_cli(second, "--user", ME, "--since", "1h").stdout
        assert table.splitlines()[0].split() == ["TIME", "USER", "GPU", "QUEUE-WAIT", "HOLD", "DEGRADED", "ENDED"]
        assert len(table.splitlines()) == 5 and "arbiter shutting down" in table
        # a user of this machine without regions: none recorded (exit 0); one it does not know: a
        # wrong call (a typo, most likely), said as such (exit 2)
        assert "no finished regions" in _history_cli(second, "--user", "nobody").stdout
        for extra in ((), ("--json",), ("--usage",)):
            unknown = subprocess.run(
                [sys.executable, "-m", "krex_lab.cli", "history", "--user", "no-such-user-here", *extra],
                env=second.env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert unknown.returncode == 2, (extra, unknown.stdout, unknown.stderr)
            said = "no user 'no-such-user-here' is known on this machine"
            if "--json" in extra:  # the JSON alone, on stdout: not said twice
                assert said in json.loads(unknown.stdout)["error"] and said not in unknown.stderr, unknown
            else:
                assert said in unknown.stderr, unknown.stderr
    finally:
        second.stop()


def test_history_usage_prints_gpu_hours(runtime: Path) -> None:
    arb = ArbiterProc(runtime).start()
    try:
        _region(arb, "sleep", "1", gpu=1)
        out = _history_cli(arb, "--usage").stdout
        assert "GPU-hours held from" in out
        _, hours, held, unit, regions = next(x for x in out.splitlines() if x.startswith(f"{ME} ")).split()
        assert 1.0 <= float(held) < 5.0 and unit == "s" and regions == "1"
        usage = json.loads(_history_cli(arb, "--usage", "--json", "--since", "this-week").stdout)
        assert usage["since"] == week_start()
        assert usage["users"][0]["user"] == ME and 1 / 3600 <= usage["users"][0]["gpu_hours"] < 5 / 3600
        assert f"{usage['users'][0]['gpu_hours']:.4f}" == hours
        assert [g["gpu"] for g in usage["gpus"]] == [1]
        future = json.loads(_history_cli(arb, "--usage", "--json", "--since", "2099-01-01").stdout)
        assert future["users"] == []
    finally:
        arb.stop()


def test_a_locked_database_never_delays_the_event_loop(runtime: Path) -> None:
    arb = ArbiterProc(runtime).start()
    blocker = sqlite3.connect(runtime / "history.sqlite", timeout=0.1, isolation_level=None)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        # The region's release queues a row that the writer cannot write while we hold the lock;
        # the event loop answers hello meanwhile, during the region and for 2 s after it.
        region = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "exclusive", "--quiet", "--gpu", "0", "--", "true"], env=arb.env()
        )
        latencies = []
        ended = None
        deadline = time.monotonic() + 30
        while ended is None or time.monotonic() - ended < 2.0:
            assert time.monotonic() < deadline, "the region did not end"
            t = time.monotonic()
            hello(arb.endpoint, timeout=5.0)
            latencies.append(time.monotonic() - t)
            if ended is None and region.poll() is not None:
                ended = time.monotonic()
                assert region.returncode == 0
            time.sleep(0.02)
        assert blocker.execute("SELECT COUNT(*) FROM regions").fetchone()[0] == 0, "the writer was held up"
        # a writer on the event loop would stall it for as long as the lock is held (2 s and more,
        # under a 30 s busy timeout); a loaded 2-core machine with a core reserved for the region
        # delays an answer by tens of milliseconds, so the bound sits between the two
        assert max(latencies) < 1.0, f"hello took up to {max(latencies):.3f} s while the database was locked"
        blocker.execute("ROLLBACK")
        conn = Connection(arb.endpoint)
        try:
            wait_for(lambda: len(conn.call(protocol.History())["rows"]) == 1, timeout=10)
        finally:
            conn.close()
    finally:
        blocker.close()
        arb.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="a multi-user arbiter runs as root only")
def test_others_see_reduced_rows_on_a_multi_user_arbiter(runtime: Path) -> None:
    arb = ArbiterProc(runtime, extra=("--multi-user",)).start()
    try:
        _region(arb, gpu=0)
        conn = Connection(arb.endpoint)
        try:
            (anonymous,) = conn.call(protocol.History())["rows"]
            (full,) = conn.call(protocol.History(ticket=conn.ticket()))["rows"]  # root: an admin
            usage = conn.call(protocol.History(usage=True))
        finally:
            conn.close()
        assert {"holder_pid", "frozen", "session", "name", "uid"} <= set(full)
        assert not {"holder_pid", "frozen", "session", "name", "uid", "not_drained"} & set(anonymous)
        assert anonymous["user"] == "root" and anonymous["gpu"] == 0 and "hold_s" in anonymous and "time" in anonymous
        assert usage["users"][0]["user"] == "root", "usage totals are everyone's to see"
    finally:
        arb.stop()


def test_history_db_empty_disables_it(runtime: Path) -> None:
    arb = ArbiterProc(runtime, extra=("--Arbiter.history_db=",)).start()
    try:
        _region(arb, gpu=0)
        assert not (runtime / "history.sqlite").exists()
        proc = subprocess.run(
            [sys.executable, "-m", "krex_lab.arbiter.history_cli"], env=arb.env(), capture_output=True, text=True
        )
        assert proc.returncode == 1 and "keeps no region history" in proc.stderr
    finally:
        arb.stop()
