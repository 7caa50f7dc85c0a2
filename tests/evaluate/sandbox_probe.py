"""Attacks on a judge, from a child process, with or without the candidate's sandbox.

``python sandbox_probe.py WORKDIR bare|sandboxed|sandboxed-seccomp``: this process plays the judge (non-dumpable,
a secret in its memory, a file of its own beside the candidate's build directory) and forks a
child that plays the candidate: ``sandboxed`` applies :mod:`krex_lab.evaluate.candidate.sandbox`
first, as a spare does (``sandboxed-seccomp``: signals held by seccomp alone, as on a kernel
without landlock's scopes). The child tries each attack on this process and prints one JSON line,
``{attack: "done" | "denied: why"}``; this process then says whether its own scheduling changed.
Run by the tests as root and as an unprivileged user: it needs the standard library only (the
sandbox module is loaded by its path).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import mmap
import os
import platform
import signal
import socket
import sys
import time
from pathlib import Path

SANDBOX = Path(__file__).resolve().parents[2] / "krex_lab" / "evaluate" / "candidate" / "sandbox.py"
SECRET = b"judge-secret-seed=" + str(int.from_bytes(os.urandom(6), "big")).encode()
libc = ctypes.CDLL(None, use_errno=True)


def _sandbox():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("krex_sandbox_probe", SANDBOX)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(rc: int) -> None:
    if rc == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def attacks(judge: int, judge_file: Path, secret_at: int) -> dict[str, object]:
    """Each attack on the judge; what it did."""

    def read_mem() -> None:
        with open(f"/proc/{judge}/mem", "rb", 0) as f:
            f.seek(secret_at)
            if f.read(len(SECRET)) != SECRET:
                raise AssertionError("read, but not the secret")

    def vm_readv() -> None:
        buf = ctypes.create_string_buffer(len(SECRET))
        local, remote = _IoVec(ctypes.addressof(buf), len(SECRET)), _IoVec(secret_at, len(SECRET))
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        _check(libc.process_vm_readv(judge, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))

    def ptrace_seize() -> None:
        child = os.fork()
        if child == 0:  # attach, and detach by exiting
            rc = libc.ptrace(0x4206, judge, None, None)  # PTRACE_SEIZE
            os._exit(0 if rc == 0 else ctypes.get_errno())
        _, status = os.waitpid(child, 0)
        if os.waitstatus_to_exitcode(status):
            code = os.waitstatus_to_exitcode(status)
            raise OSError(code, os.strerror(code))

    def foreign_abi(abi: str) -> None:
        """PTRACE_SEIZE of the judge through the i386 (``int 0x80``) or x32 syscall table, from
        machine code of its own: a filter that knew only the native table's numbers would let it by."""
        if platform.machine() != "x86_64":
            raise NotImplementedError(f"{platform.machine()} has no {abi} table")
        child = os.fork()
        if child == 0:
            pid = judge.to_bytes(4, "little")
            if abi == "i386":  # push rbx; eax=26 ebx=SEIZE ecx=pid edx=esi=0; int 0x80; pop rbx
                code = b"\x53\xb8\x1a\x00\x00\x00\xbb\x06\x42\x00\x00\xb9" + pid
                code += b"\x31\xd2\x31\xf6\xcd\x80\x5b"
            else:  # eax=x32 ptrace edi=SEIZE esi=pid edx=r10=0; syscall
                code = b"\xb8\x09\x02\x00\x40\xbf\x06\x42\x00\x00\xbe" + pid
                code += b"\x31\xd2\x45\x31\xd2\x0f\x05"
            code += b"\x48\x63\xc0\xc3"  # movsxd rax, eax; ret
            buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            buf.write(code)
            rc = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
            os._exit(0 if rc == 0 else min(-rc, 255))
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):
            raise OSError(0, f"killed by {signal.Signals(os.WTERMSIG(status)).name}")
        if code := os.waitstatus_to_exitcode(status):
            raise OSError(code, os.strerror(code))

    def renice() -> None:
        for tid in os.listdir(f"/proc/{judge}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), 15)

    def sigio() -> None:
        r, w = os.pipe()
        try:
            import fcntl

            fcntl.fcntl(r, fcntl.F_SETOWN, judge)
        finally:
            os.close(r)
            os.close(w)

    def rlimit() -> None:
        import resource

        resource.prlimit(judge, resource.RLIMIT_NOFILE, resource.prlimit(judge, resource.RLIMIT_NOFILE))

    def oom_score() -> None:  # root owns a non-dumpable process's /proc files: root's 0644, even capless
        with open(f"/proc/{judge}/oom_score_adj", "w") as f:
            f.write("900")

    def write_outside() -> None:
        with open(judge_file, "a") as f:
            f.write("planted")

    steps = {
        "read_mem": read_mem,
        "process_vm_readv": vm_readv,
        "ptrace": ptrace_seize,
        "ptrace_i386": lambda: foreign_abi("i386"),
        "ptrace_x32": lambda: foreign_abi("x32"),
        "signal": lambda: os.kill(judge, signal.SIGCONT),
        "tgkill": lambda: _check(libc.tgkill(judge, judge, 0)),
        "sigio_owner": sigio,
        "renice": renice,
        "affinity": lambda: os.sched_setaffinity(judge, os.sched_getaffinity(judge)),
        "prlimit": rlimit,
        "oom_score": oom_score,
        "socket_unix": lambda: socket.socket(socket.AF_UNIX).close(),
        "socket_tcp": lambda: socket.socket(socket.AF_INET).close(),
        "read_outside": lambda: judge_file.read_bytes(),
        "write_outside": write_outside,
        "write_tmp": lambda: Path("/tmp", f"krex-probe-{os.getpid()}").write_text("x"),
    }
    out: dict[str, object] = {}
    for name, step in steps.items():
        try:
            step()
            out[name] = "done"
        except OSError as exc:
            out[name] = f"denied: {exc.strerror or exc}"
        except AssertionError as exc:
            out[name] = f"failed: {exc}"
        except NotImplementedError as exc:
            out[name] = f"not run: {exc}"
    with __import__("contextlib").suppress(OSError):
        os.unlink(f"/tmp/krex-probe-{os.getpid()}")
    return out


def own_child() -> str:
    """What the candidate may do to its own: end a child it started (a compiler past its time)."""
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        os.kill(child, signal.SIGKILL)
        return "done"
    except OSError as exc:
        return f"denied: {exc.strerror}"
    finally:
        with __import__("contextlib").suppress(OSError):
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def main(workdir: str, mode: str) -> None:
    work = Path(workdir)
    build = work / "build"
    build.mkdir(parents=True, exist_ok=True)
    judge_file = work / "judge-owned.txt"
    judge_file.write_text("the judge's\n")
    libc.prctl(4, 0, 0, 0, 0)  # the judge is non-dumpable, as KREX's is
    secret = ctypes.create_string_buffer(SECRET)
    judge = os.getpid()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        report: dict[str, object] = {}
        t0 = time.perf_counter()
        if mode.startswith("sandboxed"):
            sandbox = _sandbox()
            scopes = mode != "sandboxed-seccomp"
            report.update(sandbox.lock_process(scopes=scopes))
            report.update(sandbox.confine_files(str(build), str(build / "tmp"), [], scopes=scopes))
        report["apply_s"] = time.perf_counter() - t0
        report.update(attacks(judge, judge_file, ctypes.addressof(secret)))
        report["signal_own_child"] = own_child()
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(child, 0)
    result = json.loads(data)
    nice = {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{judge}/task")}
    result["judge_nice"] = sorted(nice)
    with open("/proc/self/oom_score_adj") as f:
        result["judge_oom_score_adj"] = int(f.read())
    result["judge_file"] = judge_file.read_text()
    print(json.dumps(result))


if __name__ == "__main__":
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    main(sys.argv[1], sys.argv[2])
