"""A real one-node Slurm on this machine for tests/test_slurm.py: ``munged``, ``slurmctld`` and
``slurmd`` in the foreground (``-D``), each with its own state, spool, log and ports in a temporary
directory, configured by ``extension/slurm/`` (its ``slurm.conf`` and ``gres.conf`` filled in with
this node's name, ports and paths; its prolog, epilog and task prolog run from the repository), and
the node's KREX arbiter (``krex arbiter --multi-user --backend fake --fake-gpus 2 --slurm`` under
``krex supervise``; its regions move sessions only, ``--Arbiter.shield=sessions``, as the project's
test arbiters do, never the other processes of a machine shared with other tests). The simulated
GPUs are character devices made with mknod (Slurm's GRES need a device file; nothing opens them)."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import sqlite3
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from krex_lab.connection import hello, status

REPO = Path(__file__).resolve().parents[2]
EXTENSION = REPO / "extension" / "slurm"
KREX = Path(sys.executable).with_name("krex")
GPUS = 2
SHARDS = 4  # two jobs per GPU
DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str:
    """Why this machine cannot run the cluster ('' when it can)."""
    if os.geteuid() != 0:
        return "needs root: slurmd starts jobs as other users and the arbiter serves them (.ci/run reruns it as root)"
    absent = [d for d in (*DAEMONS, "sbatch", "squeue", "scontrol", "useradd") if shutil.which(d) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed: .ci/run installs Debian's slurmctld, slurmd, slurm-client and "
            "munge, and the package registry did not answer"
        )
    if not KREX.exists():
        return f"{KREX} is missing (the test runs from the project's virtualenv)"
    return ""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _render(src: Path, dst: Path, values: dict[str, str]) -> None:
    dst.write_text(string.Template(src.read_text()).substitute(values))


class Cluster:
    """``venv``: a virtualenv the test's users can run (the jobs', prolog's and epilog's ``krex``)."""

    def __init__(self, venv: Path) -> None:
        self.job_krex = venv / "bin" / "krex"
        self.root = Path(tempfile.mkdtemp(prefix="krex-slurm-"))
        os.chmod(self.root, 0o755)  # users reach the munge socket, the arbiter's and their job dir
        for d in ("etc", "state", "spool", "log", "run", "dev", "jobs"):
            (self.root / d).mkdir(mode=0o755)
        (self.root / "munge").mkdir(mode=0o700)
        os.chmod(self.root / "jobs", 0o1777)
        self.runtime = self.root / "krex"  # the node arbiter's runtime dir
        self.node = socket.gethostname()
        self.conf = self.root / "etc" / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            "PATH": f"{self.job_krex.parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "SLURM_CONF": str(self.conf),
            "LC_ALL": "C.UTF-8",
            "HOME": "/",
        }

    # -- set-up -----------------------------------------------------------------------------------
    def configure(self, prolog_wait: float = 2.0) -> None:
        ctld_port, d_port = _free_ports(2)
        for i in range(GPUS):
            os.mknod(self.root / "dev" / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
        values = {
            "KREX_SLURM_DIR": str(EXTENSION),
            "KREX_NODE": self.node,
            "KREX_GPUS": str(GPUS),
            "KREX_SHARDS": str(SHARDS),
            "KREX_NODE_SPEC": f"NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN",
            "KREX_GPU_FILES": f"{self.root}/dev/gpu[0-{GPUS - 1}]",
        }
        _render(EXTENSION / "slurm.conf", self.root / "etc" / "krex-slurm.conf", values)
        _render(EXTENSION / "gres.conf", self.root / "etc" / "gres.conf", values)
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=krextest",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={d_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r}/run/munge.sock",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool",
                    f"SlurmctldPidFile={r}/run/slurmctld.pid",
                    f"SlurmdPidFile={r}/run/slurmd.pid",
                    f"SlurmctldLogFile={r}/log/slurmctld.log",
                    f"SlurmdLogFile={r}/log/slurmd.log",
                    # no cgroups in a container: processes tracked by their parentage
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/backfill",
                    "SelectTypeParameters=CR_Core",
                    "KillWait=2",  # SIGTERM, then SIGKILL 2 s later
                    "SlurmdTimeout=120",
                    "MinJobAge=600",
                    f"Include {r}/etc/krex-slurm.conf",
                    # 4 jobs at once on 2 cores: the partition shares cores; GPUs are shared by shards
                    f"PartitionName=krex Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )
        (r / "etc" / "krex.env").write_text(
            f"KREX={self.job_krex}\nKREX_RUNTIME_DIR={self.runtime}\nKREX_PROLOG_WAIT={prolog_wait}\n"
        )
        with open(r / "munge" / "munge.key", "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(os.urandom(1024))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (kept by the child)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root)
        log.close()
        self.procs[name] = proc
        return proc

    def start_munge(self) -> None:
        r = self.root
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--key-file={r}/munge/munge.key",
                f"--socket={r}/run/munge.sock",
                f"--pid-file={r}/run/munged.pid",
                f"--log-file={r}/log/munged.log",
                f"--seed-file={r}/munge/seed",
            ],
        )
        wait_until(lambda: (r / "run" / "munge.sock").exists(), 10, "munged's socket")

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])

    def start_slurmd(self) -> None:
        log = self.root / "log" / "slurmd.log"
        starts = self._slurmd_starts()
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node])
        wait_until(lambda: self._slurmd_starts() > starts, 30, f"slurmd started (its log: {log})")
        wait_until(lambda: self.node_state().split("+")[0] in ("IDLE", "MIXED", "ALLOCATED"), 30, "slurmd registered")

    def _slurmd_starts(self) -> int:
        """How many times slurmd said it started (its log's 'slurmd started on' lines)."""
        log = self.root / "log" / "slurmd.log"
        return log.read_text(errors="replace").count("slurmd started on") if log.exists() else 0

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def start_arbiter(self) -> None:
        rt = str(self.runtime)
        self._spawn(
            "arbiter",
            [
                str(KREX),
                "supervise",
                "--runtime-dir",
                rt,
                "--",
                str(KREX),
                "arbiter",
                "--multi-user",
                "--slurm",
                "--backend",
                "fake",
                "--fake-gpus",
                str(GPUS),
                "--runtime-dir",
                rt,
                # Regions keep the other sessions off their cores, not the whole machine's processes
                # (tests of others beside this one): what the project's test arbiters do.
                "--Arbiter.shield=sessions",
            ],
        )
        wait_until(self.arbiter_answers, 30, "the node arbiter")

    def arbiter_answers(self) -> bool:
        try:
            hello(self.endpoint, timeout=1.0)
            return True
        except Exception:
            return False

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.runtime / 'arbiter.sock'}"

    def start(self) -> Cluster:
        self.configure()
        self.start_munge()
        self.start_arbiter()
        self.start_slurmctld()
        wait_until(lambda: self.scontrol("ping").returncode == 0, 30, "slurmctld")
        self.start_slurmd()
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--quiet", "-p", "krex"], env=self.env, timeout=20, check=False)
            wait_until(lambda: not self.squeue_ids(), 30, "jobs ended")
        for name in ("slurmd", "slurmctld", "arbiter", "munged"):
            self.stop(name)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- Slurm commands ---------------------------------------------------------------------------
    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30)

    def node_state(self) -> str:
        out = self.scontrol("show", "node", self.node, "-o").stdout
        return _field(out, "State")

    def node_reason(self) -> str:
        out = self.scontrol("show", "node", self.node).stdout
        line = next((x for x in out.splitlines() if x.strip().startswith("Reason=")), "")
        return line.strip()[len("Reason=") :]

    def job(self, job: str) -> dict[str, str]:
        out = self.scontrol("show", "job", job, "-o").stdout
        keys = ("JobState", "Reason", "AdminComment", "ExitCode", "StartTime", "EndTime", "EligibleTime")
        return {k: _field(out, k) for k in keys}

    def squeue(self) -> str:
        fmt = "%.6i %.9P %.14j %.10u %.8a %.2t %.8M %.12b %R"
        return subprocess.run(["squeue", "-o", fmt], env=self.env, capture_output=True, text=True, timeout=30).stdout

    def squeue_ids(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True, timeout=30)
        return out.stdout.split()

    def sbatch(self, user: Any, script: str, *options: str) -> str:
        """Submit ``script`` (a shell script's body) as ``user``; the job id."""
        path = self.root / "jobs" / f"{user.name}-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        argv = ["sbatch", "--parsable", "--gres=shard:1", "-D", str(self.root / "jobs"), "-o", "%j.out"]
        out = subprocess.run(
            [*argv, *options, str(path)],
            env=self.env,
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout.strip().split(";")[0]

    def output(self, job: str) -> str:
        path = self.root / "jobs" / f"{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_jobs(self, jobs: list[str], timeout: float) -> None:
        wait_until(lambda: not set(jobs) & set(self.squeue_ids()), timeout, f"jobs {jobs} ended")

    # -- KREX -------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return status(self.endpoint, timeout=10.0)

    def krex(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "KREX_RUNTIME_DIR": str(self.runtime)}
        return subprocess.run([str(KREX), *args], env=env, capture_output=True, text=True, timeout=60)

    def history_rows(self) -> list[dict[str, Any]]:
        conn = sqlite3.connect(f"file:{self.runtime / 'history.sqlite'}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM regions ORDER BY granted_at")]
        finally:
            conn.close()


def _field(text: str, key: str) -> str:
    """``key``'s value in scontrol's ``Key=value Key=value`` output (a value may hold spaces)."""
    m = re.search(rf"(?:^|\s){key}=(.*?)(?=\s+[A-Za-z:/]+=|$)", text.replace("\n", " "))
    return m.group(1).strip() if m else ""


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def stopped_processes(uids: set[int]) -> list[str]:
    """The processes of ``uids`` (the test's users: every job process) in state T or t: 'pid name'.
    Only theirs: on a shared machine another test may keep a process of its own stopped."""
    out = []
    for p in psutil.process_iter(["pid", "name", "status", "uids"]):
        if p.info["uids"] is None or p.info["uids"].real not in uids:
            continue
        if p.info["status"] in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            out.append(f"{p.info['pid']} {p.info['name']}")
    return out


def user_name(uid: int) -> str:
    return pwd.getpwuid(uid).pw_name
