"""NVIDIA backend: NVML for inventory and processes, the driver's checkpoint lock for drain.

Lock rules (measured on the GPU machine, shared/FACTS.md):

* ``cuCheckpointProcessLock`` waits for the target's submitted work, then blocks its next
  CUDA call until ``cuCheckpointProcessUnlock``.
* On a *stopped* target it ignores its own timeout and hangs until the target runs again or
  dies. So :meth:`NvidiaBackend.lock` refuses stopped (and cgroup-frozen) processes before it
  calls the driver, and so does :meth:`NvidiaBackend.unlock`, which talks to the same helper
  in the target. A process can still be stopped between the check and the call: the drain
  step keeps its own deadline around every call.
* A non-root locker may lock only its own uid's processes (another uid:
  ``CUDA_ERROR_OPERATING_SYSTEM``); root may lock anyone's.

Pids and namespaces: NVML reports pids as the driver recorded them, i.e. in the pid
namespace of the host, while the arbiter signals and locks pids of *its own* namespace.
:mod:`krex_lab.gpu.pid_mapping` maps one to the other (``PidMap``, kept for each process's life).
"""

from __future__ import annotations

import enum
import functools
import logging
import os
from pathlib import Path

from ..errors import BackendError
from ..procfiles import KEPT
from ..procutil import GONE, STOPPED, proc_state, proc_uid
from ..protocol import DriverDetail
from .base import BackendDescription, Capabilities, GpuBackend, GpuInfo, GpuProcess
from .cuda_driver import (
    CUDA_ERROR_OPERATING_SYSTEM,
    NOT_A_CUDA_PROCESS,
    CtypesCudaDriver,
    CudaDriver,
    CudaError,
    ProcessState,
    version_string,
)
from .nvml import NvmlApi, PynvmlApi, decode_throttle_reasons
from .pid_mapping import PROC, PidMap

log = logging.getLogger("krex.gpu.nvidia")

CGROUP_ROOT = Path("/sys/fs/cgroup")


class ProcessStopped(BackendError):
    """The target is stopped or frozen; the driver's lock (and unlock) would hang on it."""


class LockOutcome(str, enum.Enum):
    """What :meth:`NvidiaBackend.lock_pid` did; every value means "nothing of it runs on the GPU"."""

    LOCKED = "locked"
    ALREADY_LOCKED = "already-locked"
    CHECKPOINTED = "checkpointed"  # its GPU state sits in host memory: no work to drain
    NOT_CUDA = "not-cuda"  # alive but never initialised CUDA
    GONE = "gone"


# -- frozen cgroups -------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _v2_mount(root: Path) -> Path:
    """Where the v2 hierarchy is mounted: ``root``, or ``root/unified`` in the hybrid layout.
    Mounts do not move under a running arbiter, and every lock asks."""
    return root / "unified" if (root / "unified" / "cgroup.controllers").exists() else root


def cgroup_frozen(pid: int, proc: Path = PROC, root: Path = CGROUP_ROOT, known: dict[str, bool] | None = None) -> bool:
    """Whether ``pid`` sits in a frozen cgroup (v2 ``cgroup.freeze`` or the v1 freezer).

    Frozen tasks show state S (v2) or D (v1), not T, so /proc/PID/stat alone misses them. The
    driver's lock needs the target's threads to run, so it is assumed to hang on them as on
    stopped ones (measured for SIGSTOP only, shared/FACTS.md). ``known`` keeps each cgroup's
    answer for the caller's next pid: a drain's siblings mostly share one cgroup.
    """
    if proc == PROC:  # a sibling's, read again every region: through a kept descriptor
        raw = KEPT.read(pid, ["cgroup"])[0]
        if raw is None:
            return False
        lines = raw.decode(errors="replace").splitlines()
    else:
        try:
            lines = (proc / str(pid) / "cgroup").read_text().splitlines()
        except OSError:
            return False
    known = {} if known is None else known
    for line in lines:
        if line not in known:
            known[line] = _line_frozen(line, root)
        if known[line]:
            return True
    return False


def _line_frozen(line: str, root: Path) -> bool:
    """Whether the cgroup named by one line of /proc/PID/cgroup is frozen."""
    hier, _, rest = line.partition(":")
    controllers, _, path = rest.partition(":")
    rel = path.lstrip("/")
    try:
        if hier == "0" and controllers == "":
            # v2: cgroup.events says "frozen 1" also when an ancestor is frozen.
            return "frozen 1" in (_v2_mount(root) / rel / "cgroup.events").read_text().splitlines()
        if "freezer" in controllers.split(","):
            return (root / "freezer" / rel / "freezer.state").read_text().strip() in ("FROZEN", "FREEZING")
    except OSError:
        pass
    return False


def _alive(pid: int) -> bool:
    state = proc_state(pid)
    return state is not None and state not in GONE


# -- the backend -----------------------------------------------------------------------------


class NvidiaBackend(GpuBackend):
    """NVML + libcuda. Raises (BackendError) when NVML cannot start, so ``auto`` falls back.

    ``nvml`` and ``driver`` replace the real layers (tests). A driver that cannot load is not
    fatal: inventory still works and :attr:`capabilities` says why locking is off.
    """

    name = "nvidia"
    simulated = False

    def __init__(self, nvml: NvmlApi | None = None, driver: CudaDriver | None = None, proc: Path = PROC) -> None:
        self._nvml = nvml if nvml is not None else PynvmlApi()
        self._proc = proc
        self._pids = PidMap(proc)
        self._unmapped: dict[int, list[int]] = {}
        try:
            self._count = self._nvml.device_count()
            if self._count < 1:
                raise BackendError("NVML found no NVIDIA GPU")
            self._driver_str = self._nvml.driver_version()
        except BackendError:
            self._nvml.shutdown()
            raise
        self._driver: CudaDriver | None = driver
        self._driver_error = ""
        if driver is None:
            try:
                self._driver = CtypesCudaDriver()
            except BackendError as exc:
                self._driver_error = str(exc)
                log.warning("NVIDIA driver API unavailable, drain will be cooperative: %s", exc)
        self._caps = self._detect_capabilities()

    # -- inventory -----------------------------------------------------------------------

    def gpu_count(self) -> int:
        return self._count

    def inventory(self) -> list[GpuInfo]:
        out: list[GpuInfo] = []
        for i in range(self._count):
            total, used = self._nvml.memory(i)
            sm, mem = self._nvml.clocks(i)
            mask = self._nvml.clock_event_reasons(i)
            out.append(
                GpuInfo(
                    index=i,
                    name=self._nvml.name(i),
                    uuid=self._nvml.uuid(i),
                    memory_total=total,
                    memory_used=used,
                    utilization_gpu=self._nvml.utilization(i),
                    sm_clock_mhz=sm,
                    mem_clock_mhz=mem,
                    throttle_reasons=decode_throttle_reasons(mask) if mask is not None else [],
                    simulated=False,
                )
            )
        return out

    def processes(self, gpu: int) -> list[GpuProcess]:
        """Processes with a context on ``gpu``, by the pids of *our* namespace (see :func:`local_pid`)."""
        if not 0 <= gpu < self._count:
            raise BackendError(f"no GPU {gpu}: this node has {self._count}")
        out: list[GpuProcess] = []
        unmapped: list[int] = []
        for pid, used in self._nvml.processes(gpu):
            mine = self._pids.lookup(pid)
            if mine is None:
                unmapped.append(pid)
                continue
            out.append(GpuProcess(pid=mine, gpu=gpu, used_memory=used))
        self._pids.sweep()
        if unmapped:
            log.info("GPU %d: NVML pids %s are not visible in this pid namespace", gpu, unmapped)
        self._unmapped[gpu] = unmapped
        return out

    def unmapped(self, gpu: int) -> list[int]:
        """NVML pids from the last :meth:`processes` call that this namespace cannot address."""
        return list(self._unmapped.get(gpu, []))

    # -- capabilities --------------------------------------------------------------------

    def _detect_capabilities(self) -> Capabilities:
        euid = os.geteuid()
        extra = DriverDetail(euid=euid, checkpoint_api=False)
        if self._driver is None:
            return Capabilities(
                lock=False,
                reason=f"the CUDA driver API is unavailable ({self._driver_error}); drain is cooperative",
                driver=self._driver_str,
                extra=extra,
            )
        cuda = self._driver.driver_version()
        extra["cuda_driver_version"] = cuda
        extra["cuda"] = version_string(cuda)
        if not self._driver.has_checkpoint:
            return Capabilities(
                lock=False,
                reason=(
                    f"driver {self._driver_str} (CUDA {version_string(cuda)}) has no "
                    "cuCheckpointProcessLock (needs R550 or newer); drain is cooperative"
                ),
                driver=self._driver_str,
                extra=extra,
            )
        extra["checkpoint_api"] = True
        if euid == 0:
            extra["lock_scope"] = "all-users"
            reason = "cuCheckpointProcessLock; running as root: may lock any user's GPU processes"
        else:
            extra["lock_scope"] = "same-user"
            reason = (
                f"cuCheckpointProcessLock; not root: may lock only processes of uid {euid} "
                "(other users' processes stay undrained)"
            )
        return Capabilities(lock=True, reason=reason, driver=self._driver_str, extra=extra)

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    # -- lock / unlock -------------------------------------------------------------------

    def _checkpoint_driver(self) -> CudaDriver:
        if self._driver is None or not self._caps.lock:
            raise BackendError(self._caps.reason)
        return self._driver

    def lock_check(self, pid: int, state: str | None, what: str, cgroups: dict[str, bool] | None = None) -> bool:
        """False if ``pid`` is gone; raises ProcessStopped where the driver's call would hang.

        One stat read (``state``) answers both "gone" and "stopped"; the frozen-cgroup check reads
        /proc/PID/cgroup. A drain makes these checks for every sibling, on its event loop (see
        :meth:`GpuBackend.lock_check`)."""
        if state is None or state in GONE:
            return False
        if state in STOPPED:
            raise ProcessStopped(
                f"pid {pid} is stopped (state {state}): the driver's {what} would hang on it; "
                "resume it first (lock before you freeze, thaw before you unlock)"
            )
        if cgroup_frozen(pid, self._proc, known=cgroups):
            raise ProcessStopped(f"pid {pid} is in a frozen cgroup: the driver's {what} would hang on it")
        return True

    def _explain(self, pid: int, exc: CudaError) -> BackendError:
        if exc.code == CUDA_ERROR_OPERATING_SYSTEM:
            uid = proc_uid(pid)
            if uid is not None and uid != os.geteuid() and os.geteuid() != 0:
                return BackendError(
                    f"pid {pid} belongs to uid {uid}: only root may lock another user's process ({exc})"
                )
        return exc

    def lock_pid(self, pid: int, timeout_s: float, checked: bool = False) -> LockOutcome:
        """:meth:`lock`, telling what it found. Raises BackendError (ProcessStopped, CudaError).

        The lock is asked for first and the driver's state only when it refuses: the driver
        refuses a process that is not RUNNING (already locked, checkpointed, without CUDA), so the
        state query, 0.09-0.13 ms a sibling on the H200, is paid only by the odd ones
        (tests/gpu/test_nvidia_driver.py holds the driver to that).
        """
        driver = self._checkpoint_driver()
        if not checked and not self.lock_check(pid, proc_state(pid), "lock"):
            return LockOutcome.GONE
        # 0 would mean "no timeout" to the driver: never let rounding produce it.
        timeout_ms = max(1, int(timeout_s * 1000))
        try:
            driver.checkpoint_lock(pid, timeout_ms)
        except CudaError as exc:
            found = self._after_refusal(driver, pid, exc)
            if isinstance(found, LockOutcome):
                return found
            if found is ProcessState.LOCKED:
                return LockOutcome.ALREADY_LOCKED
            if found is ProcessState.CHECKPOINTED:
                return LockOutcome.CHECKPOINTED
            if found is ProcessState.FAILED:
                raise BackendError(
                    f"pid {pid} is in the driver's FAILED checkpoint state; it cannot be locked"
                ) from exc
            raise self._explain(pid, exc) from exc  # RUNNING and still refused: a real failure
        return LockOutcome.LOCKED

    def _after_refusal(self, driver: CudaDriver, pid: int, exc: CudaError) -> ProcessState | LockOutcome:
        """What the process is now that the driver refused a lock or unlock of it (``exc``): GONE,
        NOT_CUDA, or the driver's state. A state query that fails otherwise raises ``exc``."""
        if not _alive(pid):
            return LockOutcome.GONE
        try:
            return driver.checkpoint_state(pid)
        except CudaError as why:
            if not _alive(pid):
                return LockOutcome.GONE
            if why.code in NOT_A_CUDA_PROCESS:
                return LockOutcome.NOT_CUDA
            raise self._explain(pid, exc) from exc

    def lock(self, pid: int, timeout_s: float, checked: bool = False) -> str:
        """Drain ``pid``; a process that is gone, already locked or not using CUDA is fine as is."""
        outcome = self.lock_pid(pid, timeout_s, checked)
        if outcome is not LockOutcome.LOCKED:
            log.debug("lock pid %d: %s", pid, outcome.value)
        return outcome.value

    def unlock(self, pid: int, checked: bool = False) -> None:
        """Undo :meth:`lock`. Safe (a no-op) when the process is gone, not locked or not CUDA.

        As for the lock, the state is asked only when the driver refuses the unlock."""
        driver = self._checkpoint_driver()
        if not checked and not self.lock_check(pid, proc_state(pid), "unlock"):
            return
        try:
            driver.checkpoint_unlock(pid)
        except CudaError as exc:
            found = self._after_refusal(driver, pid, exc)
            if isinstance(found, LockOutcome):
                return  # gone (its lock died with it) or never used CUDA: nothing to undo
            if found is ProcessState.LOCKED:
                raise  # alive and still locked: never swallowed
            # RUNNING: nothing to undo (idempotent, for the guardian's replay).
            if found is not ProcessState.RUNNING:
                log.warning("unlock pid %d: driver state %s, left as is", pid, found.name)

    def checkpoint_state(self, pid: int) -> ProcessState:
        """The driver's view of ``pid`` (tests and ``krex status``)."""
        return self._checkpoint_driver().checkpoint_state(pid)

    def close(self) -> None:
        self._pids.close()
        self._nvml.shutdown()

    def describe(self) -> BackendDescription:
        info = super().describe()
        info["driver"] = self._driver_str
        return info
