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
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .. import paths
from ..region_report import RegionReport
from .history_schema import (
    ACCOUNT,
    GPU,
    HOLD,
    MIGRATIONS,
    OWN_COLUMNS,
    REGION,
    RELEASED,
    SCHEMA_VERSION,
    SLURM_JOB,
    UID,
    USER,
    HistoryRow,
    SqlValue,
    columns,
    insert_columns,
    migrate,
    row_of,
    row_view,
)

__all__ = [
    "MIGRATIONS",
    "OWN_COLUMNS",
    "SCHEMA_VERSION",
    "USAGE_KEYS",
    "HistoryRow",
    "RegionHistory",
    "Usage",
    "UsageRow",
    "columns",
]

log = logging.getLogger("krex.history")

#: what ``usage`` can group by (a Slurm job has one user and one account: grouping by all three is by job)
USAGE_KEYS = {
    USER: (USER,),
    GPU: (GPU,),
    f"{USER},{GPU}": (USER, GPU),
    "job": (SLURM_JOB, USER, ACCOUNT),
    ACCOUNT: (ACCOUNT,),
}


class UsageRow(msgspec.Struct, kw_only=True):
    """GPU-hours of one group (a user, a GPU, a user on a GPU, a Slurm job, an account): the
    group's keys (None: regions outside Slurm, for a job or an account; the keys it is not grouped
    by are unset, and not encoded), and what it held."""

    user: str | msgspec.UnsetType | None = msgspec.UNSET
    gpu: int | msgspec.UnsetType | None = msgspec.UNSET
    slurm_job: str | msgspec.UnsetType | None = msgspec.UNSET
    account: str | msgspec.UnsetType | None = msgspec.UNSET
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
        batch_wait: float = 0.05,
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self.retention_days = retention_days
        #: tells regions of different arbiter runs apart (region ids start at r1 each run)
        self.arbiter = arbiter
        self.prune_interval = prune_interval
        self.busy_timeout = busy_timeout
        #: seconds the writer gathers rows for one transaction after the first
        self.batch_wait = batch_wait
        #: rows kept per user (the oldest beyond it are deleted as rows are added); 0: no cap
        self.per_user = per_user
        #: reports dropped because the writer's queue was full
        self.dropped = 0
        #: rows the writer failed to store (a database error after its retries)
        self.failed = 0
        #: rows written by this instance
        self.written = 0
        #: rows per user as the writer knows them (None: count them before the next cap): kept so
        #: that a region's insert deletes only what is past the cap, without scanning the user's
        #: rows (a scan of 10 000 rows a region was a fifth of the arbiter's CPU, scale.py)
        self._counts: dict[str | None, int] | None = None
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
        on disk (``immutable``), which is right when no arbiter is writing it. With no ``-wal``
        beside it (no writer has it open, and none died mid-write) it is read immutable first:
        a reader that opened it in WAL mode would leave ``-wal`` and ``-shm`` files behind."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise paths.UnsafePath(f"{self.path} is not a regular file")
        finally:
            os.close(fd)
        base = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
        uris = [base, f"{base}&immutable=1"]
        if not os.path.lexists(f"{self.path}-wal"):
            uris.reverse()
        for uri in uris:
            conn = None
            try:
                conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout, check_same_thread=False)
                conn.row_factory = sqlite3.Row
                conn.execute("SELECT COUNT(*) FROM regions").fetchone()
            except sqlite3.OperationalError:
                if conn is not None:
                    conn.close()
                if uri == uris[-1]:
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
                # One transaction for the rows of the next moment, not one per region: a commit
                # costs more than a row (hundreds of regions a second, scale.py). A flush or the
                # stop is not kept waiting (a History request flushes before it reads).
                until = time.monotonic() + self.batch_wait
                while len(batch) < 500 and isinstance(batch[-1], tuple):
                    left = until - time.monotonic()
                    try:
                        batch.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
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
        names = insert_columns()
        marks = ", ".join("?" for _ in names)
        try:
            with conn:
                conn.executemany(f"INSERT INTO regions ({', '.join(names)}) VALUES ({marks})", [r for _, r in rows])
                if self.per_user > 0:  # one user's flood of regions cannot grow the file without bound
                    self._cap(conn, [u for u, _ in rows])
        except BaseException:
            self._counts = None  # rolled back: count afresh
            raise
        self.written += len(rows)

    def _cap(self, conn: sqlite3.Connection, users: list[str]) -> None:
        """Delete each of ``users``' oldest rows beyond :attr:`per_user` (their rows just inserted
        are in the file, in this transaction)."""
        counts = self._counts
        if counts is None:  # after opening, a prune or a failure: one look at the index
            counts = self._counts = dict(conn.execute(f"SELECT {USER}, COUNT(*) FROM regions GROUP BY {USER}"))
        else:
            for user in users:
                counts[user] = counts.get(user, 0) + 1
        for user in set(users):
            excess = counts.get(user, 0) - self.per_user
            if excess > 0:
                conn.execute(
                    f"DELETE FROM regions WHERE rowid IN (SELECT rowid FROM regions WHERE {USER} IS ? "
                    f"ORDER BY {RELEASED} ASC LIMIT ?)",
                    (user, excess),
                )
                counts[user] = self.per_user

    def _prune(self, conn: sqlite3.Connection) -> None:
        self._counts = None  # rows may go, and another arbiter may share the file: count again
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
        return [row_view(r) for r in reversed(rows)]

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
