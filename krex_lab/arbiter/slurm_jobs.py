"""Which Slurm job a session belongs to (``Arbiter.slurm``): its job, step, user and account.

The node's Slurm prolog (``krex slurm prolog``, root) writes one record per job it admits into
``<runtime dir>/slurm-jobs/<job id>.json`` (the job's uid, user and account, as slurmd gave them
to the prolog); the epilog removes it. When a session registers, the arbiter reads the job its
process claims (``SLURM_JOB_ID``/``SLURM_STEP_ID`` in the process's initial environment, which
the kernel keeps in ``/proc/<pid>/environ``; a ``job_<N>/step_<S>`` cgroup, where Slurm's
cgroup process tracking put it, wins over the environment) and believes it only if the prolog's
record of that job names the session's own uid: a user can name no one else's job, and the
user and account come from the record, never from the process. A claim without a matching
record is logged and the session is recorded without a job.

The records live in files, not in the arbiter's memory, so that they outlive an arbiter restart
(``krex supervise``) in the middle of a job.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import msgspec

from .. import paths
from ..node_status import SlurmJob

log = logging.getLogger("krex.slurm")

#: the directory of the prolog's job records, inside the arbiter's runtime dir
JOBS_DIR = "slurm-jobs"


class JobRecord(msgspec.Struct):
    """What the prolog records of a job it admitted: whose it is and its account."""

    uid: int | None = None
    account: str | None = None


_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,8})?$")  # 1234 or an array task's 1234_7
_CGROUP = re.compile(r"/job_([0-9]{1,12})/step_([A-Za-z0-9_.-]{1,32})")


def record_path(runtime_dir: Path, job: str) -> Path:
    if not _JOB_ID.match(job):
        raise ValueError(f"not a Slurm job id: {job!r}")
    return runtime_dir / JOBS_DIR / f"{job}.json"


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"SLURM_"):
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _cgroup_step(pid: int) -> tuple[str, str] | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None
    m = _CGROUP.search(text)
    return (m.group(1), m.group(2)) if m else None


class SlurmJobs:
    """The prolog's job records under ``runtime_dir``, and the job of a registering session."""

    def __init__(self, runtime_dir: Path) -> None:
        self.root = runtime_dir

    def claimed(self, pid: int) -> tuple[str, str] | None:
        """(job, step) that process ``pid`` runs in as far as Slurm told it, or None: a batch
        script has no SLURM_STEP_ID and is the job's ``batch`` step."""
        step = _cgroup_step(pid)
        if step is not None:
            return step
        env = _environ(pid)
        job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        if not job:
            return None
        return job, env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "batch"

    def record(self, job: str) -> JobRecord | None:
        """The prolog's record of ``job`` (None: none, one that is not root's own file, or not a record)."""
        try:
            fd = paths.open_private(record_path(self.root, job), os.O_RDONLY)
        except (ValueError, OSError, paths.UnsafePath):
            return None
        with os.fdopen(fd, "rb") as f:
            try:
                return msgspec.json.decode(f.read(65536), type=JobRecord)
            except msgspec.DecodeError:  # not JSON, or not a record (a ValidationError is one)
                return None

    def job_of(self, pid: int, uid: int) -> SlurmJob:
        """The Slurm job of a session of ``uid`` whose process is ``pid`` (every field None: none)."""
        claim = self.claimed(pid)
        if claim is None:
            return SlurmJob()
        job, step = claim
        rec = self.record(job)
        if rec is None or rec.uid != uid:
            log.warning(
                "process %d (uid %d) says it runs in Slurm job %s, which the prolog did not admit for "
                "that uid: recorded without a job",
                pid,
                uid,
                job,
            )
            return SlurmJob()
        return SlurmJob(slurm_job=job, slurm_step=step, account=rec.account or "")
