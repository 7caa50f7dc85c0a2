"""The candidate's sandbox: what its process may do to anything but itself.

Two steps, both in the candidate's process before any candidate code is in it:

* :func:`lock_process`, in the spare the moment it is forked (one thread, no CUDA context yet,
  so every thread it ever has inherits it): ``no_new_privs``; every capability dropped
  (bounding, ambient, effective, permitted, inheritable, root's exec fix-ups locked off), so a
  root candidate loses ``CAP_SYS_PTRACE``, ``CAP_SYS_NICE``, ``CAP_KILL``, ``CAP_DAC_OVERRIDE``;
  non-dumpable; and a seccomp filter (libseccomp): no ptrace, no ``process_vm_readv``/``writev``
  or other cross-process memory calls, signals only to itself, priority, affinity, scheduler,
  I/O priority and resource limits only of itself, no new namespaces, mounts, keyrings, BPF,
  perf events or io_uring.
* :func:`confine_files`, once the judge names the evaluation's build directory (after the
  spare's CUDA context exists): landlock (its syscalls, through ctypes) makes the system, the
  Python environment and the problem's files read-only and the build directory (with the
  evaluation's temporary directory in it) the only place it may write; nothing else of the
  user's is readable (the evaluator's cache, the pool's runtime directory, home). Where the
  kernel has them: no TCP bind/connect, no abstract UNIX socket or signal out of the sandbox.
  A second seccomp filter then forbids new sockets (the channel to the judge is inherited).

Each step answers a report (``{"part": "held" | "unavailable: why"}``); the judge puts it in the
verdict's metadata, so a machine without libseccomp or landlock says so. Everything here uses
the standard library only: it runs in a freshly forked process, ahead of the candidate.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import platform
import tempfile
from collections.abc import Iterable

__all__ = ["confine_files", "landlock_abi", "lock_process", "preload"]

_libc = ctypes.CDLL(None, use_errno=True)

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
#: root gets no capabilities from exec, setuid keeps none, no ambient raise; each bit locked
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80


def _prctl(option: int, arg2: int = 0) -> int:
    res = _libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    return 0 if res == 0 else ctypes.get_errno()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> str:
    """Every capability gone for good; what was held before is said."""
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    held = int(status.get("CapEff", "0"), 16) | int(status.get("CapPrm", "0"), 16)
    bounding = int(status.get("CapBnd", "0"), 16)
    if held:
        _prctl(_PR_SET_SECUREBITS, _SECUREBITS)  # needs CAP_SETPCAP: while it is still held
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if bounding >> cap & 1:
            _prctl(_PR_CAPBSET_DROP, cap)  # EPERM without CAP_SETPCAP: no_new_privs covers exec then
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        return f"failed: capset: {os.strerror(ctypes.get_errno())}"
    with open("/proc/self/status") as f:
        left = {k: v for k, v in (ln.split(":\t", 1) for ln in f if ln.startswith("Cap"))}
    if any(int(left[k], 16) for k in ("CapEff", "CapPrm", "CapInh", "CapAmb") if k in left):
        return "failed: capabilities remain"
    return "held (dropped all)" if held else "held (none held)"


# -- seccomp, through libseccomp --------------------------------------------------------------

_ALLOW = 0x7FFF0000
_NE, _EQ, _MASKED_EQ = 1, 4, 7
_ATTR_TSYNC, _ATTR_OPTIMIZE = 4, 8


def _errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


_SECCOMP: ctypes.CDLL | None = None


def _libseccomp() -> ctypes.CDLL:
    global _SECCOMP
    if _SECCOMP is None:
        name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        lib = ctypes.CDLL(name, use_errno=True)
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        _SECCOMP = lib
    return _SECCOMP


#: calls with no business in a candidate: another process's memory, the kernel's tracing and
#: key stores, namespaces and mounts (a new user namespace gives capabilities back inside it)
_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "process_mrelease", "kcmp",
    "pidfd_getfd", "pidfd_send_signal", "perf_event_open", "bpf", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "add_key", "keyctl", "request_key",
    "mount", "umount2", "pivot_root", "chroot", "setns", "unshare",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    # System V IPC and POSIX message queues: kernel memory that counts against no process's
    # limit and outlives its maker (a segment stays until someone removes it)
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_F_SETOWN, _F_SETOWN_EX = 8, 15
_FIOSETOWN, _SIOCSPGRP = 0x8901, 0x8902
_LOW32 = 0xFFFFFFFF


def _process_rules(own: int, scoped: bool) -> list[tuple[str, int, list[tuple[int, int, int, int]]]]:
    """(syscall, errno, comparisons that all hold for the call to be refused). ``scoped``: landlock
    keeps signals within the candidate's own processes, so seccomp need not."""
    perm = errno.EPERM
    rules: list[tuple[str, int, list[tuple[int, int, int, int]]]] = [(n, perm, []) for n in _DENIED]
    rules.append(("clone3", errno.ENOSYS, []))  # its flags are out of reach: the C library falls back to clone
    rules += [("clone", perm, [(0, _MASKED_EQ, flag, flag)]) for flag in _CLONE_NEW]
    # signals: to itself alone (a pid with stray high bits is refused, never truncated to another);
    # seccomp sees numbers, not processes: its children (their pids unknown now) are refused too
    for name in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        if not scoped:
            rules.append((name, perm, [(0, _NE, own, 0)]))
    rules.append(("fcntl", perm, [(1, _MASKED_EQ, _LOW32, _F_SETOWN), (2, _NE, own, 0)]))  # SIGIO to another
    rules.append(("fcntl", perm, [(1, _MASKED_EQ, _LOW32, _F_SETOWN_EX)]))
    rules += [("ioctl", perm, [(1, _MASKED_EQ, _LOW32, cmd)]) for cmd in (_FIOSETOWN, _SIOCSPGRP)]
    # scheduling and limits: of the calling thread alone (pid 0), never another process's
    rules.append(("setpriority", perm, [(0, _NE, 0, 0)]))  # PRIO_PROCESS only
    rules.append(("setpriority", perm, [(1, _NE, 0, 0)]))
    rules.append(("ioprio_set", perm, [(0, _NE, 1, 0)]))  # IOPRIO_WHO_PROCESS only
    rules.append(("ioprio_set", perm, [(1, _NE, 0, 0)]))
    for name in ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "prlimit64"):
        rules.append((name, perm, [(0, _NE, 0, 0)]))
    for name in ("migrate_pages", "move_pages"):
        rules.append((name, perm, [(0, _NE, 0, 0)]))
    rules.append(("socketpair", perm, [(0, _NE, 1, 0)]))  # AF_UNIX pairs only (pipes between its own)
    return rules


def _load_filter(rules: Iterable[tuple[str, int, list[tuple[int, int, int, int]]]]) -> None:
    lib = _libseccomp()
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        # every thread of the process, those CUDA and torch started included
        rc = lib.seccomp_attr_set(ctx, _ATTR_TSYNC, 1)
        if rc < 0:
            raise OSError(-rc, f"seccomp thread sync: {os.strerror(-rc)}")
        lib.seccomp_attr_set(ctx, _ATTR_OPTIMIZE, 2)  # a binary tree of syscalls (libseccomp >= 2.5)
        for name, code, cmps in rules:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not on this architecture (or older than this libseccomp)
                continue
            arr = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
            rc = lib.seccomp_rule_add_array(ctx, _errno(code), nr, len(cmps), arr)
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)


def preload() -> None:
    """libseccomp loaded in the zygote, once: a forked spare then locks itself in a few
    milliseconds instead of paying the library's loading each time."""
    with contextlib.suppress(OSError):
        _libseccomp()


def lock_process(scopes: bool = True) -> dict[str, str]:
    """The process-wide part, in a process of one thread (the forked spare): what held.
    ``scopes=False``: signals held by seccomp alone, as on a kernel older than landlock's scopes."""
    report: dict[str, str] = {}
    rc = _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    report["no_new_privs"] = "held" if rc == 0 else f"failed: {os.strerror(rc)}"
    rc = _prctl(_PR_SET_DUMPABLE, 0)
    report["dumpable"] = "held (not dumpable)" if rc == 0 else f"failed: {os.strerror(rc)}"
    try:
        report["capabilities"] = _drop_capabilities()
    except OSError as exc:
        report["capabilities"] = f"failed: {exc}"
    scoped = scopes and landlock_abi() >= 6 and _scope_signals()
    try:
        _load_filter(_process_rules(os.getpid(), scoped))
        report["seccomp"] = "held"
    except OSError as exc:
        report["seccomp"] = f"unavailable: {exc}"
    if scoped:
        report["signals"] = "held (landlock: to its own processes alone)"
    elif report["seccomp"].startswith("held"):
        report["signals"] = "held (seccomp: to itself alone, not its children)"
    else:
        report["signals"] = "unavailable: neither landlock's scopes nor seccomp"
    return report


# -- landlock ---------------------------------------------------------------------------------

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_SYS_SYSCALL = _libc.syscall
_SYS_SYSCALL.restype = ctypes.c_long

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_FILE, _REFER, _TRUNCATE = 1 << 5, 1 << 13, 1 << 14
_NET_TCP = 1 | 2  # bind, connect
_SCOPE = 1 | 2  # abstract UNIX sockets, signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's landlock ABI version; 0 where it has none (too old, or not enabled)."""
    res = _SYS_SYSCALL(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(res))


def _scope_signals() -> bool:
    """A landlock layer of scopes alone (ABI 6): no signal to, and no abstract UNIX socket of, a
    process outside the candidate's own. Set while the process has one thread, every later
    thread and child inherits it."""
    # every layer denies moving a file to another directory (REFER) unless a rule of its own
    # grants it, whatever it handles: this layer grants it everywhere, the file layer decides
    # (without it, a compiler's cache that writes into a temporary directory and renames into
    # place, as Triton's does, fails with EXDEV)
    attr = _RulesetAttr(_REFER, 0, _SCOPE)
    ruleset = int(_SYS_SYSCALL(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(24), ctypes.c_uint32(0)))
    if ruleset < 0:
        return False
    try:
        if not _add_rule(ruleset, "/", _REFER):
            return False
        return int(_SYS_SYSCALL(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))) == 0
    finally:
        os.close(ruleset)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # execute .. make_sym
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    return rights  # ioctl on devices is left alone: the GPU is nothing but ioctls


#: what the C library, compilers, Python and the GPU driver read
_SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys")
#: device files a candidate opens for writing: the GPU's and the harmless ones
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def _gpu_devices() -> list[str]:
    try:
        found = [os.path.join("/dev", n) for n in sorted(os.listdir("/dev")) if n.startswith("nvidia")]
    except OSError:
        found = []
    # the fake backend's simulated device memory (krex_lab.gpu.fake.MEMORY_ENV): its GPU, as
    # /dev/nvidia* is a real one's (named here, not imported: the candidate side imports no backend)
    simulated = os.environ.get("KREX_FAKE_GPU_MEMORY")
    return found + ([simulated] if simulated and os.path.isdir(simulated) else [])


def _python_dirs() -> list[str]:
    import sys

    out = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    out.append(os.path.dirname(os.path.realpath(sys.executable)))
    out += [p for p in sys.path if p and os.path.isabs(p)]
    out += [p for p in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(p)]
    out += [os.environ[k] for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k, "").startswith("/")]
    return out


def _add_rule(ruleset: int, path: str, rights: int) -> bool:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not os.path.isdir(path):
            rights &= _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE  # a file takes file rights only
        attr = _PathBeneath(rights, fd)
        beneath = ctypes.c_int(1)  # LANDLOCK_RULE_PATH_BENEATH
        res = _SYS_SYSCALL(_SYS_ADD_RULE, ctypes.c_int(ruleset), beneath, ctypes.byref(attr), ctypes.c_uint32(0))
        return int(res) == 0
    finally:
        os.close(fd)


def _landlock(writable: list[str], readable: list[str], scopes: bool, files: Iterable[str] = ()) -> str:
    abi = landlock_abi()
    if abi < 1:
        return f"unavailable: the kernel has no landlock ({platform.release()})"
    fs = _fs_rights(abi)
    scoped = scopes and abi >= 6
    attr = _RulesetAttr(fs, _NET_TCP if abi >= 4 else 0, _SCOPE if scoped else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = int(_SYS_SYSCALL(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)))
    if ruleset < 0:
        return f"unavailable: landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        read = _EXECUTE | _READ_FILE | _READ_DIR
        for path in dict.fromkeys([*_SYSTEM, *_python_dirs(), *readable]):
            _add_rule(ruleset, path, read)
        for path in (*_DEVICES, *_gpu_devices()):
            _add_rule(ruleset, path, fs)
        # /dev/shm: open what is there (the judge's CUDA IPC counters, which torch decrements
        # in the receiver, and unlinks when it holds the file last), make nothing: a file there
        # is memory that no limit of the candidate's counts and that outlives it (RLIMIT_FSIZE
        # bounds how far it may grow one that exists)
        _add_rule(ruleset, "/dev/shm", _READ_FILE | _WRITE_FILE | _REMOVE_FILE)
        for path in writable:
            _add_rule(ruleset, path, fs)
        for path in files:  # written into, never made, removed or replaced
            _add_rule(ruleset, path, _WRITE_FILE)
        if _SYS_SYSCALL(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"failed: landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    parts = ["files"] + (["tcp"] if abi >= 4 else []) + (["signals", "abstract sockets"] if scoped else [])
    return f"held (ABI {abi}: {', '.join(parts)})"


#: where tools keep caches and temporary files by default (/tmp, ~/.cache, ~/.triton): inside
#: the build directory, the one place the candidate may write
def _tool_dirs(build_dir: str, scratch: str) -> dict[str, str]:
    return {
        "TMPDIR": scratch,
        "TMP": scratch,
        "TEMP": scratch,
        "TRITON_CACHE_DIR": os.path.join(build_dir, "triton"),
        "TRITON_HOME": build_dir,
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(build_dir, "inductor"),
        "XDG_CACHE_HOME": os.path.join(build_dir, "cache"),
        "CUDA_CACHE_PATH": os.path.join(build_dir, "nv-cache"),
        "NUMBA_CACHE_DIR": os.path.join(build_dir, "numba"),
    }


def confine_files(
    build_dir: str, scratch: str, readable: list[str], files: list[str] | None = None, scopes: bool = True
) -> dict[str, str]:
    """The file and network part, once the evaluation's directories are known: writes go to
    ``build_dir`` (``scratch``, inside it, is the temporary directory) and into the existing
    ``files`` alone, reads to the system, the Python environment and ``readable``. What held.
    ``scopes``: as for :func:`lock_process`."""
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    os.environ.update(_tool_dirs(build_dir, scratch))
    tempfile.tempdir = None  # read again from TMPDIR
    report = {"landlock": _landlock([build_dir], readable, scopes, files or [])}
    try:
        _load_filter([("socket", errno.EPERM, [])])
        report["sockets"] = "held (none can be opened)"
    except OSError as exc:
        report["sockets"] = f"unavailable: {exc}"
    return report
