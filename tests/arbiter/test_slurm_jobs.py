"""The Slurm job of a session (``Arbiter.slurm``), without Slurm: the prolog's records, the claims a
process makes in its environment, the history's job and account columns, and ``krex history``'s
``--slurm-job`` and ``--usage --by job|account``. tests/test_slurm.py runs the same under a real Slurm."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.arbiter.history import OWN_COLUMNS, RegionHistory, columns
from krex_lab.arbiter.slurm_jobs import JOBS_DIR, SlurmJobs
from krex_lab.node_status import SlurmJob
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.region_report import RegionReport


def _record(runtime: Path, job: str, uid: int, account: str = "physics") -> Path:
    jobs = runtime / JOBS_DIR
    jobs.mkdir(mode=0o700, exist_ok=True)
    path = jobs / f"{job}.json"
    path.write_text(json.dumps({"job": job, "uid": uid, "user": "someone", "account": account}))
    path.chmod(0o600)
    return path


@pytest.fixture
def in_job() -> Iterator[subprocess.Popen[bytes]]:
    """A process that Slurm's environment says runs in job 77, step 0."""
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def test_a_claim_counts_only_with_the_prologs_record_of_that_user(
    tmp_path: Path, in_job: subprocess.Popen[bytes]
) -> None:
    jobs = SlurmJobs(tmp_path)
    me = os.getuid()
    wait_for(lambda: jobs.claimed(in_job.pid) == ("77", "0"))
    assert jobs.job_of(in_job.pid, me) == SlurmJob()  # no record: the prolog did not admit job 77
    record = _record(tmp_path, "77", me + 1)
    assert jobs.job_of(in_job.pid, me) == SlurmJob()  # another user's job
    record.unlink()
    _record(tmp_path, "77", me)
    assert jobs.job_of(in_job.pid, me) == SlurmJob(slurm_job="77", slurm_step="0", account="physics")
    assert jobs.job_of(os.getpid(), me) == SlurmJob()  # no record of whatever this process claims
    # a record that is a link (someone's planted file) is not read
    (tmp_path / JOBS_DIR / "77.json").rename(tmp_path / "elsewhere.json")
    (tmp_path / JOBS_DIR / "77.json").symlink_to(tmp_path / "elsewhere.json")
    assert jobs.job_of(in_job.pid, me) == SlurmJob()


def test_a_batch_script_is_the_batch_step_and_bad_ids_are_no_job(tmp_path: Path) -> None:
    jobs = SlurmJobs(tmp_path)
    for job in ("4242", "../../etc/passwd"):
        proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "SLURM_JOB_ID": job})
        try:
            wait_for(lambda p=proc: jobs.claimed(p.pid) is not None)
            assert jobs.claimed(proc.pid) == (job, "batch")  # no SLURM_STEP_ID: the batch script
            assert jobs.record(job) is None  # none for 4242; "../../etc/passwd" refused before any path is made
        finally:
            proc.kill()
            proc.wait()


def _report(region: str, gpu: int, job: str | None, account: str | None, hold: float, end: float) -> RegionReport:
    return RegionReport(
        region=region,
        gpu=gpu,
        user="alice" if account == "physics" else "bob",
        uid=1000,
        state="released",
        acquire_s=0.01,
        granted_at=end - hold,
        released_at=end,
        hold_s=hold,
        slurm_job=job,
        slurm_step="batch" if job else None,
        account=account,
    )


def test_history_by_job_and_account_and_an_older_database_gains_the_columns(tmp_path: Path) -> None:
    db = tmp_path / "h" / "history.sqlite"
    db.parent.mkdir(mode=0o700)
    slurm = ("slurm_job", "slurm_step", "account")
    old = [f"{n} {k}" for n, k in OWN_COLUMNS] + [f"{n} {k}" for n, k, _ in columns() if n not in slurm]
    conn = sqlite3.connect(db)  # a database written before the Slurm fields existed (same schema version)
    conn.execute(f"CREATE TABLE regions (id INTEGER PRIMARY KEY, {', '.join(old)})")
    conn.execute(
        "INSERT INTO regions (region, released_at, hold_s, user, gpu, state) VALUES ('r0', ?, 5.0, 'carol', 0, "
        "'released')",
        (time.time(),),
    )
    conn.execute("PRAGMA user_version=2")
    conn.commit()
    conn.close()
    db.chmod(0o600)
    h = RegionHistory(db).open()
    try:
        now = time.time()
        for i, (job, account, hold) in enumerate([("11", "physics", 2.0), ("11", "physics", 1.0), ("12", "chem", 4.0)]):
            h.add(_report(f"r{i + 1}", i % 2, job, account, hold, now - 10 + i))
        assert h.flush()
        assert [r.region for r in h.recent(slurm_job="11")] == ["r1", "r2"]
        assert next(r for r in h.recent() if r.region == "r0").slurm_job is None  # the old row: no job
        jobs = {g.slurm_job: g for g in h.usage(now - 3600, by="job")}
        assert (jobs["11"].hold_s, jobs["11"].regions, jobs["11"].account) == (3.0, 2, "physics")
        assert jobs["12"].hold_s == 4.0 and jobs[None].hold_s == 5.0  # regions outside Slurm: one group
        accounts = {g.account: g.hold_s for g in h.usage(now - 3600, by="account")}
        assert accounts == {"physics": 3.0, "chem": 4.0, None: 5.0}
    finally:
        h.close()


def test_krex_history_by_job_offline_and_by_without_usage(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    h = RegionHistory(runtime / "history.sqlite").open()
    h.add(_report("r1", 0, "11", "physics", 2.0, time.time() - 5))
    h.add(_report("r2", 1, "12", "chem", 4.0, time.time() - 4))
    h.close()
    env = {**os.environ, "KREX_RUNTIME_DIR": str(runtime), "KREX_ENDPOINT": f"ipc://{runtime / 'arbiter.sock'}"}

    def krex(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "krex_lab.cli", "history", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    rows = json.loads(krex("--slurm-job", "12", "--json").stdout)
    assert [(r["region"], r["account"]) for r in rows] == [("r2", "chem")]
    table = krex("--usage", "--by", "job", "--since", "1h").stdout
    assert table.split("\n")[2:4] == [
        "JOB  USER   ACCOUNT  GPU-HOURS  HELD    REGIONS",
        "12   bob    chem     0.0011     4.00 s  1",
    ], table
    refused = krex("--by", "job")
    assert refused.returncode == 2 and "--by groups --usage" in refused.stderr


def test_an_arbiter_with_slurm_names_the_job_in_status_and_reports(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    arb = ArbiterProc(runtime, extra=("--slurm",)).start()
    try:
        _record(runtime, "77", os.getuid(), account="chem")
        env = {**arb.env(), "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "KREX_GPU": "1"}
        out = subprocess.run(
            [sys.executable, "-m", "krex_lab.cli", "exclusive", "--", "sleep", "0.2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        rows = json.loads(
            subprocess.run(
                [sys.executable, "-m", "krex_lab.cli", "history", "--slurm-job", "77", "--json"],
                env=arb.env(),
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        )
        assert [(r["slurm_job"], r["slurm_step"], r["account"], r["gpu"]) for r in rows] == [("77", "3", "chem", 1)]
    finally:
        arb.stop()
