"""``krex slurm prolog|epilog``: what a Slurm node's prolog and epilog do for KREX (run as root by
slurmd; the scripts in ``extension/slurm/`` call them, see docs/cluster.md).

``prolog``: the node's arbiter must answer (it is asked for ``--wait`` seconds, which covers a
supervised restart). If it does, the job is recorded for the arbiter (``<runtime dir>/slurm-jobs/
<job>.json``: uid, user, account, GPUs; :mod:`krex_lab.arbiter.slurm_jobs` reads it when the
job's sessions register) and the prolog exits 0. If not, the job is refused: the node is drained
with a reason that says why (``scontrol update NodeName=... State=DRAIN Reason="krex: ..."``: Slurm
would otherwise drain it as a bare "Prolog error"), the job's AdminComment says the same, and the
prolog exits 1, after which Slurm requeues (and holds) the job, or fails it if it may not be requeued.

``epilog``: the job has ended (finished, cancelled, timed out). Its processes that are still KREX
sessions (escaped from the job's process tracking, or not yet reaped) are killed, so that the
arbiter ends what they held or queued as it does for any holder that dies (thaw, unlock, cores
back, next region granted); it then waits until the arbiter shows no session of the job, and
removes the job's record. It always exits 0: a failing epilog would drain the node for a job that
is already over.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import paths
from .errors import KrexError

if TYPE_CHECKING:
    from .node_status import SessionRow

#: Slurm keeps a node's reason short in its listings; ours says what and where first
REASON_MAX = 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stage", choices=("prolog", "epilog"), help="which script of slurmd's is running")
    parser.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="S",
        help="prolog: how long to ask the arbiter before refusing the job (default 10 s; a supervised "
        "arbiter restarts within that)",
    )
    parser.add_argument(
        "--scontrol", default="scontrol", metavar="PATH", help="the scontrol that drains the node (prolog)"
    )


def _log(text: str) -> None:
    print(f"krex slurm: {text}", file=sys.stderr, flush=True)


def _endpoint(runtime: Path) -> str:
    return os.environ.get(paths.ENDPOINT_ENV) or f"ipc://{runtime / 'arbiter.sock'}"


def _job_env() -> dict[str, str]:
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or ""
    if not job:
        raise KrexError("SLURM_JOB_ID is not set: run by slurmd as the node's Prolog or Epilog")
    return {
        "job": job,
        "uid": os.environ.get("SLURM_JOB_UID", ""),
        "user": os.environ.get("SLURM_JOB_USER", ""),
        "account": os.environ.get("SLURM_JOB_ACCOUNT", ""),
        "gpus": os.environ.get("SLURM_JOB_GPUS", ""),
        "node": os.environ.get("SLURMD_NODENAME", ""),
    }


def _arbiter_answers(endpoint: str, wait: float) -> str:
    """'' when the arbiter at ``endpoint`` answers within ``wait`` seconds, else why not."""
    from .connection import hello

    deadline = time.monotonic() + wait
    why = "no answer"
    while True:
        try:
            hello(endpoint, timeout=min(2.0, max(0.2, deadline - time.monotonic())))
            return ""
        except KrexError as exc:
            why = str(exc)
        if time.monotonic() >= deadline:
            return why
        time.sleep(0.25)


def _refuse(job: dict[str, str], endpoint: str, why: str, scontrol: str) -> int:
    why = why.split(". Start one")[0]  # the client's advice to a notebook user, not to an admin
    if endpoint not in why:
        why = f"no KREX arbiter answers at {endpoint} ({why})"
    reason = f"krex: {why}"[:REASON_MAX]
    _log(f"job {job['job']} refused: {reason}; node {job['node'] or '?'} drained with that reason")
    for argv in (
        [scontrol, "update", f"NodeName={job['node']}", "State=DRAIN", f"Reason={reason}"] if job["node"] else None,
        [scontrol, "update", f"JobId={job['job']}", f"AdminComment={reason}"],
    ):
        if argv is None:
            continue
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
            if done.returncode:
                _log(f"{' '.join(argv[:3])} failed: {done.stderr.strip() or done.returncode}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            _log(f"{' '.join(argv[:3])} failed: {exc}")
    return 1


def _write_record(runtime: Path, job: dict[str, str]) -> Path:
    from .arbiter.slurm_jobs import JOBS_DIR, record_path

    paths.prepare_runtime_dir(runtime / JOBS_DIR, multi_user=False)
    path = record_path(runtime, job["job"])
    record = {**job, "uid": int(job["uid"]) if job["uid"].isdigit() else None, "admitted_at": time.time()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = paths.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
    return path


def prolog(args: argparse.Namespace) -> int:
    job = _job_env()
    runtime = paths.runtime_dir(create=False)
    endpoint = _endpoint(runtime)
    why = _arbiter_answers(endpoint, args.wait)
    if why:
        return _refuse(job, endpoint, why, args.scontrol)
    _write_record(runtime, job)
    return 0


def _job_sessions(table: object, job: str) -> list[SessionRow]:
    """The sessions of Slurm job ``job`` in ``table`` (the arbiter's status answer)."""
    from .node_status import NodeStatus

    return [s for g in NodeStatus.of(table).gpus for s in g.sessions if (s.slurm_job or "") == job]


def _kill_tree(pid: int, uid: int | None) -> None:
    """SIGKILL ``pid`` and its descendants of the same user (never another user's process)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            if uid is None or p.uids().real == uid:
                p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def epilog(args: argparse.Namespace) -> int:
    from .connection import status

    job = _job_env()
    runtime = paths.runtime_dir(create=False)
    endpoint = _endpoint(runtime)
    uid = int(job["uid"]) if job["uid"].isdigit() else None
    try:
        try:
            left = _job_sessions(status(endpoint, timeout=5.0), job["job"])
        except KrexError as exc:  # the guardian or the next arbiter undoes what a dead one held
            _log(f"job {job['job']}: the arbiter does not answer ({exc}); nothing to end")
            return 0
        if left:
            _log(f"job {job['job']}: {len(left)} session(s) outlived the job: killed")
            for s in left:
                _kill_tree(s.pid, uid)
        deadline = time.monotonic() + 10.0
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                left = _job_sessions(status(endpoint, timeout=5.0), job["job"])
            except KrexError:
                break
        if left:
            _log(f"job {job['job']}: sessions still registered after 10 s: {[s.id for s in left]}")
    finally:
        from .arbiter.slurm_jobs import record_path

        try:
            record_path(runtime, job["job"]).unlink(missing_ok=True)
        except (OSError, ValueError) as exc:
            _log(f"job {job['job']}: its record was not removed: {exc}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return prolog(args) if args.stage == "prolog" else epilog(args)
    except KrexError as exc:
        _log(str(exc))
        return 1 if args.stage == "prolog" else 0
