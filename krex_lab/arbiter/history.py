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


#: what ``usage`` can group by (a Slurm job has one user and one account: grouping by all three is by job)
USAGE_KEYS = {
    USER: (USER,),
    GPU: (GPU,),
    f"{USER},{GPU}": (USER, GPU),
    "job": (SLURM_JOB, USER, ACCOUNT),
    ACCOUNT: (ACCOUNT,),
}


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


class UsageRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """GPU-hours of one group (a user, a GPU, a user on a GPU, a Slurm job, an account): the
    group's keys (the others None, left out), and what it held."""

    user: str | None = None
    gpu: int | None = None
    slurm_job: str | None = None
    account: str | None = None
    gpu_hours: float = 0.0
    #: seconds held inside the window
    hold_s: float = 0.0
    regions: int = 0


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``history --usage``: the window, the totals by user, by GPU and by both, and the grouping
    asked for (``by``, one of :data:`USAGE_KEYS`)."""

    since: float
    until: float
    users: list[UsageRow]
    gpus: list[UsageRow]
    users_gpus: list[UsageRow]
    by: str | None = None
    groups: list[UsageRow] | None = None


class Recent(msgspec.Struct):
    """``history``: the last finished regions, newest last."""

    rows: list[HistoryRow]


class RecentView(msgspec.Struct):
    """``history``'s answer: each row a history row's JSON form, whole (the viewer's own, or
    everything for an admin) or its public fields (:func:`~.privacy.report_view`)."""

    rows: list[dict[str, Any]]


def outcome(report: RegionReport) -> str:
    """How a region ended (:attr:`RegionReport.outcome`)."""
    return report.outcome


#: a structured field's column text (on the event loop: msgspec's encoder, a few times json's speed)
_JSON = msgspec.json.Encoder(order="sorted")


def row_of(report: RegionReport, arbiter: str = "") -> tuple[SqlValue, ...]:
    """The row of one finished region's report (``Region.report`` plus its wall-clock times), in
    the order of :func:`_insert_columns`."""
    report = msgspec.structs.replace(report, released_at=report.released_at or time.time())
    if report.granted_at is None and report.granted:
        report.granted_at = (report.released_at or 0.0) - (report.hold_s or 0.0)
    own: tuple[SqlValue, ...] = (arbiter, report.outcome)
    return own + tuple(
        _JSON.encode(getattr(report, name)).decode() if as_json else getattr(report, name)
        for name, _, as_json in columns()
    )


def _insert_columns() -> list[str]:
    return [n for n, _ in OWN_COLUMNS] + [n for n, _, _ in columns()]


def _view(row: sqlite3.Row) -> HistoryRow:
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
        #: (user, row) to write, an event to set once what came before is written, None to stop
        self._queue: queue.Queue[tuple[str, tuple[SqlValue, ...]] | threading.Event | None] = queue.Queue(queue_size)
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
            self._queue.put_nowait((report.user, row_of(report, self.arbiter)))
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
                rows = [b for b in batch if isinstance(b, tuple)]
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

    def _insert(self, conn: sqlite3.Connection, rows: list[tuple[str, tuple[SqlValue, ...]]]) -> None:
        names = _insert_columns()
        marks = ", ".join("?" for _ in names)
        with conn:
            conn.executemany(f"INSERT INTO regions ({', '.join(names)}) VALUES ({marks})", [r for _, r in rows])
            if self.per_user > 0:  # one user's flood of regions cannot grow the file without bound
                for user in {u for u, _ in rows}:
                    conn.execute(
                        f"DELETE FROM regions WHERE {USER} IS ? AND rowid NOT IN (SELECT rowid FROM regions "
                        f"WHERE {USER} IS ? ORDER BY {RELEASED} DESC LIMIT ?)",
                        (user, user, self.per_user),
                    )
        self.written += len(rows)

    def _prune(self, conn: sqlite3.Connection) -> None:
        if self.retention_days <= 0:
            return
        cutoff = time.time() - self.retention_days * 86400.0
        with conn:
            gone = conn.execute(f"DELETE FROM regions WHERE {RELEASED} < ?", (cutoff,)).rowcount
        if gone:
            log.info("region history: deleted %d regions older than %g days", gone, self.retention_days)

    # -- reading (an executor thread) -----------------------------------------------------------
    def _read(self, sql: str, args: dict[str, SqlValue]) -> list[sqlite3.Row]:
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
    ) -> list[HistoryRow]:
        """The last ``limit`` finished regions (of ``user``, of ``uid``, of Slurm job ``slurm_job``,
        released since ``since``), newest last."""
        where = ["1"]
        args: dict[str, SqlValue] = {"limit": max(0, int(limit))}
        for column, value in ((USER, user or None), (SLURM_JOB, slurm_job or None), (UID, uid)):
            if value is not None:
                where.append(f"{column} = :{column}")
                args[column] = value
        if since is not None:
            where.append(f"{RELEASED} >= :since")
            args["since"] = since
        rows = self._read(
            f"SELECT * FROM regions WHERE {' AND '.join(where)} ORDER BY {RELEASED} DESC, id DESC LIMIT :limit", args
        )
        return [_view(r) for r in reversed(rows)]

    def usage(
        self, since: float, until: float | None = None, by: str = "user", user: str | None = None
    ) -> list[UsageRow]:
        """GPU-hours held in ``[since, until)`` grouped ``by`` one of :data:`USAGE_KEYS`: each
        region's hold (``granted_at`` to ``released_at``) counts for the part inside the window.
        Rows: the group's keys, ``gpu_hours``, ``hold_s``, ``regions``, most hours first."""
        keys = USAGE_KEYS.get(by)
        if keys is None:
            raise ValueError(f"usage by {by!r}: one of {', '.join(USAGE_KEYS)}")
        until = time.time() if until is None else until
        group = ", ".join(keys)
        released, hold = RELEASED, HOLD
        held = f"MAX(0.0, MIN({released}, :until) - MAX({released} - {hold}, :since))"
        rows = self._read(
            f"SELECT {group}, SUM({held}) AS held, COUNT(*) AS regions FROM regions "
            f"WHERE {released} >= :since AND {released} - {hold} < :until AND {hold} > 0"
            f"{f' AND {USER} = :who' if user else ''} GROUP BY {group} ORDER BY held DESC, {group}",
            {"since": since, "until": until, "who": user},
        )
        out = []
        for r in rows:
            row = msgspec.convert({k: r[k] for k in keys}, UsageRow)
            row.hold_s, row.gpu_hours, row.regions = round(r["held"], 3), r["held"] / 3600.0, r["regions"]
            out.append(row)
        return out

    def count(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM regions", {})[0][0])

    def highest_region_number(self) -> int:
        """The largest N of the region ids ``rN`` recorded (0 for none): a new arbiter numbers its
        regions after it, so that ids stay unique across restarts."""
        rows = self._read(
            f"SELECT MAX(CAST(SUBSTR({REGION}, 2) AS INTEGER)) FROM regions WHERE {REGION} GLOB 'r[0-9]*'", {}
        )
        return int(rows[0][0] or 0)


def usage_of(db: RegionHistory, since: float, until: float, user: str | None, by: str = "") -> Usage:
    """The usage answer: totals by user, by GPU and by both, and by ``by`` where asked."""
    usage = Usage(
        since=since,
        until=until,
        users=db.usage(since, until, USER, user),
        gpus=db.usage(since, until, GPU, user),
        users_gpus=db.usage(since, until, f"{USER},{GPU}", user),
    )
    if by:
        usage.by, usage.groups = by, db.usage(since, until, by, user)
    return usage
