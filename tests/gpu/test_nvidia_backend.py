"""NVIDIA backend logic without a GPU: test doubles stand in for NVML and for libcuda.

Two doubles, at two depths:

* :class:`ScriptedDriver` replaces the whole driver layer (:class:`CudaDriver`): the backend's
  decisions (refuse stopped processes, skip locked ones, tolerate exited ones) are tested
  against real child processes.
* :class:`StandInLib` replaces only ``libcuda.so.1`` under the real :class:`CtypesCudaDriver`,
  so its argument structs, error naming and symbol detection are exercised for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from krex_lab.enforcement.drain import DrainResult, Locker
from krex_lab.errors import BackendError
from krex_lab.gpu import cuda_driver
from krex_lab.gpu.cuda_driver import (
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_OPERATING_SYSTEM,
    NOT_A_CUDA_PROCESS,
    CtypesCudaDriver,
    CudaDriver,
    CudaError,
    ProcessState,
)
from krex_lab.gpu.nvidia import LockOutcome, NvidiaBackend, ProcessStopped, cgroup_frozen
from krex_lab.gpu.nvml import NvmlApi, decode_throttle_reasons
from krex_lab.gpu.pid_mapping import PidMap, holds_nvidia_device, local_pid, parse_nspid
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import subprocess_pythonpath
from tests.support.procs import kill_tree

REPO = Path(__file__).resolve().parents[2]

# -- doubles ---------------------------------------------------------------------------------


class FakeNvml(NvmlApi):
    def __init__(
        self,
        gpus: int = 1,
        procs: dict[int, list[tuple[int, int | None]]] | None = None,
        reasons: int | None = 0x5,
        fail: bool = False,
    ) -> None:
        self.gpus = gpus
        self.procs = procs or {}
        self.reasons = reasons
        self.fail = fail
        self.shut = 0

    def shutdown(self) -> None:
        self.shut += 1

    def device_count(self) -> int:
        if self.fail:
            raise BackendError("NVML init failed: Driver Not Loaded")
        return self.gpus

    def driver_version(self) -> str:
        return "580.159.04"

    def name(self, index: int) -> str:
        return "NVIDIA H200"

    def uuid(self, index: int) -> str:
        return f"GPU-test-{index}"

    def memory(self, index: int) -> tuple[int, int]:
        return (141 << 30, 1 << 30)

    def utilization(self, index: int) -> float | None:
        return 42.0

    def clocks(self, index: int) -> tuple[int | None, int | None]:
        return (1980, 3201)

    def clock_event_reasons(self, index: int) -> int | None:
        return self.reasons

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        return list(self.procs.get(index, []))


class ScriptedDriver(CudaDriver):
    """Driver layer double: per-pid states and errors, every call recorded.

    Like the real driver (tests/gpu/test_nvidia_driver.py), it refuses to lock a process that is
    not RUNNING or to unlock one that is not LOCKED (CUDA_ERROR_ILLEGAL_STATE), and answers a lock
    of a process without CUDA with the error its state query gives."""

    def __init__(self, version: int = 13000, checkpoint: bool = True) -> None:
        self.version = version
        self.checkpoint = checkpoint
        self.states: dict[int, ProcessState] = {}
        self.errors: dict[tuple[str, int], CudaError] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.on_unlock: Any = None

    def driver_version(self) -> int:
        return self.version

    @property
    def has_checkpoint(self) -> bool:
        return self.checkpoint

    def _maybe_fail(self, op: str, pid: int) -> None:
        err = self.errors.get((op, pid))
        if err is not None:
            raise err

    def checkpoint_state(self, pid: int) -> ProcessState:
        self.calls.append(("state", pid))
        self._maybe_fail("state", pid)
        return self.states.get(pid, ProcessState.RUNNING)

    def _refuse_unless(self, call: str, pid: int, state: ProcessState) -> None:
        no_cuda = self.errors.get(("state", pid))
        if no_cuda is not None and no_cuda.code in NOT_A_CUDA_PROCESS:
            raise no_cuda
        if self.states.get(pid, ProcessState.RUNNING) is not state:
            raise CudaError(call, CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE")

    def checkpoint_lock(self, pid: int, timeout_ms: int) -> None:
        self.calls.append(("lock", pid, timeout_ms))
        self._maybe_fail("lock", pid)
        self._refuse_unless("lock", pid, ProcessState.RUNNING)
        self.states[pid] = ProcessState.LOCKED

    def checkpoint_unlock(self, pid: int) -> None:
        self.calls.append(("unlock", pid))
        if self.on_unlock is not None:
            self.on_unlock(pid)
        self._maybe_fail("unlock", pid)
        self._refuse_unless("unlock", pid, ProcessState.LOCKED)
        self.states[pid] = ProcessState.RUNNING


def cuda_error(call: str, code: int, name: str) -> CudaError:
    return CudaError(call, code, name)


class StandInLib:
    """Plays ``libcuda.so.1`` for :class:`CtypesCudaDriver`: plain callables, ctypes arguments."""

    NAMES = {1: b"CUDA_ERROR_INVALID_VALUE", 304: b"CUDA_ERROR_OPERATING_SYSTEM", 909: b"CUDA_ERROR_TIMEOUT"}
    TEXTS = {304: b"OS call failed or operation not supported on this OS"}

    def __init__(self, checkpoint: bool = True, init_rc: int = 0) -> None:
        self.init_rc = init_rc
        self.rc: dict[str, int] = {}
        self.state = 1
        self.seen: list[tuple[Any, ...]] = []
        if not checkpoint:  # an old driver: the symbols are absent, as getattr on a CDLL says
            self.cuCheckpointProcessLock = None
            self.cuCheckpointProcessUnlock = None
            self.cuCheckpointProcessGetState = None

    def cuInit(self, flags: Any) -> int:
        return self.init_rc

    def cuDriverGetVersion(self, out: Any) -> int:
        out.contents.value = 12020
        return 0

    def cuGetErrorName(self, code: Any, out: Any) -> int:
        name = self.NAMES.get(code.value)
        if name is None:
            return CUDA_ERROR_INVALID_VALUE  # the driver does not know this code
        out[0] = name
        return 0

    def cuGetErrorString(self, code: Any, out: Any) -> int:
        text = self.TEXTS.get(code.value)
        if text is None:
            return CUDA_ERROR_INVALID_VALUE
        out[0] = text
        return 0

    def cuCheckpointProcessLock(self, pid: Any, args: Any) -> int:
        a = args.contents
        self.seen.append(("lock", pid.value, a.timeoutMs, a.reserved0, list(a.reserved1)))
        return self.rc.get("lock", 0)

    def cuCheckpointProcessUnlock(self, pid: Any, args: Any) -> int:
        self.seen.append(("unlock", pid.value, args))
        return self.rc.get("unlock", 0)

    def cuCheckpointProcessGetState(self, pid: Any, out: Any) -> int:
        out.contents.value = self.state
        return self.rc.get("state", 0)


# -- real child processes --------------------------------------------------------------------


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped child must run to die cleanly
            proc.kill()
        proc.wait()


def wait_state(pid: int, states: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = proc_state(pid)
        if s is not None and s in states:
            return s
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} never reached state {states} (is {proc_state(pid)})")


def backend(driver: CudaDriver | None = None, nvml: NvmlApi | None = None, proc: Path = Path("/proc")) -> NvidiaBackend:
    return NvidiaBackend(nvml=nvml or FakeNvml(), driver=driver or ScriptedDriver(), proc=proc)


# -- lock ------------------------------------------------------------------------------------


def test_lock_refuses_a_stopped_process_without_calling_the_driver(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    os.kill(child.pid, signal.SIGSTOP)
    wait_state(child.pid, "Tt")
    t = time.monotonic()
    with pytest.raises(ProcessStopped, match=r"stopped \(state T\)"):
        be.lock(child.pid, 5.0)
    assert time.monotonic() - t < 0.5
    assert drv.calls == []  # the driver would hang: it must never be asked
    with pytest.raises(ProcessStopped):  # unlock talks to the same helper in the target
        be.unlock(child.pid)
    assert drv.calls == []
    os.kill(child.pid, signal.SIGCONT)
    wait_state(child.pid, "S")
    be.lock(child.pid, 5.0)
    assert drv.calls == [("lock", child.pid, 5000)]  # a RUNNING process: no state query


def test_lock_and_unlock_of_a_running_process_make_one_driver_call_each(child: subprocess.Popen[bytes]) -> None:
    # A drain locks and unlocks every sibling: a state query before each call would cost
    # 0.1 ms a sibling on the H200 (benchmarks/probes/lock_cost.py, 2026-12-01).
    drv = ScriptedDriver()
    be = backend(drv)
    assert be.lock_pid(child.pid, 1.0) is LockOutcome.LOCKED
    be.unlock(child.pid)
    assert drv.calls == [("lock", child.pid, 1000), ("unlock", child.pid)]
    assert drv.states[child.pid] is ProcessState.RUNNING


def test_the_drain_checks_on_its_loop_and_its_threads_only_call_the_driver(child: subprocess.Popen[bytes]) -> None:
    # 16 lock threads that each read /proc before their driver call queue on the GIL: one call
    # took 2.2-2.5 ms in 16 threads against 0.27 ms alone (lock_cost.py, H200, 2026-12-01).
    # The checks run on the drain's loop first; a process they refuse never reaches a thread.
    where: list[tuple[str, int, str]] = []

    class Recording(ScriptedDriver):
        def checkpoint_lock(self, pid: int, timeout_ms: int) -> None:
            where.append(("lock", pid, threading.current_thread().name))
            super().checkpoint_lock(pid, timeout_ms)

        def checkpoint_unlock(self, pid: int) -> None:
            where.append(("unlock", pid, threading.current_thread().name))
            super().checkpoint_unlock(pid)

    drv = Recording()
    be = backend(drv)
    checked = be.lock_check

    def lock_check(pid: int, state: str | None, what: str, cgroups: dict[str, bool] | None = None) -> bool:
        where.append((f"check {what}", pid, threading.current_thread().name))
        return checked(pid, state, what, cgroups)

    be.lock_check = lock_check  # type: ignore[method-assign]
    stopped = subprocess.Popen(["sleep", "60"])
    locker = Locker(be, lock_timeout=1.0)
    # A loop of its own, never the thread's current one: asyncio.run() would unset that for
    # the tests that run after this one.
    loop = asyncio.new_event_loop()
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_state(stopped.pid, "Tt")
        result = DrainResult()
        journaled: list[list[tuple[int, int]]] = []
        loop.run_until_complete(locker.lock_all([child.pid, stopped.pid], result, journaled.append))
        assert result.locked_pids == [child.pid]
        assert "stopped" in result.not_drained[stopped.pid]
        assert [pid for pid, _ in journaled[0]] == [child.pid]  # journaled before any driver call
        os.kill(child.pid, signal.SIGSTOP)  # stopped while locked: its unlock would hang
        wait_state(child.pid, "Tt")
        errors = loop.run_until_complete(locker.unlock_all(result.locked))
        assert len(errors) == 1 and "stopped" in errors[0]
        os.kill(child.pid, signal.SIGCONT)
        wait_state(child.pid, "S")
        assert loop.run_until_complete(locker.unlock_all(result.locked)) == []
    finally:
        loop.close()
        locker.shutdown()
        os.kill(stopped.pid, signal.SIGCONT)
        stopped.kill()
        stopped.wait()
    main = threading.current_thread().name
    assert where == [
        ("check lock", child.pid, main),
        ("lock", child.pid, where[1][2]),
        ("check unlock", child.pid, main),
        ("check unlock", child.pid, main),
        ("unlock", child.pid, where[4][2]),
    ], where
    assert where[1][2].startswith("krex-lock") and where[4][2].startswith("krex-lock")
    assert drv.states[child.pid] is ProcessState.RUNNING


def test_a_journal_that_fails_mid_drain_stops_the_locks_and_keeps_those_made(
    child: subprocess.Popen[bytes],
) -> None:
    # Each lock is journaled just before it is made: a journal that cannot be written stops the
    # drain there, and the locks already made stay in the result, so that the region's undo
    # unlocks them (none is left locked without a record).
    drv = ScriptedDriver()
    be = backend(drv)
    second = subprocess.Popen(["sleep", "60"])
    locker = Locker(be, lock_timeout=1.0)
    loop = asyncio.new_event_loop()
    lines: list[list[tuple[int, int]]] = []

    def journal(procs: list[tuple[int, int]]) -> None:
        if lines:
            raise OSError(28, "No space left on device")
        lines.append(procs)

    try:
        result = DrainResult()
        with pytest.raises(OSError, match="No space"):
            loop.run_until_complete(locker.lock_all([child.pid, second.pid], result, journal))
        assert result.locked_pids == [child.pid]
        assert drv.states[child.pid] is ProcessState.LOCKED
        assert second.pid not in drv.states or drv.states[second.pid] is not ProcessState.LOCKED
        assert loop.run_until_complete(locker.unlock_all(result.locked)) == []
        assert drv.states[child.pid] is ProcessState.RUNNING
    finally:
        loop.close()
        locker.shutdown()
        second.kill()
        second.wait()


def test_lock_passes_milliseconds_and_never_zero(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    assert be.lock_pid(child.pid, 1.5) is LockOutcome.LOCKED
    drv.states[child.pid] = ProcessState.RUNNING
    be.lock(child.pid, 0.0001)  # would round to 0 = "no timeout" for the driver
    locks = [c for c in drv.calls if c[0] == "lock"]
    assert locks == [("lock", child.pid, 1500), ("lock", child.pid, 1)]


def test_lock_skips_locked_and_checkpointed_processes(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    drv.states[child.pid] = ProcessState.LOCKED
    assert be.lock_pid(child.pid, 1.0) is LockOutcome.ALREADY_LOCKED
    drv.states[child.pid] = ProcessState.CHECKPOINTED
    assert be.lock_pid(child.pid, 1.0) is LockOutcome.CHECKPOINTED
    # the driver refused both; neither state was changed by asking
    assert drv.states[child.pid] is ProcessState.CHECKPOINTED
    assert [c[0] for c in drv.calls] == ["lock", "state", "lock", "state"]
    drv.states[child.pid] = ProcessState.FAILED
    with pytest.raises(BackendError, match="FAILED"):
        be.lock(child.pid, 1.0)


def test_a_refused_lock_of_a_running_process_is_an_error(child: subprocess.Popen[bytes]) -> None:
    # the state says RUNNING after the refusal: not one of the harmless cases, so it is raised
    drv = ScriptedDriver()
    be = backend(drv)
    drv.errors[("lock", child.pid)] = cuda_error("lock", CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE")
    with pytest.raises(BackendError, match="CUDA_ERROR_ILLEGAL_STATE"):
        be.lock_pid(child.pid, 1.0)


def test_lock_of_a_process_without_cuda_or_gone(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    drv.errors[("state", child.pid)] = cuda_error("state", CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED")
    assert CUDA_ERROR_NOT_INITIALIZED in NOT_A_CUDA_PROCESS
    assert be.lock_pid(child.pid, 1.0) is LockOutcome.NOT_CUDA
    be.unlock(child.pid)  # nothing to undo, and no error
    child.kill()
    child.wait()
    assert be.lock_pid(child.pid, 1.0) is LockOutcome.GONE


def test_lock_errors_keep_the_cuda_name(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    drv.errors[("lock", child.pid)] = cuda_error(
        f"cuCheckpointProcessLock(pid={child.pid})", CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM"
    )
    with pytest.raises(BackendError, match="CUDA_ERROR_OPERATING_SYSTEM"):
        be.lock(child.pid, 1.0)


# -- unlock ----------------------------------------------------------------------------------


def test_unlock_of_a_gone_process_is_fine() -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    proc = subprocess.Popen(["sleep", "60"])
    drv.states[proc.pid] = ProcessState.LOCKED
    proc.kill()
    wait_state(proc.pid, "ZX")  # a zombie: its GPU state died with it
    be.unlock(proc.pid)
    proc.wait()
    be.unlock(proc.pid)  # reaped: no /proc entry at all
    assert drv.calls == []


def test_unlock_tolerates_exit_during_the_call(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    drv.states[child.pid] = ProcessState.LOCKED
    drv.errors[("unlock", child.pid)] = cuda_error("unlock", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")

    def die(pid: int) -> None:  # the target exits between our state check and the unlock
        child.kill()
        child.wait()

    drv.on_unlock = die
    be.unlock(child.pid)
    assert ("unlock", child.pid) in drv.calls


def test_unlock_is_idempotent_and_reports_real_failures(child: subprocess.Popen[bytes]) -> None:
    drv = ScriptedDriver()
    be = backend(drv)
    be.unlock(child.pid)  # RUNNING: the driver refuses, the state says there is nothing to undo
    assert drv.calls == [("unlock", child.pid), ("state", child.pid)]
    assert drv.states.get(child.pid, ProcessState.RUNNING) is ProcessState.RUNNING
    drv.states[child.pid] = ProcessState.LOCKED
    drv.errors[("unlock", child.pid)] = cuda_error("unlock", 401, "CUDA_ERROR_ILLEGAL_STATE")
    with pytest.raises(BackendError, match="CUDA_ERROR_ILLEGAL_STATE"):
        be.unlock(child.pid)  # alive and still locked: this must not be swallowed
    del drv.errors[("unlock", child.pid)]
    be.unlock(child.pid)
    assert drv.states[child.pid] is ProcessState.RUNNING


# -- the ctypes layer, over a stand-in library ---------------------------------------------------


def test_ctypes_driver_builds_the_lock_args_and_reads_the_state() -> None:
    lib = StandInLib()
    drv = CtypesCudaDriver(lib=lib)
    assert drv.driver_version() == 12020 and drv.has_checkpoint
    drv.checkpoint_lock(4242, 2500)
    drv.checkpoint_unlock(4242)
    assert lib.seen == [("lock", 4242, 2500, 0, [0] * 7), ("unlock", 4242, None)]
    assert ctypes.sizeof(cuda_driver.CUcheckpointLockArgs) == 64  # 4 + 4 + 7 * 8, as in cuda.h
    lib.state = 2
    assert drv.checkpoint_state(7) is ProcessState.CHECKPOINTED
    lib.state = 9
    with pytest.raises(BackendError, match="unknown CUprocessState 9"):
        drv.checkpoint_state(7)
    with pytest.raises(ValueError):
        drv.checkpoint_lock(7, 0)


def test_ctypes_driver_names_errors() -> None:
    lib = StandInLib()
    drv = CtypesCudaDriver(lib=lib)
    lib.rc["lock"] = 304
    with pytest.raises(CudaError) as info:
        drv.checkpoint_lock(11, 1000)
    err = info.value
    assert isinstance(err, BackendError)
    assert (err.code, err.name) == (304, "CUDA_ERROR_OPERATING_SYSTEM")
    assert "pid=11" in str(err) and "OS call failed" in str(err)
    lib.rc["unlock"] = 401  # the stand-in cannot name it: the built-in table does
    with pytest.raises(CudaError, match="CUDA_ERROR_ILLEGAL_STATE"):
        drv.checkpoint_unlock(11)
    lib.rc["state"] = 12345
    with pytest.raises(CudaError, match="CUresult 12345"):
        drv.checkpoint_state(11)


def test_ctypes_driver_init_failure_is_named() -> None:
    with pytest.raises(CudaError, match="cuInit failed with CUDA_ERROR_INVALID_VALUE"):
        CtypesCudaDriver(lib=StandInLib(init_rc=1))


# -- capabilities ------------------------------------------------------------------------------


def test_old_driver_without_the_symbol_cannot_lock(child: subprocess.Popen[bytes]) -> None:
    drv = CtypesCudaDriver(lib=StandInLib(checkpoint=False))
    assert not drv.has_checkpoint
    be = backend(drv)
    caps = be.capabilities
    assert caps.lock is False
    assert "cuCheckpointProcessLock" in caps.reason and "cooperative" in caps.reason
    assert caps.driver == "580.159.04" and caps.extra["checkpoint_api"] is False
    assert caps.extra["cuda"] == "12.2"
    with pytest.raises(BackendError, match="cuCheckpointProcessLock"):
        be.lock(child.pid, 1.0)
    with pytest.raises(BackendError):
        drv.checkpoint_lock(child.pid, 1000)


def test_capabilities_with_the_lock_api() -> None:
    caps = backend(ScriptedDriver()).capabilities
    assert caps.lock is True
    assert caps.extra["checkpoint_api"] is True and caps.extra["cuda"] == "13.0"
    expected = "all-users" if os.geteuid() == 0 else "same-user"
    assert caps.extra["lock_scope"] == expected
    assert ("any user" in caps.reason) == (os.geteuid() == 0)


def test_missing_libcuda_leaves_inventory_but_no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CtypesCudaDriver, "LIBRARY", "libcuda-krex-test-missing.so.1")
    be = NvidiaBackend(nvml=FakeNvml())
    assert be.capabilities.lock is False
    assert "driver API is unavailable" in be.capabilities.reason
    assert be.inventory()[0].name == "NVIDIA H200"


def test_nvml_failure_raises_and_releases_nvml() -> None:
    nvml = FakeNvml(fail=True)
    with pytest.raises(BackendError, match="NVML"):
        NvidiaBackend(nvml=nvml, driver=ScriptedDriver())
    assert nvml.shut == 1
    with pytest.raises(BackendError, match="no NVIDIA GPU"):
        NvidiaBackend(nvml=FakeNvml(gpus=0), driver=ScriptedDriver())


def test_auto_falls_back_without_nvml() -> None:
    try:
        NvidiaBackend(driver=ScriptedDriver()).close()
    except BackendError:
        pass
    else:
        pytest.skip("NVML works on this machine")
    from krex_lab.gpu import make_backend

    assert make_backend("auto").name in ("amd", "fake")
    with pytest.raises(BackendError):
        make_backend("nvidia")


# -- inventory and throttle reasons ------------------------------------------------------------


def test_throttle_reason_decoding() -> None:
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x1) == ["gpu_idle"]
    assert decode_throttle_reasons(0x4 | 0x40 | 0x100) == [
        "sw_power_cap",
        "hw_thermal_slowdown",
        "display_clock_setting",
    ]
    assert decode_throttle_reasons(0x8 | 0x800) == ["hw_slowdown", "unknown_0x800"]


def test_inventory_reports_nvml_readings() -> None:
    be = backend(nvml=FakeNvml(gpus=2, reasons=0x5))
    inv = be.inventory()
    assert [g.index for g in inv] == [0, 1]
    g = inv[1]
    assert (g.name, g.uuid, g.memory_total, g.memory_used) == ("NVIDIA H200", "GPU-test-1", 141 << 30, 1 << 30)
    assert (g.sm_clock_mhz, g.mem_clock_mhz, g.utilization_gpu) == (1980, 3201, 42.0)
    assert g.throttle_reasons == ["gpu_idle", "sw_power_cap"] and g.simulated is False
    assert backend(nvml=FakeNvml(reasons=None)).inventory()[0].throttle_reasons == []
    assert be.describe()["backend"] == "nvidia" and be.describe()["simulated"] is False


# -- pid namespaces ----------------------------------------------------------------------------

SAMPLE_STATUS = """Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Tgid:\t4242
NStgid:\t4242\t17
Pid:\t4242
PPid:\t4200
NSpid:\t4242\t17
NSpgid:\t4200\t1
"""


def test_parse_nspid() -> None:
    assert parse_nspid(SAMPLE_STATUS) == [4242, 17]
    assert parse_nspid("Name:\tx\nPid:\t5\n") == []  # kernels before 4.1
    assert parse_nspid("NSpid:\t9\n") == [9]


def _fake_proc(root: Path, entries: dict[str, str]) -> Path:
    for name, nspid in entries.items():
        (root / name).mkdir(parents=True)
        (root / name / "status").write_text(f"Name:\tx\nNSpid:\t{nspid}\n")
    return root


def test_local_pid_follows_our_depth(tmp_path: Path) -> None:
    # We run one namespace down (NSpid "500 3"): NVML's 600 is our 7; 700 lives above us.
    proc = _fake_proc(tmp_path / "a", {"self": "500\t3", "600": "600\t7", "700": "700", "800": "800\t9\t2"})
    assert local_pid(600, proc) == 7
    assert local_pid(800, proc) == 9
    assert local_pid(700, proc) is None
    assert local_pid(999, proc) is None
    flat = _fake_proc(tmp_path / "b", {"self": "500", "600": "600\t7"})
    assert local_pid(600, flat) == 600


def test_local_pid_of_a_real_child(child: subprocess.Popen[bytes]) -> None:
    assert local_pid(child.pid) == child.pid
    status = Path(f"/proc/{child.pid}/status").read_text()
    assert parse_nspid(status)[0] == child.pid
    assert holds_nvidia_device(child.pid) is False  # `sleep` has no GPU context
    child.kill()
    child.wait()
    assert local_pid(child.pid) is None


@pytest.mark.skipif(not os.access("/dev", os.W_OK), reason="needs a writable /dev (root)")
@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "no-pidfd"])
def test_the_pid_map_keeps_a_process_for_its_life_and_forgets_it_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfds: bool
) -> None:
    # A file named like a device node stands for the GPU context that NVML's listing implies:
    # the map checks the open file's name only, and no driver is involved.
    if not pidfds:  # as under gVisor: the process is then told by its start time

        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    node = Path(f"/dev/nvidia-krex-test-{os.getpid()}")
    node.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(node)!r}); print(1, flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    bystander = subprocess.Popen(["sleep", "60"])
    pids = PidMap(Path("/proc"))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        assert pids.lookup(holder.pid) == holder.pid
        assert (pids._known[holder.pid].fd >= 0) is pidfds
        assert pids.lookup(bystander.pid) is None  # holds no NVIDIA file: a namespace collision
        # Remembered: asked again, it answers without /proc (a stand-in /proc would say "gone").
        pids._proc = tmp_path
        assert pids.lookup(holder.pid) == holder.pid
        holder.kill()
        holder.wait()
        assert pids.lookup(holder.pid) is None  # its pidfd says it ended: asked afresh, not found
        assert holder.pid not in pids._known
    finally:
        for p in (holder, bystander):
            p.kill()
            p.wait()
        pids.close()
        node.unlink()


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="cannot create a pid namespace here")
def test_local_pid_inside_a_real_pid_namespace() -> None:
    # A python in a new pid namespace but with the outer /proc (no --mount-proc): it is pid 1
    # to itself and N to /proc. The helper must find 1 for N, and None for our pid.
    code = (
        "import os, sys; from krex_lab.gpu.pid_mapping import local_pid, parse_nspid;"
        "outer = parse_nspid(open('/proc/self/status').read())[0];"
        "print(outer, local_pid(outer), os.getpid(), local_pid(int(sys.argv[1])))"
    )
    env = dict(os.environ, PYTHONPATH=subprocess_pythonpath())
    out = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code, str(os.getpid())],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    outer, mapped, own, ours = out.stdout.split()
    assert int(outer) > 1
    assert mapped == own == "1"
    assert ours == "None"


@pytest.mark.skipif(not _can_unshare(), reason="cannot create a pid namespace here")
def test_nspid_of_a_real_nested_process() -> None:
    # Killing unshare alone would leave its child (the namespace's `sleep 30`) running: kill_tree.
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        inner = None
        while inner is None and time.monotonic() < deadline:
            for task in Path(f"/proc/{proc.pid}/task").iterdir():
                kids = (task / "children").read_text().split()
                inner = int(kids[0]) if kids else None
            time.sleep(0.01)
        assert inner is not None
        assert parse_nspid(Path(f"/proc/{inner}/status").read_text()) == [inner, 1]
        assert local_pid(inner) == inner  # from the outer namespace, a host pid is ours as is
    finally:
        kill_tree(proc)


NESTED = "test_nspid_of_a_real_nested_process"


def _namespace_sleepers(since: float) -> list[int]:
    """``sleep 30`` processes that are pid 1 of a pid namespace, started after ``since`` (epoch s)."""
    found = []
    for p in psutil.process_iter(["cmdline", "create_time"]):
        with contextlib.suppress(psutil.Error, OSError):
            mine = p.info["cmdline"] == ["sleep", "30"] and p.info["create_time"] >= since
            if mine and parse_nspid(Path(f"/proc/{p.pid}/status").read_text())[-1] == 1:
                found.append(p.pid)
    return found


@pytest.mark.skipif(not _can_unshare(), reason="cannot create a pid namespace here")
def test_the_nested_process_test_leaves_nothing_behind() -> None:
    # The suite once left a `sleep 30` behind (unshare was killed, not its child).
    since = time.time() - 1
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{__file__}::test_nspid_of_a_real_nested_process",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    left = _namespace_sleepers(since)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"left behind: {left}"


def test_processes_keep_only_addressable_gpu_holders(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {"self": "500", "600": "600", "601": "601", "700": "700\t7"})
    (proc / "600" / "fd").mkdir()
    (proc / "600" / "fd" / "3").symlink_to("/dev/nvidiactl")
    (proc / "601" / "fd").mkdir()
    (proc / "601" / "fd" / "3").symlink_to("/dev/null")  # a pid collision: no GPU device open
    (proc / "700" / "fd").mkdir()
    (proc / "700" / "fd" / "9").symlink_to("/dev/nvidia0")
    nvml = FakeNvml(procs={0: [(600, 1 << 20), (601, None), (700, None), (999, None)]})
    be = backend(nvml=nvml, proc=proc)
    got = be.processes(0)
    assert [(p.pid, p.gpu, p.used_memory) for p in got] == [(600, 0, 1 << 20), (700, 0, None)]
    assert be.unmapped(0) == [601, 999]
    with pytest.raises(BackendError, match="no GPU 3"):
        be.processes(3)


# -- frozen cgroups ------------------------------------------------------------------------------


def test_cgroup_frozen_reads_v2_events_and_v1_freezer(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "5").mkdir(parents=True)
    (proc / "5" / "cgroup").write_text("0::/krex/a\n")
    (root / "krex" / "a").mkdir(parents=True)
    (root / "krex" / "a" / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert not cgroup_frozen(5, proc, root)
    (root / "krex" / "a" / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert cgroup_frozen(5, proc, root)
    (proc / "6").mkdir()
    (proc / "6" / "cgroup").write_text("9:pids:/x\n7:freezer:/x\n0::/\n")
    (root / "freezer" / "x").mkdir(parents=True)
    (root / "freezer" / "x" / "freezer.state").write_text("THAWED\n")
    assert not cgroup_frozen(6, proc, root)
    (root / "freezer" / "x" / "freezer.state").write_text("FROZEN\n")
    assert cgroup_frozen(6, proc, root)
    assert not cgroup_frozen(7, proc, root)  # gone


def test_a_batch_of_checks_looks_at_a_shared_cgroup_once(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cg"
    for pid, group in ((5, "a"), (6, "a"), (7, "b")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/krex/{group}\n")
        (root / "krex" / group).mkdir(parents=True, exist_ok=True)
        (root / "krex" / group / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    known: dict[str, bool] = {}
    assert not cgroup_frozen(5, proc, root, known)
    # a's answer is kept for the batch: its freezer is not read again for 6 ...
    (root / "krex" / "a" / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert not cgroup_frozen(6, proc, root, known)
    # ... while b, not looked at yet, is read, and a new batch reads a again
    (root / "krex" / "b" / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert cgroup_frozen(7, proc, root, known)
    assert cgroup_frozen(6, proc, root, {})
    assert sorted(known) == ["0::/krex/a", "0::/krex/b"]


def _v1_freezer() -> Path | None:
    base = Path("/sys/fs/cgroup/freezer")
    return base if os.geteuid() == 0 and (base / "tasks").exists() else None


@pytest.mark.skipif(_v1_freezer() is None, reason="needs root and a cgroup v1 freezer")
def test_lock_refuses_a_process_in_a_frozen_cgroup(child: subprocess.Popen[bytes]) -> None:
    base = _v1_freezer()
    assert base is not None
    group = base / f"krex-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "tasks").write_text(str(child.pid))
        (group / "freezer.state").write_text("FROZEN")
        drv = ScriptedDriver()
        with pytest.raises(ProcessStopped, match="frozen cgroup"):
            backend(drv).lock(child.pid, 1.0)
        assert drv.calls == []
    finally:
        (group / "freezer.state").write_text("THAWED")
        child.kill()
        child.wait()
        group.rmdir()


def test_every_backend_description_fits_the_wire() -> None:
    # hello and register answer with the backend's describe(): a key the wire does not know would
    # make the arbiter unable to answer at all (as once happened with "driver").
    import msgspec

    from krex_lab import protocol
    from krex_lab.gpu.fake import FakeBackend

    for described in (backend().describe(), FakeBackend(1).describe()):
        info = protocol.Info(
            version="0", protocol=protocol.VERSION, pid=1, gpus=1, identity="x", events="y", **described
        )
        assert msgspec.structs.asdict(info)["backend"] == described["backend"]
        protocol.Registered(session="s", token="t", gpu=0, **described)
