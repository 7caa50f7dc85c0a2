"""The history database is migrated, not recreated: a file the previous release wrote (schema
version 1, ``data/history-v1.sqlite``, written by that release's ``RegionHistory`` with five
regions: completed, degraded, expired, revoked, withdrawn) opens with every row kept; a failed
migration leaves the file as it was; a newer file is refused and left alone."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from krex_lab.arbiter import history
from krex_lab.arbiter.history import SCHEMA_VERSION, RegionHistory, columns
from krex_lab.region_report import RegionReport

V1 = Path(__file__).parent / "data" / "history-v1.sqlite"
#: the fixture's regions were released from here on (epoch seconds)
BASE = 1796000000.0


def _copy(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / "history.sqlite"
    shutil.copyfile(V1, path)
    path.chmod(0o600)
    return path


def _schema(path: Path) -> tuple[int, list[str]]:
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        return version, [r[1] for r in conn.execute("PRAGMA table_info(regions)")]
    finally:
        conn.close()


def test_a_version_1_file_is_migrated_with_every_row_kept(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    assert _schema(path)[0] == 1 and "frozen_n" in _schema(path)[1]
    db = RegionHistory(path, retention_days=0).open()
    try:
        version, cols = _schema(path)
        assert version == SCHEMA_VERSION == 2
        assert cols == ["id", "arbiter", "outcome", *(name for name, _, _ in columns())]
        rows = db.recent()
        assert [(r.region, r.user, r.gpu, r.outcome) for r in rows] == [
            ("r1", "alice", 0, "completed"),
            ("r2", "bob", 1, "completed"),
            ("r3", "alice", 1, "expired"),
            ("r4", "bob", 0, "revoked"),
            ("r5", "carol", 0, "withdrawn"),
        ]
        assert {r.arbiter for r in rows} == {"node1-4242"}
        first, degraded, _, revoked, withdrawn = rows
        assert first.hold_s == 2.5 and first.frozen == [5002, 5003] and first.drained == [5001]
        assert first.granted_at == pytest.approx(BASE + 100.01) and first.simulated is True
        assert degraded.degraded is True and degraded.not_drained == {"5010": "did not answer drain"}
        assert revoked.released_by == "ended by admin uid 0"
        assert withdrawn.hold_s is None and withdrawn.acquire_s is None, "never held: no hold, not 0"
        # Fields the old file never had read as their defaults; the reports read back whole.
        assert RegionReport.from_dict(first).shield.mode == "sessions" and first.cores == []
        hours = {u.user: u.gpu_hours for u in db.usage(BASE, BASE + 1000)}
        assert hours == {"alice": pytest.approx(62.5 / 3600), "bob": pytest.approx(31.0 / 3600)}
        late = RegionReport(region="r6", user="dave", gpu=1, acquire_s=0.001, hold_s=1.0, released_at=BASE + 900)
        assert db.add(late)
        assert db.flush() and db.count() == 6 and db.recent(1)[0]["user"] == "dave"
    finally:
        db.close()
    RegionHistory(path).open().close()  # opening it again migrates nothing
    assert _schema(path)[0] == SCHEMA_VERSION


def test_a_version_1_file_reads_offline_without_being_changed(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    before = path.read_bytes()
    db = RegionHistory(path).open_readonly()
    try:
        assert [r.user for r in db.recent()] == ["alice", "bob", "alice", "bob", "carol"]
        assert db.recent()[1]["not_drained"] == {"5010": "did not answer drain"}
    finally:
        db.close()
    assert path.read_bytes() == before and _schema(path)[0] == 1


def test_a_failed_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _copy(tmp_path)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE regions RENAME TO regions_old")  # half done, then it fails
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setitem(history.MIGRATIONS, 1, broken)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        RegionHistory(path).open()
    version, cols = _schema(path)
    assert version == 1 and "frozen_n" in cols
    monkeypatch.undo()
    db = RegionHistory(path).open()
    try:
        assert db.count() == 5
    finally:
        db.close()


def test_a_newer_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(sqlite3.DatabaseError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        RegionHistory(path).open()
    assert _schema(path) == (SCHEMA_VERSION + 1, _schema(path)[1]) and "frozen_n" in _schema(path)[1]
