"""What a candidate leaves behind: memory outside its limit, files its next evaluation finds,
files the evaluator reads for it.

The whole path (a pool worker judging a KernelBench candidate), real files, real shared memory:

* shared memory that outlives a process (a file in ``/dev/shm``, POSIX and System V segments) is
  not the process's own memory: ``memory_limit_mb`` does not count it and the candidate's death
  does not free it. A candidate may make none;
* its build directory is its own for one evaluation: what it wrote there (beside what its
  compilers made while it loaded) is gone when the next evaluation of the same source starts;
* the file its output goes to is the evaluator's: a candidate cannot turn it into a link to a
  file it may not read (whose text the verdict would then carry) or into a pipe (on which the
  caller would wait for ever).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from tests.support.pool import PoolProc

from .helpers import LIMITS, SCALED_ADD_MODEL, problem

Judge = Callable[..., Evaluation]

HONEST = "\nimport os\nimport torch\nfrom torch import nn\n\n" + SCALED_ADD_MODEL

#: 160 MiB: more than the 64 MiB the candidate may add (``memory_limit_mb``)
SIZE = 160 << 20
LIMIT_MB = 64

#: ways to leave memory that neither counts against the process nor dies with it
SHARED = {
    "dev_shm_file": """
with open("/dev/shm/{token}", "wb") as f:
    for _ in range({size} >> 20):
        f.write(b"x" * (1 << 20))
""",
    "posix_shm": """
from multiprocessing import shared_memory
seg = shared_memory.SharedMemory(name="{token}", create=True, size={size})
for at in range(0, {size}, 1 << 20):
    seg.buf[at : at + (1 << 20)] = b"x" * (1 << 20)
seg.close()
""",
    "sysv_shm": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
sid = libc.shmget({key}, ctypes.c_size_t({size}), 0o1600)  # IPC_CREAT | 0600
if sid < 0:
    raise OSError(ctypes.get_errno(), "shmget: " + os.strerror(ctypes.get_errno()))
addr = libc.shmat(sid, None, 0)
ctypes.memset(addr, 120, {size})
libc.shmdt(ctypes.c_void_p(addr))
""",
}


@pytest.fixture
def judge(eval_pool: PoolProc) -> Judge:
    def go(source: str, **options: object) -> Evaluation:
        options.setdefault("timeouts", LIMITS)
        return evaluate(problem("kb_scaled_add"), source, pool=eval_pool.client, **options)  # type: ignore[arg-type]

    return go


def _sysv_segments(key: int) -> list[int]:
    """The ids of System V segments of ``key``."""
    with open("/proc/sysvipc/shm") as f:
        next(f)
        return [int(ln.split()[1]) for ln in f if int(ln.split()[0]) == key]


@contextlib.contextmanager
def _removed_after(token: str, key: int) -> Iterator[None]:
    """Whatever an attack that worked left is removed, whatever the test's outcome."""
    try:
        yield
    finally:
        for p in Path("/dev/shm").glob(f"{token}*"):
            p.unlink(missing_ok=True)
        libc = ctypes.CDLL(None)
        for sid in _sysv_segments(key):
            libc.shmctl(sid, 0, None)  # IPC_RMID


@pytest.mark.timeout(300)
@pytest.mark.parametrize("way", list(SHARED))
def test_shared_memory_a_candidate_makes_neither_outlives_it_nor_escapes_its_limit(way: str, judge: Judge) -> None:
    token = f"krex-attack-{secrets.token_hex(6)}"
    key = secrets.randbelow(1 << 30) + 1
    source = "import os\n" + SHARED[way].format(token=token, size=SIZE, key=key) + HONEST
    with _removed_after(token, key):
        ev = judge(source, memory_limit_mb=LIMIT_MB)
        left = [p.name for p in Path("/dev/shm").glob(f"{token}*")] + [f"sysv {s}" for s in _sysv_segments(key)]
        assert not left, f"{way}: {ev.verdict}; left behind: {left}"
        assert ev.verdict == "runtime_error", (way, ev.verdict, ev.summary)
        text = str(ev.metadata.get("runtime_error", ""))
        assert "Permission denied" in text or "Operation not permitted" in text, text
    # what it could not make is no honest candidate's loss
    assert judge(HONEST).verdict == "correct"


#: looks for what an earlier evaluation of this very source left in its build directory, then
#: leaves files there for the next: one beside it when loaded, one in each tool's cache while called
REMEMBERS = """
import glob
import os

_FOUND = sorted(glob.glob("**/krex-left-*", recursive=True))
if _FOUND:
    raise RuntimeError(f"an earlier evaluation left {_FOUND}")
with open("krex-left-at-load.py", "w") as f:
    f.write("PLANTED = True\\n")
_CACHES = ["torch_extensions", "triton", "inductor", "cache", "nv-cache", "numba"]
""" + HONEST.replace(
    "        return torch.add(b, a, alpha=self.alpha)",
    """        for d in _CACHES:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "krex-left-in-a-call"), "w") as f:
                f.write("seen inputs")
        return torch.add(b, a, alpha=self.alpha)""",
)


@pytest.mark.timeout(300)
def test_nothing_a_candidate_wrote_is_found_by_its_next_evaluation(judge: Judge) -> None:
    source = REMEMBERS + f"\n# {secrets.token_hex(8)}: a source of its own, built nowhere before\n"
    first = judge(source, measure=False)
    assert first.verdict == "correct", (first.summary, first.metadata.get("runtime_error"))
    second = judge(source, measure=False)
    assert second.verdict == "correct", (second.summary, second.metadata.get("runtime_error"))
    for ev in (first, second):  # what emptying the directory and keeping the cache took, said
        assert float(ev.metadata["build_dir_s"]) >= 0 and float(ev.metadata["build_keep_s"]) >= 0, ev.metadata


#: its output file (fd 1) turned into something else once it is loaded
SWAP_OUTPUT = """
import os

_out = os.readlink("/proc/self/fd/1")
os.unlink(_out)
{make}
print("the output file is no longer a file")
"""


@pytest.mark.timeout(300)
def test_a_candidate_cannot_link_its_output_to_a_file_it_may_not_read(judge: Judge, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    token = secrets.token_hex(16)
    secret.write_text(f"the user's secret {token}\n")
    source = SWAP_OUTPUT.format(make=f"os.symlink({str(secret)!r}, _out)") + HONEST
    ev = judge(source, measure=False)
    assert token not in (ev.output or ""), f"{ev.verdict}: the verdict carries a file the candidate could not read"
    assert secret.read_text() == f"the user's secret {token}\n"


@pytest.mark.timeout(300)
def test_a_candidate_cannot_make_its_output_a_pipe_the_caller_waits_on(judge: Judge) -> None:
    source = SWAP_OUTPUT.format(make="os.mkfifo(_out)") + HONEST
    got: list[Evaluation] = []
    caller = threading.Thread(target=lambda: got.append(judge(source, measure=False)), daemon=True)
    caller.start()
    caller.join(120)
    if caller.is_alive():  # the caller blocks opening the pipe: a writer of ours lets it go
        cache = Path(os.environ["KREX_EVAL_CACHE"])
        for fifo in cache.glob("**/output-*.txt"):
            if fifo.is_fifo():
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        caller.join(30)
        pytest.fail("the caller waited for ever on a pipe the candidate put in place of its output")
    assert got and got[0].verdict in ("correct", "runtime_error"), got


#: links laid in its build directory where the judge writes the problem's files the next time
#: (its layout's partial files, named by the judge's pid: every process's, the judge's among them)
LAYS_LINKS = """
import glob
import os

for layout in glob.glob("task-*"):
    for name in ("submission.py", "utils.py", "task.py", "reference.py"):
        os.unlink(os.path.join(layout, name))  # its own copy, spoilt: the judge writes it again
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                os.symlink({victim!r}, os.path.join(layout, f".{{name}}.{{pid}}.part"))
            except OSError:
                pass
"""


@pytest.mark.timeout(300)
def test_the_judge_writes_through_no_link_a_candidate_laid_for_its_next_evaluation(
    eval_pool: PoolProc, tmp_path: Path
) -> None:
    """The judge lays out a GPU MODE problem's files in the candidate's build directory before the
    candidate's process starts: a link laid there by an earlier evaluation would have the judge
    (not sandboxed) write the candidate's text into any file of the user's."""
    victim = tmp_path / "victim.py"
    victim.write_text("ORIGINAL = True\n")
    task = problem("gm_tasks/gm_task_scale")
    source = problem("gm_tasks/gm_task_scale", "correct.py").read_text() + LAYS_LINKS.format(victim=str(victim))
    source += f"\n# {secrets.token_hex(8)}\n"
    for _ in range(2):
        ev = evaluate(task, source, pool=eval_pool.client, timeouts=LIMITS, measure=False)  # type: ignore[arg-type]
        assert victim.read_text() == "ORIGINAL = True\n", f"{ev.verdict}: the judge wrote through a planted link"
        assert ev.verdict == "correct", (ev.summary, ev.metadata.get("runtime_error"))


#: while the judge copies its compilers' cache, swaps a directory of it for a link to one it may
#: not read, over and over: a copy that follows the link keeps that directory's files for the
#: candidate's next evaluation
SWAPS_CACHE_DIRS = """
import ctypes
import os
import threading

os.makedirs("torch_extensions/ext")
with open("torch_extensions/ext/kernel.so", "w") as f:
    f.write("built")
os.makedirs("hidden")
os.symlink({secret!r}, "hidden/ext")
_libc = ctypes.CDLL(None, use_errno=True)


def _swap():
    # the directory and the link trade places in one step (renameat2's RENAME_EXCHANGE): the
    # cache holds the one or the other under that name at every instant
    while True:
        _libc.renameat2(-100, b"torch_extensions/ext", -100, b"hidden/ext", 2)


threading.Thread(target=_swap, daemon=True).start()
"""


@pytest.mark.timeout(300)
def test_the_kept_cache_holds_nothing_from_outside_the_build_directory(judge: Judge, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_key").write_text("the user's key\n")
    builds = Path(os.environ["KREX_EVAL_CACHE"]) / "builds"
    for _ in range(20):  # a race: twenty sources, twenty copies
        source = SWAPS_CACHE_DIRS.format(secret=str(secret)) + HONEST + f"\n# {secrets.token_hex(8)}\n"
        ev = judge(source, measure=False)
        copied = [str(p) for p in builds.glob("*.kept/**/id_key")]
        assert not copied, f"{ev.verdict}: the judge kept a file from outside: {copied}"


#: prints what it finds of the user's other processes: their environments, where keys live
READS_OTHERS = """
import os

for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found = [v for v in f.read().split(b"\\0") if v.startswith(b"KREX_TEST_SECRET=")]
        if found:
            print("found", found[0].decode())
    except OSError:
        pass
"""


@pytest.mark.timeout(300)
def test_a_candidate_reads_nothing_of_the_users_other_processes(judge: Judge) -> None:
    """A process of the user's (an agent, a notebook kernel, the caller) with a key in its
    environment: a candidate that reads it prints it into its verdict's output."""
    token = secrets.token_hex(16)
    # as an ordinary user's process is: no capability (root's would keep a capless reader out)
    capless = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
    capless += ["--securebits=+noroot,+noroot_locked,+no_setuid_fixup", "--"]
    other = subprocess.Popen([*capless, "sleep", "300"], env={**os.environ, "KREX_TEST_SECRET": token})
    try:
        ev = judge(READS_OTHERS + HONEST, measure=False)
    finally:
        other.kill()
        other.wait()
    assert token not in (ev.output or ""), f"{ev.verdict}: the candidate read another process's environment"
    assert ev.verdict == "correct", (ev.summary, ev.metadata.get("runtime_error"))


#: limits the candidate raises back for itself before it goes past them (soft up to hard)
RAISES_LIMITS = {
    "data": """
import resource

try:
    resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except (ValueError, OSError):
    pass
_BLOB = bytearray(160 << 20)  # beyond the 64 MiB it may add
_BLOB[:: 1 << 12] = b"x" * len(_BLOB[:: 1 << 12])
""",
    "file_size": """
import resource

try:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except (ValueError, OSError):
    pass
with open("big.bin", "wb") as f:  # sparse: past every limit of a file, at no cost of disk
    f.seek(3 << 30)
    f.write(b"x")
""",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("limit", list(RAISES_LIMITS))
def test_a_candidate_cannot_raise_its_own_limits(limit: str, judge: Judge) -> None:
    ev = judge(RAISES_LIMITS[limit] + HONEST, memory_limit_mb=LIMIT_MB, measure=False)
    assert ev.verdict != "correct", f"{limit}: past its limit and correct"
    assert ev.verdict == ("out_of_memory" if limit == "data" else "rejected"), (ev.verdict, ev.summary)


#: a process made a sibling of the candidate's (CLONE_PARENT: the zygote's child), in a session of
#: its own: neither in the candidate's process tree nor in its group, nor a child of the judge
SIBLING = """
import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_pid = _libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD), x86_64
if _pid == 0:
    os.setsid()
    os.execv("/bin/sleep", ["{name}", "300"])
"""


def _alive(name: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if p.name.isdigit() and (p / "cmdline").read_bytes().startswith(name.encode()):
                out.append(int(p.name))
    return out


@pytest.mark.timeout(300)
def test_a_process_made_a_sibling_of_the_candidate_is_found_and_ended(judge: Judge) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the raw clone's number is x86_64's")
    name = f"krexrt-sibling-{secrets.token_hex(6)}"
    try:
        ev = judge(SIBLING.format(name=name) + HONEST, measure=False)
        assert not _alive(name), f"{ev.verdict}: a sibling of the candidate outlived it"
        assert ev.verdict == "rejected" and "processes_left" in ev.metadata.get("rejected", {}), ev.summary
    finally:
        for pid in _alive(name):
            os.kill(pid, 9)
