"""A small ctypes binding of ``libcuda.so.1``: just what the drain needs.

KREX drains another process's GPU work with the driver's checkpoint API
(``cuCheckpointProcessLock`` / ``Unlock`` / ``GetState``, see shared/FACTS.md). The caller
needs ``cuInit`` but no context of its own, so the arbiter never becomes a GPU process.

Two layers, so that tests can run without a GPU:

* :class:`CudaDriver` is the interface the NVIDIA backend uses; a test substitutes its own
  implementation (scripted states and errors, recorded calls).
* :class:`CtypesCudaDriver` implements it over a loaded library. It takes the library object
  as a parameter, so its own logic (argument structs, error naming) can be tested with a
  stand-in library made of plain Python callables.

Every failure is a :class:`CudaError`, a :class:`~krex_lab.errors.BackendError` that carries
the ``CUresult`` code and name.
"""

from __future__ import annotations

import abc
import ctypes
import enum
import threading
from collections.abc import Callable
from typing import Any

from ..errors import BackendError

CUDA_SUCCESS = 0

# Names for the codes KREX reasons about, so that messages stay readable even when the driver
# cannot name a code itself (cuGetErrorName fails, or the library never loaded).
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_OPERATING_SYSTEM = 304
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_TIMEOUT = 909
CUDA_ERROR_UNKNOWN = 999

KNOWN_ERRORS: dict[int, str] = {
    CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    CUDA_ERROR_NOT_INITIALIZED: "CUDA_ERROR_NOT_INITIALIZED",
    CUDA_ERROR_NO_DEVICE: "CUDA_ERROR_NO_DEVICE",
    CUDA_ERROR_OPERATING_SYSTEM: "CUDA_ERROR_OPERATING_SYSTEM",
    CUDA_ERROR_ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    CUDA_ERROR_NOT_FOUND: "CUDA_ERROR_NOT_FOUND",
    CUDA_ERROR_NOT_PERMITTED: "CUDA_ERROR_NOT_PERMITTED",
    CUDA_ERROR_NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
    CUDA_ERROR_TIMEOUT: "CUDA_ERROR_TIMEOUT",
    CUDA_ERROR_UNKNOWN: "CUDA_ERROR_UNKNOWN",
}

#: Codes with which the checkpoint API answers for a live pid that holds no CUDA state (it
#: never called cuInit, or it is not a CUDA process at all). Such a process has no GPU work,
#: so there is nothing to drain.
NOT_A_CUDA_PROCESS = frozenset({CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND})

CHECKPOINT_SYMBOLS = ("cuCheckpointProcessLock", "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState")


class ProcessState(enum.IntEnum):
    """``CUprocessState``."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class CudaError(BackendError):
    """A driver call returned something other than ``CUDA_SUCCESS``."""

    def __init__(self, call: str, code: int, name: str, description: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        self.description = description
        detail = f": {description}" if description else ""
        super().__init__(f"{call} failed with {name} ({code}){detail}")


class CUcheckpointLockArgs(ctypes.Structure):
    """``CUcheckpointLockArgs`` (cuda.h): a timeout, then reserved words that must be zero."""

    _fields_ = (
        ("timeoutMs", ctypes.c_uint),  # 0 means "no timeout": never pass 0 by accident
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    )


class CudaDriver(abc.ABC):
    """The driver operations the NVIDIA backend uses (pids are as this process sees them)."""

    @abc.abstractmethod
    def driver_version(self) -> int:
        """``cuDriverGetVersion``: 1000 * major + 10 * minor (13000 for CUDA 13.0)."""

    @property
    @abc.abstractmethod
    def has_checkpoint(self) -> bool:
        """The library exports the checkpoint lock API (drivers R550 and newer)."""

    @abc.abstractmethod
    def checkpoint_state(self, pid: int) -> ProcessState: ...

    @abc.abstractmethod
    def checkpoint_lock(self, pid: int, timeout_ms: int) -> None:
        """Block ``pid``'s next CUDA call and wait (up to ``timeout_ms``) for its submitted work."""

    @abc.abstractmethod
    def checkpoint_unlock(self, pid: int) -> None: ...


def version_string(version: int) -> str:
    """13000 -> "13.0"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class CtypesCudaDriver(CudaDriver):
    """:class:`CudaDriver` over ``libcuda.so.1`` (or over ``lib``, a stand-in for tests).

    Raises :class:`CudaError` (or BackendError) at construction when the library is missing or
    ``cuInit`` fails, so that the backend can say why it cannot lock.
    """

    LIBRARY = "libcuda.so.1"

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            try:
                lib = ctypes.CDLL(self.LIBRARY)
            except OSError as exc:
                raise BackendError(f"cannot load {self.LIBRARY}: {exc} (no NVIDIA driver here?)") from exc
        self._lib = lib
        self._name_lock = threading.Lock()
        self._get_error_name = self._bind("cuGetErrorName", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        self._get_error_string = self._bind("cuGetErrorString", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        init = self._bind("cuInit", ctypes.c_uint)
        get_version = self._bind("cuDriverGetVersion", ctypes.POINTER(ctypes.c_int))
        if init is None or get_version is None:
            raise BackendError(f"{self.LIBRARY} lacks cuInit/cuDriverGetVersion: not a CUDA driver library")
        self._check("cuInit", init(ctypes.c_uint(0)))
        version = ctypes.c_int(0)
        self._check("cuDriverGetVersion", get_version(ctypes.pointer(version)))
        self._version = version.value
        self._lock = self._bind("cuCheckpointProcessLock", ctypes.c_int, ctypes.POINTER(CUcheckpointLockArgs))
        # The unlock args struct is all reserved words; NULL is allowed, so declare a void*.
        self._unlock = self._bind("cuCheckpointProcessUnlock", ctypes.c_int, ctypes.c_void_p)
        self._get_state = self._bind("cuCheckpointProcessGetState", ctypes.c_int, ctypes.POINTER(ctypes.c_int))

    def _bind(self, name: str, *argtypes: Any) -> Callable[..., int] | None:
        try:
            fn = getattr(self._lib, name)
        except AttributeError:  # an older driver: the symbol is simply absent
            return None
        if fn is None:
            return None
        if hasattr(fn, "argtypes"):  # a real ctypes function pointer (stand-ins are plain callables)
            fn.argtypes = list(argtypes)
            fn.restype = ctypes.c_int
        return fn

    # -- errors --------------------------------------------------------------------------

    def error_name(self, code: int) -> str:
        return self._describe(self._get_error_name, code) or KNOWN_ERRORS.get(code, f"CUresult {code}")

    def error_string(self, code: int) -> str:
        return self._describe(self._get_error_string, code) or ""

    def _describe(self, fn: Callable[..., int] | None, code: int) -> str | None:
        if fn is None:
            return None
        out = ctypes.c_char_p()
        with self._name_lock:
            rc = fn(ctypes.c_int(code), ctypes.pointer(out))
        if rc != CUDA_SUCCESS or not out.value:
            return None
        return out.value.decode(errors="replace")

    def _check(self, call: str, rc: int) -> None:
        if rc != CUDA_SUCCESS:
            raise CudaError(call, rc, self.error_name(rc), self.error_string(rc))

    # -- CudaDriver ----------------------------------------------------------------------

    def driver_version(self) -> int:
        return self._version

    @property
    def has_checkpoint(self) -> bool:
        return None not in (self._lock, self._unlock, self._get_state)

    def _need(self, fn: Callable[..., int] | None, name: str) -> Callable[..., int]:
        if fn is None:
            raise BackendError(
                f"{name} is not exported by this driver (CUDA {version_string(self._version)}); "
                "the checkpoint lock needs driver R550 or newer"
            )
        return fn

    def checkpoint_state(self, pid: int) -> ProcessState:
        fn = self._need(self._get_state, "cuCheckpointProcessGetState")
        state = ctypes.c_int(-1)
        self._check(f"cuCheckpointProcessGetState(pid={pid})", fn(ctypes.c_int(pid), ctypes.pointer(state)))
        try:
            return ProcessState(state.value)
        except ValueError:
            raise BackendError(f"pid {pid}: unknown CUprocessState {state.value}") from None

    def checkpoint_lock(self, pid: int, timeout_ms: int) -> None:
        fn = self._need(self._lock, "cuCheckpointProcessLock")
        if timeout_ms < 1:
            raise ValueError("timeout_ms must be >= 1 (0 would mean 'wait forever' to the driver)")
        args = CUcheckpointLockArgs(timeoutMs=timeout_ms)
        self._check(f"cuCheckpointProcessLock(pid={pid})", fn(ctypes.c_int(pid), ctypes.pointer(args)))

    def checkpoint_unlock(self, pid: int) -> None:
        fn = self._need(self._unlock, "cuCheckpointProcessUnlock")
        self._check(f"cuCheckpointProcessUnlock(pid={pid})", fn(ctypes.c_int(pid), None))
