"""The candidate's sandbox (krex_lab/evaluate/candidate/sandbox.py): what a candidate cannot do
to its judge, its zygote, the pool or the user's files.

Two levels, both real processes:

* the whole path (a pool worker judging a KernelBench candidate): each candidate below tries
  one attack when it is imported and raises what the kernel answered; had the attack worked,
  it would go on as the honest candidate and be ``correct``. Its verdict must be a
  ``runtime_error`` naming the denial, and the judge must be unharmed;
* the sandbox alone (``sandbox_probe.py``): a child attacks its non-dumpable parent with and
  without the sandbox, as root and as a real unprivileged user: every attack that works bare
  is denied sandboxed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.evaluate.candidate import sandbox
from tests.security.users import make_user
from tests.support.pool import PoolProc

from .helpers import LIMITS, SCALED_ADD_MODEL, problem

Run = Callable[..., Evaluation]
JudgeSource = Callable[[str], Evaluation]
PROBE = Path(__file__).with_name("sandbox_probe.py")

HONEST = SCALED_ADD_MODEL

PRELUDE = """
import ctypes, os, signal, socket
import torch
from torch import nn

ZYGOTE = os.getppid()
with open(f"/proc/{ZYGOTE}/stat") as _f:
    JUDGE = int(_f.read().rsplit(")", 1)[1].split()[1])
libc = ctypes.CDLL(None, use_errno=True)

def check(rc):
    if rc == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
"""

ATTACKS = {
    # the judge's memory: its seeds, its reference's answers
    "proc_mem": """
with open(f"/proc/{JUDGE}/maps") as maps, open(f"/proc/{JUDGE}/mem", "rb", 0) as mem:
    start = int(next(ln for ln in maps if " rw" in ln).split("-")[0], 16)
    mem.seek(start)
    mem.read(4096)
""",
    "proc_environ": """
open(f"/proc/{JUDGE}/environ", "rb").read()
""",
    "ptrace": """
child = os.fork()
if child == 0:
    rc = libc.ptrace(0x4206, JUDGE, None, None)  # PTRACE_SEIZE; exiting detaches
    os._exit(0 if rc == 0 else ctypes.get_errno())
code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
if code:
    raise OSError(code, "ptrace: " + os.strerror(code))
""",
    "process_vm_readv": """
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
local, remote = IoVec(ctypes.addressof(buf), 8), IoVec(0x1000, 8)
libc.process_vm_readv.restype = ctypes.c_ssize_t
if libc.process_vm_readv(JUDGE, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == -1:
    code = ctypes.get_errno()
    if code != 14:  # EFAULT: allowed, the address was just not mapped
        raise OSError(code, "process_vm_readv: " + os.strerror(code))
""",
    # the judge's open files and working directory (its cache, its sockets)
    "proc_fd": """
for fd in os.listdir(f"/proc/{JUDGE}/fd"):
    os.readlink(f"/proc/{JUDGE}/fd/{fd}")
""",
    "proc_cwd": """
os.listdir(f"/proc/{JUDGE}/cwd/")
""",
    # other judges' CUDA IPC counters in /dev/shm (random names, each in its own judge's maps):
    # a candidate opens the ones it is handed, and finds no others by listing the directory
    "shm_listing": """
os.listdir("/dev/shm")
""",
    # the judge's and the zygote's lives and scheduling
    "signal_judge": """
os.kill(JUDGE, signal.SIGCONT)
""",
    "kill_zygote": """
os.kill(ZYGOTE, signal.SIGKILL)
""",
    # the next candidate's process, ready beside it (the judge's calibration twin)
    "signal_spare": """
with open(f"/proc/{ZYGOTE}/task/{ZYGOTE}/children") as f:
    spares = [int(p) for p in f.read().split() if int(p) != os.getpid()]
if not spares:
    raise LookupError("no spare beside it: nothing was tried")
for pid in spares:
    os.kill(pid, signal.SIGSTOP)
""",
    "renice_judge": """
for tid in os.listdir(f"/proc/{JUDGE}/task"):
    os.setpriority(os.PRIO_PROCESS, int(tid), 19)
""",
    "oom_judge": """
with open(f"/proc/{JUDGE}/oom_score_adj", "w") as f:  # root's file even for a capless root
    f.write("1000")
""",
    "pin_judge": """
os.sched_setaffinity(JUDGE, {min(os.sched_getaffinity(JUDGE))})
""",
    # the pool, the evaluator's files, the installation
    "socket_to_pool": """
endpoint = os.environ.get("KREX_POOL_ENDPOINT", "ipc:///nonexistent")
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(endpoint.split("://", 1)[1])
except FileNotFoundError:
    pass
""",
    "socket_tcp": """
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
""",
    "read_cache": """
cache = os.path.dirname(os.path.dirname(os.getcwd()))  # the build dir is CACHE/builds/<hash>
os.listdir(cache)
""",
    "write_cache": """
cache = os.path.dirname(os.path.dirname(os.getcwd()))
os.makedirs(os.path.join(cache, "reference-times"), exist_ok=True)
with open(os.path.join(cache, "reference-times", "planted.json"), "w") as f:
    f.write("{}")
""",
    "write_site_packages": """
path = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), f"krex-probe-{os.getpid()}.txt")
with open(path, "w") as f:
    f.write("planted")
os.unlink(path)
""",
    "write_tmp": """
path = f"/tmp/krex-probe-{os.getpid()}"
with open(path, "w") as f:
    f.write("planted")
os.unlink(path)
""",
}


def attack_source(name: str) -> str:
    return PRELUDE + ATTACKS[name] + HONEST


def _nice(pid: int) -> set[int]:
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                out.add(int(f.read().rsplit(")", 1)[1].split()[16]))
        except OSError:
            pass
    return out


def _restore(pid: int) -> None:
    """An attack that worked (unchanged code) leaves the pool as it found it."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text("0")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 0)
            os.sched_setaffinity(int(tid), os.sched_getaffinity(0))
        except OSError:
            pass


@pytest.fixture
def judge_source(eval_pool: PoolProc) -> JudgeSource:
    """The evaluation of a KernelBench candidate's source on ``kb_scaled_add``."""

    def go(source: str) -> Evaluation:
        return evaluate(problem("kb_scaled_add"), source, pool=eval_pool.client, timeouts=LIMITS)

    return go


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_attack_from_the_candidate_is_denied_and_named(
    attack: str, judge_source: Callable[[str], Evaluation]
) -> None:
    ev = judge_source(attack_source(attack))
    judge = ev.worker_pid
    try:
        assert ev.verdict == "runtime_error", f"{attack}: {ev.verdict}: {ev.summary}"
        text = str(ev.metadata.get("runtime_error", ""))
        assert "Operation not permitted" in text or "Permission denied" in text, text
        assert str(ev.metadata.get("sandbox", "")).startswith("held"), ev.metadata.get("sandbox")
        if judge:
            assert _nice(judge) == {0}, f"the judge's threads were reniced: {_nice(judge)}"
            assert Path(f"/proc/{judge}/oom_score_adj").read_text().strip() == "0"
            assert os.sched_getaffinity(judge) == os.sched_getaffinity(0)
    finally:
        if judge:
            _restore(judge)
    # the worker, its zygote and its pool serve on: an honest candidate is judged next
    after = judge_source(PRELUDE + HONEST)
    assert after.verdict == "correct", after.summary


def test_an_honest_candidate_is_judged_inside_the_sandbox_and_the_verdict_says_so(run: Run) -> None:
    ev = run("kb_scaled_add", "correct.py")
    assert ev.verdict == "correct", ev.summary
    said = str(ev.metadata["sandbox"])
    assert said.startswith("held: no_new_privs, dumpable, capabilities, seccomp"), said
    assert "degraded" not in said, said
    if sandbox.landlock_abi() >= 1:
        assert "landlock" in said and "sockets" in said, said


#: a thread bomb: threads (tasks, as processes are) until the kernel refuses one
TASK_BOMB = """
import threading
threading.stack_size(32768)
_hold = threading.Event()
_started = 0
for _ in range({tries}):
    try:
        threading.Thread(target=_hold.wait, daemon=True).start()
    except RuntimeError as exc:
        raise RuntimeError(f"refused after {{_started}} threads: {{exc}}") from None
    _started += 1
raise RuntimeError(f"all {{_started}} threads started")
"""


def _controller(name: str) -> bool:
    """Whether this host has the cgroup controller ``name`` a judge could cap its candidate with."""
    with open("/proc/self/cgroup") as f:
        if any(name in line.split(":")[1].split(",") for line in f if line.count(":") >= 2):
            return True
    with contextlib.suppress(OSError):
        return name in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
    return False


@pytest.mark.timeout(300)
def test_a_candidates_tasks_are_capped(judge_source: JudgeSource) -> None:
    from krex_lab.evaluate.judge.account import TASKS_MAX

    ev = judge_source(PRELUDE + TASK_BOMB.format(tries=TASKS_MAX + 200) + HONEST)
    said = str(ev.metadata.get("candidate_tasks"))
    if said.startswith("not capped") and not _controller("pids"):
        pytest.skip(f"no pids controller on this host: {said}")
    if said.startswith("not capped") and os.geteuid() != 0 and "Permission denied" in said:
        pytest.skip(f"this user may make no cgroup here (none is delegated to it): {said}")
    assert said.startswith(f"at most {TASKS_MAX} "), said
    assert ev.verdict == "runtime_error", ev.summary
    text = str(ev.metadata.get("runtime_error", ""))
    assert "refused after" in text, text
    started = int(text.split("refused after ")[1].split()[0])
    assert 0 < started < TASKS_MAX, text
    # the pool serves on: an honest candidate is judged next
    after = judge_source(PRELUDE + HONEST)
    assert after.verdict == "correct", after.summary


#: host memory no rlimit counts: a memfd's pages are shared memory, outside RLIMIT_DATA; had the
#: writes all gone through, the candidate goes on as the honest one
MEMFD_HOARD = """
_fd = os.memfd_create("hoard")
_chunk = b"x" * (16 << 20)
for _ in range({chunks}):
    os.write(_fd, _chunk)
"""


@pytest.mark.timeout(300)
def test_a_candidates_shared_memory_counts_against_its_allowance(eval_pool: PoolProc) -> None:
    from krex_lab.evaluate.judge.account import MEMORY_MARGIN

    limit_mb = 128
    source = PRELUDE + MEMFD_HOARD.format(chunks=8 * limit_mb // 16) + HONEST
    ev = evaluate(problem("kb_scaled_add"), source, pool=eval_pool.client, timeouts=LIMITS, memory_limit_mb=limit_mb)
    said = str(ev.metadata.get("candidate_memory"))
    if said.startswith("not capped") and not _controller("memory"):
        pytest.skip(f"no memory controller on this host: {said}")
    if said.startswith("not capped") and os.geteuid() != 0 and "Permission denied" in said:
        pytest.skip(f"this user may make no cgroup here (none is delegated to it): {said}")
    assert ev.verdict != "correct", f"{8 * limit_mb} MiB of memfd went through: {ev.summary}"
    cap = (limit_mb << 20) + max(MEMORY_MARGIN, (limit_mb << 20) // 8)
    assert said.startswith(f"at most {cap >> 20} MiB added "), said
    assert ev.verdict in ("runtime_error", "crashed"), (ev.verdict, ev.summary)
    # the pool serves on: an honest candidate is judged next, with the same allowance
    after = evaluate(
        problem("kb_scaled_add"), PRELUDE + HONEST, pool=eval_pool.client, timeouts=LIMITS, memory_limit_mb=limit_mb
    )
    assert after.verdict == "correct", after.summary


#: disk no rlimit bounds: RLIMIT_FSIZE caps one file, not how many; removed files held open
#: still take their blocks. Had it all stayed, the candidate goes on as the honest one.
DISK_FILL = """
import tempfile
_held = []
for _ in range({files}):
    _f = tempfile.NamedTemporaryFile(delete={removed})
    _f.write(b"x" * (16 << 20))
    _f.flush()
    _held.append(_f)
if {removed}:
    for _f in _held:
        os.unlink(_f.name)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("removed", [False, True], ids=["kept", "removed_held_open"])
def test_a_candidate_that_fills_the_disk_is_stopped(eval_pool: PoolProc, removed: bool) -> None:
    if removed and os.geteuid() != 0:
        pytest.skip("an ordinary user's judge cannot read its non-dumpable candidate's /proc/<pid>/fd")
    source = PRELUDE + DISK_FILL.format(files=8, removed=False) + HONEST
    if removed:
        source = source.replace("if False:", "if True:")
    ev = evaluate(problem("kb_scaled_add"), source, pool=eval_pool.client, timeouts=LIMITS, disk_limit_mb=64)
    assert ev.verdict == "rejected", f"128 MiB written against a 64 MiB limit: {ev.summary}"
    assert "more than its limit of 64 MiB" in str(ev.metadata.get("disk_limit")), ev.metadata
    after = evaluate(problem("kb_scaled_add"), PRELUDE + HONEST, pool=eval_pool.client, timeouts=LIMITS)
    assert after.verdict == "correct", after.summary


#: what a compiler's cache does (Triton's writes into a temporary directory beside the entry, then
#: renames it into place): a move between two directories of the candidate's own build directory
CACHE_MOVE = """
import tempfile
_root = tempfile.mkdtemp()
os.makedirs(os.path.join(_root, "entry", "tmp.part"))
with open(os.path.join(_root, "entry", "tmp.part", "module.so"), "w") as f:
    f.write("built")
os.replace(os.path.join(_root, "entry", "tmp.part", "module.so"), os.path.join(_root, "entry", "module.so"))
"""


@pytest.mark.timeout(300)
def test_a_compiler_cache_may_move_files_within_the_build_directory(judge_source: JudgeSource) -> None:
    """Every landlock layer refuses a move across directories unless a rule of its own grants it:
    the signal-scopes layer, which has no file rules, made Triton's cache fail with EXDEV."""
    ev = judge_source(PRELUDE + CACHE_MOVE + HONEST)
    assert ev.verdict == "correct", (ev.summary, ev.metadata.get("runtime_error"))


# -- the sandbox alone, root and an unprivileged user ------------------------------------------

#: attacks whose success bare depends on who runs them (root's capabilities), said by the probe
DENIED = {
    "read_mem",
    "process_vm_readv",
    "ptrace",
    "ptrace_i386",
    "ptrace_x32",
    "signal",
    "tgkill",
    "sigio_owner",
    "renice",
    "affinity",
    "prlimit",
    "oom_score",
    "socket_unix",
    "socket_tcp",
    "read_outside",
    "write_outside",
    "write_tmp",
}


def _probe(workdir: Path, mode: str, runner: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, object]:
    done = runner(str(PROBE), str(workdir), mode)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _as_self(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, check=False)


def _check_probe(bare: dict[str, object], boxed: dict[str, object]) -> None:
    worked_bare = {k for k in DENIED if bare.get(k) == "done"}
    assert {"signal", "renice", "sigio_owner", "socket_unix", "write_outside", "write_tmp"} <= worked_bare, bare
    assert bare["judge_nice"] != [0] and "planted" in str(bare["judge_file"]), bare
    for name in DENIED:
        # (the foreign syscall tables exist on x86_64 alone: elsewhere their attacks are not run)
        assert str(boxed[name]).startswith(("denied", "not run")), f"{name}: {boxed[name]}"
    assert boxed["judge_nice"] == [0] and boxed["judge_oom_score_adj"] == 0, boxed
    assert "planted" not in str(boxed["judge_file"]), boxed
    for part in ("no_new_privs", "dumpable", "capabilities", "seccomp"):
        assert str(boxed[part]).startswith("held"), boxed


def test_the_sandbox_denies_every_attack_on_its_parent_as_root(tmp_path: Path) -> None:
    bare = _probe(tmp_path / "bare", "bare", _as_self)
    if os.geteuid() == 0:  # root reads a non-dumpable process's memory, bare
        assert {"read_mem", "process_vm_readv", "ptrace", "oom_score"} <= {
            k for k in DENIED if bare.get(k) == "done"
        }, bare
        # and traces it through the i386 table where the kernel runs 32-bit code (x32 is rarely built)
        assert (
            bare["ptrace_i386"] == "done"
            or "SIGSEGV" in str(bare["ptrace_i386"])
            or "not run" in str(bare["ptrace_i386"])
        ), bare
    boxed = _probe(tmp_path / "boxed", "sandboxed", _as_self)
    _check_probe(bare, boxed)
    if sandbox.landlock_abi() >= 6:  # landlock's scopes: a candidate still ends its own children
        assert boxed["signal_own_child"] == "done" and "landlock" in str(boxed["signals"]), boxed


def test_without_landlock_scopes_seccomp_alone_keeps_signals_home(tmp_path: Path) -> None:
    """A kernel older than landlock's scopes (6.12): seccomp refuses every signal but to itself."""
    bare = _probe(tmp_path / "bare", "bare", _as_self)
    boxed = _probe(tmp_path / "boxed", "sandboxed-seccomp", _as_self)
    _check_probe(bare, boxed)
    assert "seccomp" in str(boxed["signals"]) and "signals" not in str(boxed["landlock"]), boxed
    assert str(boxed["signal_own_child"]).startswith("denied"), boxed


def test_the_sandbox_denies_every_attack_on_its_parent_as_an_unprivileged_user() -> None:
    with make_user("krexsbx") as user:
        work = Path(tempfile.mkdtemp(prefix="krex-sandbox-"))  # pytest's tmp_path is root's alone
        try:
            work.chmod(0o755)
            for mode in ("bare", "boxed"):
                (work / mode).mkdir()
                os.chown(work / mode, user.uid, user.gid)

            def as_user(*argv: str) -> subprocess.CompletedProcess[str]:
                for exe in (sys.executable, "/usr/bin/python3"):
                    done = user.run(exe, *argv, check=False)
                    if done.returncode != 126:
                        return done
                pytest.skip(f"no Python that {user.name} may run")

            bare = _probe(work / "bare", "bare", as_user)
            boxed = _probe(work / "boxed", "sandboxed", as_user)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        assert boxed["capabilities"] == "held (none held)", boxed
        _check_probe(bare, boxed)
