"""Region history that outlives the arbiter: one row per finished region in an embedded SQLite file.

The arbiter's event loop only *enqueues* a finished region's report (:meth:`RegionHistory.add`,
non-blocking; a full queue drops the report and counts it in :attr:`RegionHistory.dropped`).
One writer thread owns the writing connection: it inserts in batches, one transaction per batch,
and deletes rows older than ``retention_days`` when it opens and every ``prune_interval``
seconds. Reads (:meth:`RegionHistory.recent`, :meth:`RegionHistory.usage`) go through a separate
connection (WAL mode: readers never wait for the writer) and are meant to run in an executor.

The file is opened the way the runtime dir's other files are (:func:`krex_lab.paths.open_private`:
no symlink, a regular file of ours with one link, mode 0600), in a directory that is the
arbiter's own (:func:`krex_lab.paths.prepare_runtime_dir`); SQLite's ``-wal`` and ``-shm``
files, which it creates with the database's mode, get the same checks when they already exist.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
import types
import typing
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .. import paths
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
    conn.execute("CREATE INDEX IF NOT EXISTS regions_released ON regions(released_at)")
    conn.execute("CREATE INDEX IF NOT EXISTS regions_user ON regions(user, released_at)")
    conn.execute("CREATE INDEX IF NOT EXISTS regions_slurm_job ON regions(slurm_job)")


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
    conn.execute("UPDATE regions_v2 SET hold_s = NULL WHERE acquire_s IS NULL")
    conn.execute("UPDATE regions_v2 SET not_drained = '{}' WHERE not_drained = '[]'")  # a map, written as []
    conn.execute("UPDATE regions_v2 SET state = 'released' WHERE state IS NULL")
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


#: what ``usage`` can group by (a Slurm job has one user and one account: grouping by all three is by job)
USAGE_KEYS = {
    "user": ("user",),
    "gpu": ("gpu",),
    "user,gpu": ("user", "gpu"),
    "job": ("slurm_job", "user", "account"),
    "account": ("account",),
}


def outcome(report: RegionReport) -> str:
    """How a region ended (:attr:`RegionReport.outcome`)."""
    return report.outcome


#: a structured field's column text (on the event loop: msgspec's encoder, a few times json's speed)
_JSON = msgspec.json.Encoder(order="sorted")


def row_of(report: RegionReport, arbiter: str = "") -> dict[str, Any]:
    """The row of one finished region's report (``Region.report`` plus its wall-clock times)."""
    report = msgspec.structs.replace(report, released_at=report.released_at or time.time())
    if report.granted_at is None and report.granted:
        report.granted_at = (report.released_at or 0.0) - (report.hold_s or 0.0)
    row: dict[str, Any] = {"arbiter": arbiter, "outcome": report.outcome}
    for name, _, as_json in columns():
        value = getattr(report, name)
        row[name] = _JSON.encode(value).decode() if as_json else value
    return row


def _view(row: sqlite3.Row) -> dict[str, Any]:
    """A stored row as the report it was (a field added since it was written: its default),
    with the history's own columns and ``time`` (what privacy keeps of another user's row)."""
    data = {}
    stored = set(row.keys())  # a file read as it is (krex history offline) may be of an older version
    for name, _, as_json in columns():
        value = row[name] if name in stored else None
        # An empty list or map is the default (version 1 wrote an empty map as [] too).
        if value is not None and value not in ("[]", "{}"):
            data[name] = json.loads(value) if as_json else value
    report = RegionReport.from_dict(data)
    return {**report.to_dict(), **{n: row[n] for n, _ in OWN_COLUMNS}, "time": report.released_at}


def _check_sidecars(path: Path) -> None:
    """SQLite's own files next to the database must not be links someone planted."""
    for suffix in ("-wal", "-shm", "-journal"):
        side = Path(f"{path}{suffix}")
        if os.path.lexists(side):
            os.close(paths.open_private(side, os.O_RDONLY))


class RegionHistory:
    """Finished regions in the SQLite file ``path``; rows older than ``retention_days`` (<= 0:
    never) are deleted. :meth:`open` starts the writer thread, :meth:`close` drains and stops it."""

    def __init__(
        self,
        path: Path | str,
        retention_days: float = 90.0,
        *,
        arbiter: str = "",
        queue_size: int = 10_000,
        prune_interval: float = 3600.0,
        busy_timeout: float = 30.0,
        per_user: int = 0,
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self.retention_days = retention_days
        #: tells regions of different arbiter runs apart (region ids start at r1 each run)
        self.arbiter = arbiter
        self.prune_interval = prune_interval
        self.busy_timeout = busy_timeout
        #: rows kept per user (the oldest beyond it are deleted as rows are added); 0: no cap
        self.per_user = per_user
        #: reports dropped because the writer's queue was full
        self.dropped = 0
        #: rows the writer failed to store (a database error after its retries)
        self.failed = 0
        #: rows written by this instance
        self.written = 0
        self._queue: queue.Queue[dict[str, Any] | threading.Event | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._ready = threading.Event()
        self._open_error: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def _connect(self, *, create: bool) -> sqlite3.Connection:
        if create:
            os.close(paths.open_private(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        else:
            os.close(paths.open_private(self.path, os.O_RDONLY))
        _check_sidecars(self.path)
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=rw"
        conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        return conn

    def open(self) -> RegionHistory:
        """Create or open the file, check the schema and start the writer thread (which prunes first).
        Its directory is created (0700) or must be ours and writable by no one else
        (:func:`krex_lab.paths.prepare_runtime_dir`). Raises what went wrong (an unsafe path, a
        file that is not a database)."""
        paths.prepare_runtime_dir(self.path.parent, multi_user=False, chmod=False)
        old = os.umask(0o077)
        try:
            conn = self._connect(create=True)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                migrate(conn, self.path)
            except BaseException:
                conn.close()
                raise
            self._reader = self._connect(create=False)
        finally:
            os.umask(old)
        self._thread = threading.Thread(target=self._run, args=(conn,), name="krex-history", daemon=True)
        self._thread.start()
        return self

    def open_readonly(self) -> RegionHistory:
        """Open the file for reading only, with no writer (``krex history`` when no arbiter answers).
        The file may be another user's: whoever may read it (its permissions decide) may open it
        (PermissionError otherwise). It must be a regular file, not a link; a database whose
        ``-shm`` cannot be created here (a directory this user may not write) is read as it is
        on disk (``immutable``), which is right when no arbiter is writing it."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise paths.UnsafePath(f"{self.path} is not a regular file")
        finally:
            os.close(fd)
        base = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
        for uri in (base, f"{base}&immutable=1"):
            conn = None
            try:
                conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout, check_same_thread=False)
                conn.row_factory = sqlite3.Row
                conn.execute("SELECT COUNT(*) FROM regions").fetchone()
            except sqlite3.OperationalError:
                if conn is not None:
                    conn.close()
                if uri != base:
                    raise
                continue
            self._reader = conn
            break
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (waiting at most ``timeout`` s), then stop the writer."""
        if self._thread is not None:
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                log.warning("region history: the writer is stuck; %d reports not written", self._queue.qsize())
            self._thread.join(timeout)
            self._thread = None
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    # -- writing (the event loop: never blocks) -------------------------------------------------
    def add(self, report: RegionReport) -> bool:
        """Queue a finished region's report; False (counted in :attr:`dropped`) when the queue is full."""
        try:
            self._queue.put_nowait(row_of(report, self.arbiter))
            return True
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning(
                    "region history: the writer's queue is full (is %s slow or locked?): %d reports dropped",
                    self.path,
                    self.dropped,
                )
            return False

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until everything queued before this call is written; False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def prune_now(self, timeout: float = 5.0) -> bool:
        """Ask the writer to apply the retention now (and wait for it); False on timeout."""
        self._next_prune = 0.0
        return self.flush(timeout)

    _next_prune = 0.0

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                if time.monotonic() >= self._next_prune:
                    self._guard(lambda: self._prune(conn))
                    self._next_prune = time.monotonic() + self.prune_interval
                wait = max(0.0, self._next_prune - time.monotonic())
                try:
                    first = self._queue.get(timeout=wait)
                except queue.Empty:
                    continue
                batch = [first]
                while len(batch) < 500:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                rows = [b for b in batch if isinstance(b, dict)]
                if rows and not self._guard(functools.partial(self._insert, conn, rows)):
                    self.failed += len(rows)
                if time.monotonic() >= self._next_prune:
                    self._guard(lambda: self._prune(conn))
                    self._next_prune = time.monotonic() + self.prune_interval
                for b in batch:
                    if isinstance(b, threading.Event):
                        b.set()
                if any(b is None for b in batch):
                    return
        finally:
            conn.close()

    def _guard(self, work: Callable[[], None], attempts: int = 3) -> bool:
        for attempt in range(attempts):
            try:
                work()
                return True
            except sqlite3.OperationalError as exc:  # locked past busy_timeout, disk full, ...
                log.warning("region history: %s (attempt %d of %d)", exc, attempt + 1, attempts)
                time.sleep(0.5 * (attempt + 1))
            except Exception:
                log.exception("region history: writing %s failed", self.path)
                return False
        return False

    def _insert(self, conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
        names = [n for n, _ in OWN_COLUMNS] + [n for n, _, _ in columns()]
        marks = ", ".join(f":{n}" for n in names)
        with conn:
            conn.executemany(f"INSERT INTO regions ({', '.join(names)}) VALUES ({marks})", rows)
            if self.per_user > 0:  # one user's flood of regions cannot grow the file without bound
                for user in {r.get("user") for r in rows}:
                    conn.execute(
                        "DELETE FROM regions WHERE user IS :user AND rowid NOT IN (SELECT rowid FROM regions "
                        "WHERE user IS :user ORDER BY released_at DESC LIMIT :keep)",
                        {"user": user, "keep": self.per_user},
                    )
        self.written += len(rows)

    def _prune(self, conn: sqlite3.Connection) -> None:
        if self.retention_days <= 0:
            return
        cutoff = time.time() - self.retention_days * 86400.0
        with conn:
            gone = conn.execute("DELETE FROM regions WHERE released_at < ?", (cutoff,)).rowcount
        if gone:
            log.info("region history: deleted %d regions older than %g days", gone, self.retention_days)

    # -- reading (an executor thread) -----------------------------------------------------------
    def _read(self, sql: str, args: dict[str, Any]) -> list[sqlite3.Row]:
        with self._read_lock:
            if self._reader is None:
                raise RuntimeError("the region history is not open")
            return self._reader.execute(sql, args).fetchall()

    def recent(
        self,
        limit: int = 50,
        user: str | None = None,
        since: float | None = None,
        uid: int | None = None,
        slurm_job: str | None = None,
    ) -> list[dict[str, Any]]:
        """The last ``limit`` finished regions (of ``user``, of ``uid``, of Slurm job ``slurm_job``,
        released since ``since``), newest last."""
        where = ["1"]
        if user:
            where.append("user = :user")
        if slurm_job:
            where.append("slurm_job = :slurm_job")
        if uid is not None:
            where.append("uid = :uid")
        if since is not None:
            where.append("released_at >= :since")
        rows = self._read(
            f"SELECT * FROM regions WHERE {' AND '.join(where)} ORDER BY released_at DESC, id DESC LIMIT :limit",
            {"user": user, "since": since, "uid": uid, "slurm_job": slurm_job, "limit": max(0, int(limit))},
        )
        return [_view(r) for r in reversed(rows)]

    def usage(
        self, since: float, until: float | None = None, by: str = "user", user: str | None = None
    ) -> list[dict[str, Any]]:
        """GPU-hours held in ``[since, until)`` grouped ``by`` one of :data:`USAGE_KEYS`: each
        region's hold (``granted_at`` to ``released_at``) counts for the part inside the window.
        Rows: the group's keys, ``gpu_hours``, ``hold_s``, ``regions``, most hours first."""
        keys = USAGE_KEYS.get(by)
        if keys is None:
            raise ValueError(f"usage by {by!r}: one of {', '.join(USAGE_KEYS)}")
        until = time.time() if until is None else until
        group = ", ".join(keys)
        held = "MAX(0.0, MIN(released_at, :until) - MAX(released_at - hold_s, :since))"
        rows = self._read(
            f"SELECT {group}, SUM({held}) AS hold_s, COUNT(*) AS regions FROM regions "
            "WHERE released_at >= :since AND released_at - hold_s < :until AND hold_s > 0"
            f"{' AND user = :user' if user else ''} GROUP BY {group} ORDER BY hold_s DESC, {group}",
            {"since": since, "until": until, "user": user},
        )
        return [{**dict(r), "hold_s": round(r["hold_s"], 3), "gpu_hours": r["hold_s"] / 3600.0} for r in rows]

    def count(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM regions", {})[0][0])

    def highest_region_number(self) -> int:
        """The largest N of the region ids ``rN`` recorded (0 for none): a new arbiter numbers its
        regions after it, so that ids stay unique across restarts."""
        rows = self._read("SELECT MAX(CAST(SUBSTR(region, 2) AS INTEGER)) FROM regions WHERE region GLOB 'r[0-9]*'", {})
        return int(rows[0][0] or 0)
