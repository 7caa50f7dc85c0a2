"""The ``regions`` table of the region history: its columns, derived from
:class:`~krex_lab.region_report.RegionReport` (one per field; a field added to the report
becomes a column when the database is opened), its schema versions and migrations, and the
conversion of a report to a row and of a row back to a report (:class:`HistoryRow`).
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ..region_report import RegionReport, field_info

log = logging.getLogger("krex.history")

#: the layout of the ``regions`` table (``PRAGMA user_version``); :data:`MIGRATIONS` bring an
#: older file to it. A field added to the report needs no new version: its column is added
#: when the database is opened (:func:`_add_columns`).
SCHEMA_VERSION = 2

#: columns of the history's own beside the report's (an arbiter run tells regions of different
#: runs apart: region ids start at r1 each run)
OWN_COLUMNS: tuple[tuple[str, str], ...] = (("arbiter", "TEXT NOT NULL DEFAULT ''"), ("outcome", "TEXT"))

_SQL_TYPES = {bool: "INTEGER", int: "INTEGER", float: "REAL", str: "TEXT"}

#: a value SQLite stores
SqlValue = str | int | float | None


def _column(member: object) -> str:
    """A report field's column, named from the Struct's own member (``RegionReport.hold_s``): a
    field renamed or removed fails here, where the SQL that uses it is built, not in a query."""
    name = str(getattr(member, "__name__"))  # noqa: B009 - a member descriptor's name
    assert name in RegionReport.__struct_fields__, name
    return name


# the columns the queries below filter, group and order by
USER, UID, GPU = _column(RegionReport.user), _column(RegionReport.uid), _column(RegionReport.gpu)
SLURM_JOB, ACCOUNT = _column(RegionReport.slurm_job), _column(RegionReport.account)
REGION, STATE = _column(RegionReport.region), _column(RegionReport.state)
HOLD, ACQUIRE = _column(RegionReport.hold_s), _column(RegionReport.acquire_s)
RELEASED, NOT_DRAINED = _column(RegionReport.released_at), _column(RegionReport.not_drained)


def _column_type(tp: Any) -> tuple[str, bool]:
    """A report field's SQLite type, and whether it is kept as JSON text (a list, a map, a struct)."""
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(tp) if a is not type(None)] if optional else [tp]
    base = args[0] if len(args) == 1 else None
    if base in _SQL_TYPES:
        return _SQL_TYPES[base], False
    return "TEXT", True


@functools.cache
def columns() -> tuple[tuple[str, str, bool], ...]:
    """The report's columns, derived from :class:`~krex_lab.region_report.RegionReport`:
    (name, SQLite type, kept as JSON)."""
    return tuple((name, *_column_type(tp)) for name, tp, _ in field_info(RegionReport))


def _create(conn: sqlite3.Connection, table: str = "regions") -> None:
    cols = [f"{n} {t}" for n, t in OWN_COLUMNS] + [f"{n} {t}" for n, t, _ in columns()]
    conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, {', '.join(cols)})")


def _indexes(conn: sqlite3.Connection) -> None:
    conn.execute(f"CREATE INDEX IF NOT EXISTS regions_released ON regions({RELEASED})")
    conn.execute(f"CREATE INDEX IF NOT EXISTS regions_user ON regions({USER}, {RELEASED})")
    conn.execute(f"CREATE INDEX IF NOT EXISTS regions_slurm_job ON regions({SLURM_JOB})")


def _table_columns(conn: sqlite3.Connection) -> list[str]:
    return [r[1] for r in conn.execute("PRAGMA table_info(regions)")]


def _add_columns(conn: sqlite3.Connection) -> None:
    """Add a column for each report field the table lacks (fields added since the file was made)."""
    have = set(_table_columns(conn))
    for name, kind, _ in columns():
        if name not in have:
            conn.execute(f"ALTER TABLE regions ADD COLUMN {name} {kind}")


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    """Version 1 kept each pid list's length in a column of its own (``frozen_n``), a
    withdrawn region's hold as 0 (``hold_s NOT NULL``) and an empty ``not_drained`` map as
    ``[]``. Version 2 has the report's columns alone, each nullable (None: not measured): the
    table is rebuilt, rows copied column by column, a withdrawn region's hold becomes NULL."""
    _create(conn, "regions_v2")
    new = [r[1] for r in conn.execute("PRAGMA table_info(regions_v2)")]
    common = ", ".join(c for c in _table_columns(conn) if c in new)
    conn.execute(f"INSERT INTO regions_v2 ({common}) SELECT {common} FROM regions")
    conn.execute(f"UPDATE regions_v2 SET {HOLD} = NULL WHERE {ACQUIRE} IS NULL")
    conn.execute(f"UPDATE regions_v2 SET {NOT_DRAINED} = '{{}}' WHERE {NOT_DRAINED} = '[]'")  # a map, written as []
    conn.execute(f"UPDATE regions_v2 SET {STATE} = 'released' WHERE {STATE} IS NULL")
    conn.execute("DROP TABLE regions")
    conn.execute("ALTER TABLE regions_v2 RENAME TO regions")


#: version N -> N + 1, each run in one transaction with the new version
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2}


def migrate(conn: sqlite3.Connection, path: Path | str = "") -> int:
    """Bring the database to :data:`SCHEMA_VERSION` (creating the table in a new file), then
    add the columns of report fields it lacks; returns the version it had. A newer file than
    this krex-lab knows is refused (``sqlite3.DatabaseError``), and left as it is."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"{path} has schema version {version}, newer than this krex-lab's {SCHEMA_VERSION}")
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'regions'").fetchone()
    kept = conn.isolation_level
    conn.isolation_level = None  # our own transactions: a migration and its version commit together
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not exists:
                _create(conn)
            else:
                for step in range(max(version, 1), SCHEMA_VERSION):
                    log.info("region history: migrating %s from schema version %d to %d", path, step, step + 1)
                    MIGRATIONS[step](conn)
            _add_columns(conn)
            _indexes(conn)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.isolation_level = kept
    return version


class HistoryRow(RegionReport, kw_only=True):
    """A finished region as the history keeps it: its report, the arbiter run that made it, and
    (in its JSON form, :meth:`to_dict`) how it ended and when (``time``, what another user's view
    keeps of it beside the public fields)."""

    #: the arbiter run (region ids start at r1 each run)
    arbiter: str = ""
    #: when it ended: ``released_at``, which another user's view of the row keeps as this
    time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "outcome": self.outcome}

    def public_dict(self) -> dict[str, Any]:
        return {**super().public_dict(), "time": self.time}


def outcome(report: RegionReport) -> str:
    """How a region ended (:attr:`RegionReport.outcome`)."""
    return report.outcome


#: a structured field's column text (on the event loop: msgspec's encoder, a few times json's speed)
_JSON = msgspec.json.Encoder(order="sorted")


def row_of(report: RegionReport, arbiter: str = "") -> tuple[SqlValue, ...]:
    """The row of one finished region's report (``Region.report`` plus its wall-clock times), in
    the order of :func:`insert_columns`."""
    report = msgspec.structs.replace(report, released_at=report.released_at or time.time())
    if report.granted_at is None and report.granted:
        report.granted_at = (report.released_at or 0.0) - (report.hold_s or 0.0)
    own: tuple[SqlValue, ...] = (arbiter, report.outcome)
    return own + tuple(
        _JSON.encode(getattr(report, name)).decode() if as_json else getattr(report, name)
        for name, _, as_json in columns()
    )


def insert_columns() -> list[str]:
    return [n for n, _ in OWN_COLUMNS] + [n for n, _, _ in columns()]


def row_view(row: sqlite3.Row) -> HistoryRow:
    """A stored row as the report it was (a field added since it was written: its default),
    with the history's own columns and ``time`` (what privacy keeps of another user's row)."""
    data = {}
    stored = set(row.keys())  # a file read as it is (krex history offline) may be of an older version
    for name, _, as_json in columns():
        value = row[name] if name in stored else None
        # An empty list or map is the default (version 1 wrote an empty map as [] too).
        if value is not None and value not in ("[]", "{}"):
            data[name] = json.loads(value) if as_json else value
    view = msgspec.convert(data, HistoryRow, strict=False)
    view.arbiter = row[OWN_COLUMNS[0][0]]
    view.time = view.released_at
    return view
