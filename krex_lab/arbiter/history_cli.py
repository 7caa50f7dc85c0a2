"""``krex history``: finished regions from the arbiter's history database, or GPU-hours per user.

    krex history                          the last 50 regions (time, user, GPU, queue wait, hold, degraded)
    krex history --user alice --since 7d  alice's regions of the last 7 days
    krex history --usage                  GPU-hours held per user and per GPU since Monday 00:00
    krex history --usage --since 2026-11-01 --until 2026-12-01 --json
    krex history --slurm-job 4242         the regions of Slurm job 4242 (an arbiter run with --slurm)
    krex history --usage --by account     GPU-hours per Slurm account (--by job: per job, user, account)

Times (``--since``/``--until``): ISO dates or times (``2026-12-01``, ``2026-12-01T09:30``, local
unless they carry a zone), relative ``30m``, ``24h``, ``7d``, ``2w`` (that long ago), ``today``,
``yesterday``, ``this-week`` (Monday 00:00 local), ``last-week``, ``this-month``, or epoch seconds.

QUEUE-WAIT is the region's ``wait_s``: from the arbiter receiving the request to its grant. The
"waited" of a region's one-line report is the caller's own wait (``caller_wait_s``: connecting,
registering and attaching included), so it is the larger of the two.

With no arbiter answering, ``krex history`` reads the arbiter's database itself (said on stderr):
where the file's permissions let this user read it, all of it for its owner and root, else only
this user's own regions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sqlite3
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from .. import discovery, paths, protocol
from ..errors import ArbiterUnavailable, InvalidRequest, KrexError, exit_code, fail_as_json
from .history import ACCOUNT, GPU, USAGE_KEYS, USER, HistoryRow, Recent, RecentView, Usage, UsageRow, usage_of

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def _midnight(day: dt.date) -> float:
    return dt.datetime.combine(day, dt.time()).timestamp()  # local time


def week_start(now: float | None = None) -> float:
    """Monday 00:00 local time of the week of ``now``."""
    today = dt.datetime.fromtimestamp(time.time() if now is None else now).date()
    return _midnight(today - dt.timedelta(days=today.weekday()))


def parse_time(text: str, now: float | None = None) -> float:
    """Epoch seconds of ``text`` (see the module's docstring); ValueError saying what is accepted."""
    now = time.time() if now is None else now
    word = text.strip().lower()
    today = dt.datetime.fromtimestamp(now).date()
    named = {
        "now": lambda: now,
        "today": lambda: _midnight(today),
        "yesterday": lambda: _midnight(today - dt.timedelta(days=1)),
        "this-week": lambda: week_start(now),
        "last-week": lambda: week_start(now) - 7 * 86400.0,
        "this-month": lambda: _midnight(today.replace(day=1)),
    }
    if word in named:
        return float(named[word]())
    m = _RELATIVE.match(word)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(word)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()  # naive: local time
    except ValueError:
        raise ValueError(
            f"cannot read the time {text!r}: give an ISO date or time (2026-12-01, 2026-12-01T09:30), "
            "a relative one (30m, 24h, 7d, 2w), today, yesterday, this-week, last-week, this-month, "
            "or epoch seconds"
        ) from None


def _time_arg(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = parser.description or (
        "Finished regions from the arbiter's history database (kept across restarts), or with "
        "--usage the GPU-hours held per user and per GPU."
    )
    parser.add_argument(
        "--user",
        default="",
        help="only this user's regions (a user this machine does not know, with none recorded: exit 2)",
    )
    parser.add_argument(
        "--since",
        type=_time_arg,
        default=None,
        metavar="T",
        help="from T: 2026-12-01, 2026-12-01T09:30, 7d, 24h, today, this-week, ... "
        "(default: all kept; with --usage, this-week: Monday 00:00 local)",
    )
    parser.add_argument(
        "--until", type=_time_arg, default=None, metavar="T", help="with --usage: up to T (default: now)"
    )
    parser.add_argument("--limit", type=int, default=50, metavar="N", help="at most N regions, newest last (50)")
    parser.add_argument("--usage", action="store_true", help="GPU-hours held per user and per GPU since T")
    parser.add_argument(
        "--by",
        choices=tuple(k for k in USAGE_KEYS if "," not in k),  # user, gpu, job, account
        default="",
        help="with --usage: one table grouped by user, GPU, Slurm job (with its user and account) or "
        "Slurm account (jobs and accounts: an arbiter run with --slurm)",
    )
    parser.add_argument(
        "--slurm-job", default="", metavar="N", help="only the regions of Slurm job N (an arbiter run with --slurm)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--db",
        default="",
        metavar="FILE",
        help="the history database read when no arbiter answers (default: the arbiter's, next to its "
        f"socket or in the runtime dir, else {SYSTEM_DB})",
    )


def _clock(t: float | None) -> str:
    return "-" if t is None else dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(s: float | None) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    if s < 1.0:
        return f"{s * 1e3:.1f} ms"
    if s < 120.0:
        return f"{s:.2f} s"
    if s < 7200.0:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *rows])


def format_rows(rows: list[HistoryRow]) -> str:
    if not rows:
        return "no finished regions recorded"
    jobs = any(r.slurm_job for r in rows)  # an arbiter run with --slurm: which job, which account
    return _table(
        ["TIME", "USER", *(["JOB", "ACCOUNT"] if jobs else []), "GPU", "QUEUE-WAIT", "HOLD", "DEGRADED", "ENDED"],
        [
            [
                _clock(r.released_at or r.time),  # another user's row keeps only its time
                r.user or "?",
                *([r.slurm_job or "-", r.account or "-"] if jobs else []),
                str(r.gpu) if r.gpu >= 0 else "?",
                _seconds(r.wait_s),
                _seconds(r.hold_s),
                "DEGRADED" if r.degraded else "",
                "expired" if r.expired else r.released_by,
            ]
            for r in rows
        ],
    )


#: the columns of a ``--usage --by`` table: the group's keys
_BY_COLUMNS: dict[str, tuple[tuple[str, Callable[[UsageRow], object]], ...]] = {
    USER: (("USER", lambda g: g.user),),
    GPU: (("GPU", lambda g: g.gpu),),
    "job": (("JOB", lambda g: g.slurm_job), ("USER", lambda g: g.user), ("ACCOUNT", lambda g: g.account)),
    ACCOUNT: (("ACCOUNT", lambda g: g.account),),
}


def format_groups(usage: Usage) -> str:
    """``--usage --by``: one table of the chosen grouping (regions outside Slurm show as '-')."""
    head = f"GPU-hours held from {_clock(usage.since)} to {_clock(usage.until)}, by {usage.by}"
    groups = usage.groups or []
    if not groups:
        return f"{head}: none"
    keys = _BY_COLUMNS[usage.by or ""]
    table = _table(
        [*(title for title, _ in keys), "GPU-HOURS", "HELD", "REGIONS"],
        [
            [
                *("-" if key(g) in (None, "") else str(key(g)) for _, key in keys),
                f"{g.gpu_hours:.4f}",
                _seconds(g.hold_s),
                str(g.regions),
            ]
            for g in groups
        ],
    )
    return f"{head}\n\n{table}"


def format_usage(usage: Usage) -> str:
    if usage.by:
        return format_groups(usage)
    head = f"GPU-hours held from {_clock(usage.since)} to {_clock(usage.until)}"
    if not usage.users:
        return f"{head}: none"
    users = _table(
        ["USER", "GPU-HOURS", "HELD", "REGIONS"],
        [[str(u.user), f"{u.gpu_hours:.4f}", _seconds(u.hold_s), str(u.regions)] for u in usage.users],
    )
    gpus = _table(
        ["GPU", "GPU-HOURS", "HELD", "REGIONS"],
        [[str(g.gpu), f"{g.gpu_hours:.4f}", _seconds(g.hold_s), str(g.regions)] for g in usage.gpus],
    )
    total = sum(u.gpu_hours for u in usage.users)
    return f"{head}\n\n{users}\n\n{gpus}\n\ntotal {total:.4f} GPU-hours"


#: where a node's arbiter keeps its history when a systemd unit runs it (extension/systemd)
SYSTEM_DB = Path("/var/lib/krex/history.sqlite")


def _query(args: argparse.Namespace, since: float | None, endpoint: str) -> object:
    """The arbiter's answer, in its JSON form."""
    from ..connection import Connection

    conn = Connection(endpoint)
    try:
        request = protocol.History(
            limit=args.limit,
            user=args.user,
            since=since,
            until=args.until if args.usage else None,
            usage=args.usage,
            ticket=conn.ticket(),
            slurm_job=args.slurm_job,
            by=args.by,
        )
        result: object = conn.call(request)
    finally:
        conn.close()
    return result


def database_candidates(endpoint: str) -> list[Path]:
    """Where the history of the arbiter at ``endpoint`` may be: ``--db``, next to its socket, this
    user's runtime dir, the systemd unit's ``/var/lib/krex`` (the arbiter's default is its runtime dir)."""
    out = [Path(endpoint[len("ipc://") :]).parent / "history.sqlite"] if endpoint.startswith("ipc://") else []
    out += [paths.runtime_dir(create=False) / "history.sqlite", SYSTEM_DB]
    return list(dict.fromkeys(Path(os.path.abspath(p)) for p in out))


def read_database(args: argparse.Namespace, since: float | None, endpoint: str) -> Recent | Usage:
    """What the arbiter would answer, read from its database while none answers. Only where this
    user may read the file; one who is neither its owner nor root sees only their own regions (the
    arbiter shows others' reduced, and admins everything, which only the arbiter can decide)."""
    from .history import RegionHistory

    candidates = [Path(args.db)] if args.db else database_candidates(endpoint)
    db = next((p for p in candidates if os.path.lexists(p)), None)
    if db is None:
        raise KrexError(
            f"no KREX arbiter answers at {endpoint}, and there is no history database at "
            f"{' or '.join(map(str, candidates))} (--db FILE names another)"
        )
    owner, me = os.lstat(db).st_uid, os.geteuid()
    try:
        history = RegionHistory(db).open_readonly()
    except PermissionError:
        raise KrexError(
            f"no KREX arbiter answers at {endpoint}, and its history database {db} (uid {owner}'s, mode "
            f"{stat.S_IMODE(os.lstat(db).st_mode):04o}) is not readable by you (uid {me}): ask when the arbiter runs"
        ) from None
    except (OSError, sqlite3.Error, KrexError) as exc:
        raise KrexError(f"no KREX arbiter answers at {endpoint}, and reading {db} failed: {exc}") from None
    mine_only = me not in (0, owner)
    print(
        f"krex history: no KREX arbiter answers at {endpoint}: read its history database {db} directly"
        + (f", showing only your own regions (uid {me}; the file is uid {owner}'s)" if mine_only else ""),
        file=sys.stderr,
    )
    try:
        if not args.usage:
            mine = me if mine_only else None
            job = args.slurm_job or None
            return Recent(history.recent(max(0, args.limit), args.user or None, since, uid=mine, slurm_job=job))
        until = time.time() if args.until is None else args.until
        assert since is not None
        # totals: everyone's to see, as the arbiter shows them
        return usage_of(history, since, until, args.user or None, args.by or "")
    except sqlite3.Error as exc:
        raise KrexError(f"reading the region history {db} failed: {exc}") from None
    finally:
        history.close()


def _known(user: str) -> bool:
    """``user`` names an account of this machine (a deleted account's regions still show)."""
    import pwd

    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    since = args.since
    if args.by and not args.usage:
        raise InvalidRequest("--by groups --usage: give --usage too")
    if args.usage and since is None:
        since = week_start()
    endpoint = discovery.default_endpoint()  # the arbiter `krex status` finds, this user's lab's
    answer: Recent | Usage
    try:
        try:
            raw = _query(args, since, endpoint)
            # decoded once; --json prints what the arbiter answered as it is
            answer = (
                msgspec.convert(raw, Usage, strict=False) if args.usage else msgspec.convert(raw, Recent, strict=False)
            )
            shown = raw if args.usage else msgspec.convert(raw, RecentView).rows
        except ArbiterUnavailable:
            answer = read_database(args, since, endpoint)
            shown = msgspec.to_builtins(answer) if isinstance(answer, Usage) else [r.to_dict() for r in answer.rows]
        if args.user and not (answer.users if isinstance(answer, Usage) else answer.rows) and not _known(args.user):
            # a user this machine does not know: a typo, most likely, not a user without regions
            raise InvalidRequest(f"no user {args.user!r} is known on this machine, and no region of one is recorded")
    except KrexError as exc:
        if not args.json:
            raise
        return fail_as_json("krex history", exc)  # as `krex status --json`'s
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        print(format_usage(answer) if isinstance(answer, Usage) else format_rows(answer.rows))
    return 0


def main(argv: list[str] | None = None) -> None:
    """``python -m krex_lab.arbiter.history_cli`` (the same as ``krex history``)."""
    parser = argparse.ArgumentParser(prog="krex history")
    add_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sys.exit(run(args))
    except KrexError as exc:
        print(f"krex history: {exc}", file=sys.stderr)
        sys.exit(exit_code(exc))


if __name__ == "__main__":
    main()
