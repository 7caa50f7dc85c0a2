"""KREX under a real Slurm: ``munged``, ``slurmctld`` and ``slurmd`` started here (tests/slurm/cluster.py),
configured by ``extension/slurm/`` (shard GRES, prolog, epilog, task prolog), one node with 2 simulated
GPUs whose KREX arbiter (``--multi-user --slurm``, fake backend, under ``krex supervise``) the test starts,
and jobs submitted with ``sbatch`` by two real users (``useradd``).

Checked: jobs share each GPU and their ``krex exclusive`` regions take turns on it (from the history
database: no two regions on one GPU overlap); the job, step, user and account of every region
(``krex history --slurm-job``, ``--usage --by job|account``); ``scancel`` mid-region and a job killed at
its time limit (nothing of the test's users left stopped, the killed job's sessions gone, the next
job's region granted, within 2 s; the daemons' CPU affinities back afterwards); ``slurmd`` restarted
while a region is held; the arbiter down at the prolog (the job refused, the node drained with a
reason that says why, both back once the arbiter is).

Needs root and Debian's Slurm (``.ci/run`` installs it and reruns this file as root where ``make
test`` is not). ``KREX_SLURM_RESULTS=FILE`` writes the figures measured (a ``squeue``/``krex status``
pair captured mid-test, the fault timings) to FILE as JSON.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab.node_status import format_table
from tests.hubsupport.venv import VenvUnavailable, build_venv
from tests.security.users import User, make_user
from tests.slurm.cluster import REPO, Cluster, missing, stopped_processes, wait_until

pytestmark = pytest.mark.timeout(600)

#: the figures measured, written to $KREX_SLURM_RESULTS at the end
FIGURES: dict[str, Any] = {}
VENV_CACHE = Path("/opt/krex-slurm-test")
#: a region held until the job is ended (the command ignores nothing: SIGTERM ends it)
HOLD_LONG = "krex exclusive --max-hold 300 -- sleep 300\n"
SHORT = "krex exclusive --max-hold 30 -- sleep 1\necho rc=$?\n"


@dataclass
class Node:
    cluster: Cluster
    alice: User
    bob: User

    @property
    def uids(self) -> set[int]:
        return {self.alice.uid, self.bob.uid}


def _kill_users(uids: set[int]) -> None:
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real in uids:
                p.send_signal(signal.SIGCONT)
                p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    why = missing()
    if why:
        pytest.skip(why)
    try:
        venv = build_venv(REPO, [str(REPO)], VENV_CACHE)  # the jobs' krex: a Python the users may run
    except VenvUnavailable as exc:
        pytest.skip(f"no virtualenv the test users can run (pip's index did not answer?): {exc}")
    with make_user("ksalice") as alice, make_user("ksbob") as bob:
        cluster = Cluster(venv)
        try:
            cluster.start()
            version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=False)
            FIGURES["setup"] = {
                "slurm": version.stdout.strip(),
                "cpus": os.cpu_count(),
                "backend": "fake, 2 simulated GPUs, shards: 2 jobs per GPU",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            yield Node(cluster, alice, bob)
        finally:
            cluster.close()
            _kill_users({alice.uid, bob.uid})
            out = os.environ.get("KREX_SLURM_RESULTS")
            if out and FIGURES:
                Path(out).write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


def _holder(node: Node, job: str) -> dict[str, Any] | None:
    for g in node.cluster.status()["gpus"]:
        if g["holder"] and g["holder"].get("slurm_job") == job and g["holder"]["state"] == "held":
            return {**g["holder"], "gpu": g["index"]}
    return None


def _queued(node: Node, job: str) -> int | None:
    for g in node.cluster.status()["gpus"]:
        if any(q.get("slurm_job") == job for q in g["queue"]):
            return int(g["index"])
    return None


def _job_sessions(node: Node, job: str) -> list[dict[str, Any]]:
    return [s for g in node.cluster.status()["gpus"] for s in g["sessions"] if s.get("slurm_job") == job]


def _wait_held(node: Node, job: str, timeout: float = 60) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def held() -> bool:
        found.update(_holder(node, job) or {})
        return bool(found)

    wait_until(held, timeout, f"job {job}'s region held", interval=0.05)
    return found


def _affinities_back(sessions: dict[str, int], timeout: float = 3.0) -> None:
    """``sessions`` (name: pid) have every CPU again. On a shared machine another arbiter's region
    (its shield moves every process of the node) may keep them narrowed a while: then only said."""
    from krex_lab.enforcement.corelock import NodeCoreLock

    everything = set(range(os.cpu_count() or 1))

    def back() -> bool:
        return all(os.sched_getaffinity(pid) == everything for pid in sessions.values())

    try:
        wait_until(back, timeout, f"CPU affinities of {sessions} back to {everything}", interval=0.05)
    except AssertionError:
        probe = NodeCoreLock()
        try:
            if "another KREX arbiter" not in probe.acquire():
                raise
        finally:
            probe.close()
        print(f"another arbiter's region holds cores: affinities of {sessions} not checked")


def _wait_exit(pid: int, timeout: float) -> None:
    """Until process ``pid`` has exited, told by a pidfd the moment it does (root may open any)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still runs after {timeout} s"
    finally:
        os.close(fd)


def _after_kill(node: Node, victim: str, nxt: str, gpu: int, t0: float) -> dict[str, float]:
    """From ``t0`` (monotonic), poll every 10 ms until the next job's region is granted on ``gpu``,
    the victim's sessions are gone and nothing of the test's users is stopped; when each happened."""
    seen: dict[str, float] = {}
    deadline = t0 + 30
    while time.monotonic() < deadline and len(seen) < 4:
        table = node.cluster.status()
        now = time.monotonic() - t0
        g = table["gpus"][gpu]
        holder = g["holder"]
        if "released" not in seen and (holder is None or holder.get("slurm_job") != victim):
            seen["released"] = now
        if "granted_next" not in seen and holder and holder.get("slurm_job") == nxt and holder["state"] == "held":
            seen["granted_next"] = now
        if "sessions_gone" not in seen and not any(
            s.get("slurm_job") == victim for x in table["gpus"] for s in x["sessions"]
        ):
            seen["sessions_gone"] = now
        if "granted_next" in seen and "nothing_stopped" not in seen and not stopped_processes(node.uids):
            seen["nothing_stopped"] = time.monotonic() - t0
        time.sleep(0.01)
    return {k: round(v, 3) for k, v in seen.items()}


def test_jobs_take_turns_on_each_gpu(node: Node) -> None:
    c = node.cluster
    script = "krex exclusive --max-hold 30 -- sleep 1.5\nkrex exclusive --max-hold 30 -- sleep 1.5\n"
    who = [(node.alice, "physics"), (node.bob, "chem"), (node.alice, "physics"), (node.bob, "chem")]
    jobs = [c.sbatch(u, script, "-A", account) for u, account in who]

    # The pair: `squeue` and the node table (`krex status`'s text, from one Status request) at one moment.
    pair: dict[str, str] = {}

    def busy() -> bool:  # a region held on a GPU while another job waits for it
        table = c.status()
        if not any(g["holder"] and g["queue"] for g in table["gpus"]):
            return False
        pair.update(squeue=c.squeue(), krex_status=format_table(table))
        return True

    wait_until(busy, 90, "a GPU held with a job waiting", interval=0.05)
    FIGURES["mid_test"] = pair
    print(f"\n$ squeue\n{pair['squeue']}\n$ krex status\n{pair['krex_status']}")
    assert "slurm job" in pair["krex_status"] and jobs[0] in pair["squeue"]

    c.wait_jobs(jobs, 180)
    rows = [r for r in c.history_rows() if r["slurm_job"] in jobs]
    by_job = {j: [r for r in rows if r["slurm_job"] == j] for j in jobs}
    for (user, account), j in zip(who, jobs):
        assert len(by_job[j]) == 2, f"job {j}: {by_job[j]}\n{c.output(j)}"
        for r in by_job[j]:
            assert (r["user"], r["uid"], r["account"], r["slurm_step"]) == (user.name, user.uid, account, "batch")
            assert r["outcome"] == "completed" and r["hold_s"] >= 1.4
        assert c.output(j).count("; held") == 2, c.output(j)
    # The shards put two jobs on each GPU, and each job's regions on the GPU Slurm gave it.
    gpus = {g: {r["slurm_job"] for r in rows if r["gpu"] == g} for g in (0, 1)}
    assert all(len(js) == 2 for js in gpus.values()), gpus
    for g in (0, 1):  # on one GPU, one region at a time: each granted after the one before it ended
        on_gpu = sorted((r for r in rows if r["gpu"] == g), key=lambda r: r["granted_at"])
        for before, after in itertools.pairwise(on_gpu):
            assert after["granted_at"] >= before["released_at"], (before, after)
        assert len({r["slurm_job"] for r in on_gpu[:2]}) <= 2

    # Who used the GPUs, and how long: by job, and by account.
    out = c.krex("history", "--slurm-job", jobs[0], "--json")
    assert out.returncode == 0, out.stderr
    assert sorted(r["region"] for r in json.loads(out.stdout)) == sorted(r["region"] for r in by_job[jobs[0]])
    usage = json.loads(c.krex("history", "--usage", "--by", "job", "--since", "1h", "--json").stdout)
    groups = {g["slurm_job"]: g for g in usage["groups"]}
    for (user, account), j in zip(who, jobs):
        assert (groups[j]["user"], groups[j]["account"], groups[j]["regions"]) == (user.name, account, 2)
        assert groups[j]["hold_s"] == pytest.approx(sum(r["hold_s"] for r in by_job[j]), abs=0.01)
    accounts = json.loads(c.krex("history", "--usage", "--by", "account", "--since", "1h", "--json").stdout)
    held = {g["account"]: g["hold_s"] for g in accounts["groups"]}
    for account in ("physics", "chem"):
        mine = [r["hold_s"] for r in rows if r["account"] == account]
        assert held[account] == pytest.approx(sum(mine), abs=0.01)
    table = c.krex("history", "--usage", "--by", "job", "--since", "1h").stdout
    print(f"\n$ krex history --usage --by job\n{table}")
    FIGURES["usage_by_job"] = table
    assert not stopped_processes(node.uids)


def _bystander(node: Node) -> tuple[str, int]:
    """A job on the other GPU whose process is a KREX session outside any region: each region moves
    it off the reserved cores and must give them back. Its job id and its session's pid."""
    c = node.cluster
    code = "import time, krex_lab.client as c; c.attach(name='bystander'); time.sleep(300)"
    job = c.sbatch(node.bob, f'python3 -c "{code}"\n', "-A", "chem")
    found: list[int] = []

    def registered() -> bool:
        found[:] = [s["pid"] for s in _job_sessions(node, job)]
        return bool(found)

    wait_until(registered, 60, f"the bystander job {job}'s session")
    return job, found[0]


def test_scancel_mid_region(node: Node) -> None:
    c = node.cluster
    victim = c.sbatch(node.alice, HOLD_LONG, "-A", "physics")
    held = _wait_held(node, victim)
    # The next job's region outlasts the 2 s: a process of the cancelled job that it froze on its way
    # out (a session left registered after its region) would still be stopped at the end of them.
    nxt = c.sbatch(node.bob, "krex exclusive --max-hold 30 -- sleep 3\necho rc=$?\n", "-A", "chem")
    wait_until(lambda: _queued(node, nxt) is not None, 60, f"job {nxt} queued", interval=0.05)
    assert _queued(node, nxt) == held["gpu"], "Slurm put the second job on the other GPU"
    bystander, pid = _bystander(node)
    t0 = time.monotonic()
    subprocess.run(["scancel", victim], env=c.env, check=True, timeout=30)
    seen = _after_kill(node, victim, nxt, held["gpu"], t0)
    FIGURES["scancel"] = {"seconds_after_scancel": seen}
    print(f"\nscancel {victim} mid-region: {seen} s after scancel")
    assert set(seen) == {"released", "granted_next", "sessions_gone", "nothing_stopped"}, seen
    assert max(seen.values()) < 2.0, seen
    if (os.cpu_count() or 1) > 1:  # the next region keeps the bystander off its reserved core, as the first did
        wait_until(lambda: os.sched_getaffinity(pid) != set(range(os.cpu_count() or 1)), 2, "the bystander moved")
    c.wait_jobs([victim, nxt], 60)
    assert "rc=0" in c.output(nxt)
    assert c.job(victim)["JobState"] == "CANCELLED"
    _affinities_back({"bystander": pid})
    subprocess.run(["scancel", bystander], env=c.env, check=True, timeout=30)
    c.wait_jobs([bystander], 60)
    rows = c.history_rows()
    row = next(r for r in rows if r["region"] == held["region"] and r["slurm_job"] == victim)
    assert row["outcome"] == "completed" and row["hold_s"] > 0
    # The cancelled job's krex exclusive left with its region: the next region did not freeze it.
    after = next(r for r in rows if r["slurm_job"] == nxt)
    assert held["pid"] not in json.loads(after["frozen"]), after


def test_time_limit_kills_a_job_mid_region(node: Node) -> None:
    """The region's command ignores SIGTERM: Slurm's time limit ends in SIGKILL (KillWait later),
    the holder dies without releasing, and the arbiter ends its region on the pidfd."""
    c = node.cluster
    stubborn = "python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(900)'"
    victim = c.sbatch(node.alice, f"krex exclusive --max-hold 300 -- {stubborn}\n", "-t", "1", "-A", "physics")
    held = _wait_held(node, victim)
    started = time.monotonic()
    nxt = c.sbatch(node.bob, SHORT, "-A", "chem")
    wait_until(lambda: _queued(node, nxt) is not None, 60, f"job {nxt} queued", interval=0.05)
    assert _queued(node, nxt) == held["gpu"], "Slurm put the second job on the other GPU"
    _wait_exit(held["pid"], timeout=200)  # the time limit (1 min) plus Slurm's checks (every 30 s)
    t0 = time.monotonic()
    seen = _after_kill(node, victim, nxt, held["gpu"], t0)
    FIGURES["time_limit"] = {
        "holder_killed_after_s": round(t0 - started, 1),
        "seconds_after_holder_death": seen,
    }
    print(f"\njob {victim} killed at its time limit: {seen} s after its holder died")
    assert set(seen) == {"released", "granted_next", "sessions_gone", "nothing_stopped"}, seen
    assert max(seen.values()) < 2.0, seen
    c.wait_jobs([victim, nxt], 60)
    assert c.job(victim)["JobState"] == "TIMEOUT"
    assert "rc=0" in c.output(nxt)
    row = next(r for r in c.history_rows() if r["region"] == held["region"] and r["slurm_job"] == victim)
    assert row["released_by"] == "holder process exited", row


def test_the_epilog_ends_what_an_escaped_session_holds(node: Node) -> None:
    """A region held by a process that left the job's process tree (setsid, reparented: Slurm's
    process tracking here follows parents) outlives the job: the epilog kills the job's remaining
    sessions, and the arbiter releases the region and grants the next job's."""
    c = node.cluster
    # The batch script ends when the test says (a file <job>.go in its directory), its holder runs on.
    script = (
        "setsid krex exclusive --max-hold 300 -- sleep 600 </dev/null >/dev/null 2>&1 &\n"
        'while [ ! -e "$SLURM_JOB_ID.go" ]; do sleep 0.1; done\n'
    )
    job = c.sbatch(node.alice, script, "-A", "physics")
    held = _wait_held(node, job)
    nxt = c.sbatch(node.bob, SHORT, "-A", "chem")
    wait_until(lambda: _queued(node, nxt) is not None, 60, f"job {nxt} queued", interval=0.05)
    assert _queued(node, nxt) == held["gpu"], "Slurm put the second job on the other GPU"
    t0 = time.monotonic()
    (c.root / "jobs" / f"{job}.go").touch()  # the batch script ends; its escaped holder does not
    seen = _after_kill(node, job, nxt, held["gpu"], t0)
    FIGURES["epilog"] = {"seconds_after_the_batch_script_ended": seen}
    print(f"\njob {job}'s escaped holder, ended by the epilog: {seen} s after its batch script ended")
    assert set(seen) == {"released", "granted_next", "sessions_gone", "nothing_stopped"}, seen
    assert max(seen.values()) < 10.0, seen  # slurmstepd, then the epilog (a Python start) kills it
    assert not psutil.pid_exists(held["pid"]) or psutil.Process(held["pid"]).status() == psutil.STATUS_ZOMBIE
    c.wait_jobs([nxt], 60)
    assert "rc=0" in c.output(nxt)
    row = next(r for r in c.history_rows() if r["region"] == held["region"] and r["slurm_job"] == job)
    assert row["released_by"] == "holder process exited", row


def test_slurmd_restarted_while_a_region_is_held(node: Node) -> None:
    c = node.cluster
    job = c.sbatch(node.alice, "krex exclusive --max-hold 60 -- sleep 8\necho rc=$?\n", "-A", "physics")
    held = _wait_held(node, job)
    t0 = time.monotonic()
    c.stop("slurmd")
    down = time.monotonic()
    time.sleep(1.0)  # the node without its slurmd for a second: the job and its region run on
    while_down = _holder(node, job)
    assert while_down is not None and while_down["region"] == held["region"]
    up = time.monotonic()
    c.start_slurmd()
    back = time.monotonic()
    still = _holder(node, job)
    assert still is not None and still["region"] == held["region"], "the region did not survive slurmd's restart"
    FIGURES["slurmd_restart"] = {"stop_s": round(down - t0, 3), "start_s": round(back - up, 3)}
    c.wait_jobs([job], 60)
    info = c.job(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), info
    assert "rc=0" in c.output(job)
    row = next(r for r in c.history_rows() if r["region"] == held["region"] and r["slurm_job"] == job)
    assert (row["released_by"], row["outcome"]) == ("released by holder", "completed") and row["hold_s"] >= 7.9
    assert c.node_state().split("+")[0] in ("IDLE", "MIXED"), c.node_state()


def test_arbiter_down_at_the_prolog(node: Node) -> None:
    """The arbiter's last test: it is stopped, a job is refused with a clear reason and the node
    drained saying why; once the arbiter is back and the node resumed, the job runs."""
    c = node.cluster
    c.stop("arbiter")
    assert not c.arbiter_answers()
    t0 = time.monotonic()
    job = c.sbatch(node.alice, SHORT, "-A", "physics")

    def refused() -> bool:  # the prolog failed, the epilog ran: the job requeued and held
        info = c.job(job)
        return "no KREX arbiter answers" in info["AdminComment"] and info["JobState"] in ("PENDING", "FAILED")

    wait_until(refused, 60, f"job {job} refused", interval=0.1)
    FIGURES["arbiter_down_refused_after_s"] = round(time.monotonic() - t0, 2)
    info, reason = c.job(job), c.node_reason()
    print(f"\njob {job} with the arbiter down: {info}\nnode: {c.node_state()} Reason={reason}")
    assert info["JobState"] in ("PENDING", "FAILED"), info
    assert "DRAIN" in c.node_state()
    assert reason.startswith("krex: no KREX arbiter answers at ipc://"), reason
    assert str(c.runtime) in reason
    assert not c.output(job).strip()  # the job's script never ran

    c.start_arbiter()
    assert c.scontrol("update", f"NodeName={c.node}", "State=RESUME").returncode == 0
    if info["JobState"] == "PENDING":
        c.scontrol("release", job)
        c.scontrol("update", f"JobId={job}", "StartTime=now")  # a requeued job waits 2 min otherwise
        try:
            c.wait_jobs([job], 90)
        except AssertionError:
            raise AssertionError(f"job {job} did not run once the arbiter was back: {c.job(job)}") from None
        assert "rc=0" in c.output(job)
    assert c.node_state().split("+")[0] in ("IDLE", "MIXED"), c.node_state()
    assert not stopped_processes(node.uids)
