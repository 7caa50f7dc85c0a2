"""Inside a worker: frameworks preloaded once, and the state a job may leave behind undone.

:class:`Baseline` is taken after the frameworks are imported and their contexts created; a
reset (between leases, after every job without a lease) puts back what a job can change
(cwd, argv, sys.path, environment, signal handlers, stdio, logging, warnings, user modules,
the public names of every module loaded before it, random's and NumPy's global seeds, torch's
global flags), empties the frameworks' GPU memory caches and checks that GPU memory is back to
the baseline. What stays shared is written in docs/workers.md ("What a job shares"). What
cannot be put back makes the reset *unclean*, and the pool then recycles the worker: GPU memory
still held, threads or child processes left running, a sticky CUDA error on synchronisation.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import site
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...devsync import numba_context, numba_free_pending
from ...procutil import proc_state

_SIGNALS = [
    s
    for s in (
        "SIGINT",
        "SIGTERM",
        "SIGALRM",
        "SIGHUP",
        "SIGUSR1",
        "SIGUSR2",
        "SIGCHLD",
        "SIGPIPE",
        "SIGQUIT",
        "SIGVTALRM",
        "SIGPROF",
    )
    if hasattr(signal, s)
]


def preload(names: list[str], real_gpu: bool, warmup: bool) -> tuple[list[str], dict[str, str], dict[str, float]]:
    """Import each framework (and on a real GPU create its context). Returns loaded, skipped, seconds."""
    loaded: list[str] = []
    skipped: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        before = set(sys.modules)
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            # A failed import leaves the submodules it had finished in sys.modules; a job's later
            # import would then build a new package object that lacks them as attributes
            # ("module 'numba.cuda' has no attribute 'datamodel'" in every job). Forget what the
            # attempt added under the package, so that a job imports it afresh. Only there: what
            # it imported on the way (numpy, say) stays, as an extension module may refuse to be
            # loaded twice in one process.
            for partial in set(sys.modules) - before:
                if partial == name or partial.startswith(name + "."):
                    del sys.modules[partial]
            why = "not importable" if isinstance(exc, ImportError) else type(exc).__name__
            skipped[name] = f"{why}: {exc}"
        else:
            try:
                if real_gpu:
                    _init_context(name, module, warmup)
                loaded.append(name)
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {exc}"
        seconds[name] = round(time.perf_counter() - t0, 4)
    return loaded, skipped, seconds


def _init_context(name: str, module: Any, warmup: bool) -> None:
    if name == "torch":
        if not module.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        x = module.ones((64, 64), device="cuda")
        if warmup:  # loads cuBLAS, so the first job's matmul does not pay it
            (x @ x).sum().item()
        del x
        module.cuda.synchronize()
        module.cuda.empty_cache()
    elif name == "cupy":
        x = module.ones((64, 64), dtype=module.float32)
        if warmup:
            float((x @ x).sum())
        del x
        module.cuda.runtime.deviceSynchronize()
        module.get_default_memory_pool().free_all_blocks()
    elif name in ("numba.cuda", "numba"):
        from numba import cuda

        cuda.current_context()
        if warmup:
            cuda.device_array(16).copy_to_host()
        cuda.synchronize()


def gpu_memory() -> dict[str, int]:
    """Device bytes in use by the frameworks that are initialised in this process."""
    used: dict[str, int] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                used["torch"] = int(torch.cuda.memory_allocated())
        except Exception:
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            used["cupy"] = int(cupy.get_default_memory_pool().used_bytes())
        except Exception:
            pass
    process = _nvml_process_memory()
    if process is not None:
        used["process"] = process
    return used


_nvml: Any = None


def _nvml_init() -> None:
    """Open NVML once, in workers on a real NVIDIA GPU (per-process memory for the reset check)."""
    global _nvml
    if _nvml is not None or os.environ.get("KREX_WORKER_REAL") != "1":
        return
    try:
        import pynvml

        pynvml.nvmlInit()
        _nvml = pynvml
    except Exception:
        _nvml = False


def _nvml_process_memory() -> int | None:
    """This process's device memory as NVML sees it (None where NVML cannot say, e.g. another pid namespace)."""
    if not _nvml:
        return None
    try:
        pynvml = _nvml
        total, found = 0, False
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid() and p.usedGpuMemory is not None:
                    total += int(p.usedGpuMemory)
                    found = True
        return total if found else None
    except Exception:
        return None


def empty_caches() -> list[str]:
    """Synchronise and empty the frameworks' memory caches. Returns the errors met (sticky CUDA errors)."""
    errors: list[str] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as exc:
            errors.append(f"torch: {exc}")
    cupy = sys.modules.get("cupy")
    if cupy is not None and "cupy.cuda" in sys.modules:
        try:
            cupy.cuda.runtime.deviceSynchronize()
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
        except Exception as exc:
            errors.append(f"cupy: {exc}")
    ctx = numba_context()
    if ctx is not None:
        try:
            numba_free_pending(ctx)
            ctx.synchronize()
        except Exception as exc:
            errors.append(f"numba: {exc}")
    return errors


@dataclass(frozen=True)
class TorchFlags:
    """torch's global switches as the worker's baseline had them; a job may flip any of them
    (taken by :func:`_torch_flags`, put back by :func:`_restore_torch`)."""

    matmul_tf32: bool
    cudnn_tf32: bool
    cudnn_benchmark: bool
    cudnn_deterministic: bool
    dtype: Any  # a torch.dtype (torch is not imported here)
    precision: str
    deterministic: bool
    grad: bool
    threads: int


def _torch_flags() -> TorchFlags | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return TorchFlags(
            matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
            cudnn_tf32=torch.backends.cudnn.allow_tf32,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            dtype=torch.get_default_dtype(),
            precision=torch.get_float32_matmul_precision(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            grad=torch.is_grad_enabled(),
            threads=torch.get_num_threads(),
        )
    except Exception:
        return None


def _restore_torch(flags: TorchFlags) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = flags.matmul_tf32
    torch.backends.cudnn.allow_tf32 = flags.cudnn_tf32
    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    torch.backends.cudnn.deterministic = flags.cudnn_deterministic
    torch.set_default_dtype(flags.dtype)
    torch.set_float32_matmul_precision(flags.precision)
    # only when a job changed it: the first call in a process imports what the setting touches
    # (1.4 s on a CPU), which made every worker's first reset take that long
    if torch.are_deterministic_algorithms_enabled() != flags.deterministic:
        torch.use_deterministic_algorithms(flags.deterministic)
    torch.set_grad_enabled(flags.grad)
    if torch.get_num_threads() != flags.threads:
        torch.set_num_threads(flags.threads)


_MISSING = object()


class ModuleBindings:
    """The public names of loaded modules as they were (the objects themselves, not copies), so
    that a job's ``json.dumps = None``, ``del os.sep`` or ``builtins.x = 1`` does not reach the next.

    Names with a leading underscore are left alone (modules cache there lazily; restoring them
    could undo an initialisation whose effect lives on in C), as is anything inside an object.
    KREX's own modules and ``__main__`` keep their state: they manage it."""

    def __init__(self) -> None:
        #: module name -> (the module, its namespace as it was: any names and values)
        self.saved: dict[str, tuple[ModuleType, dict[str, Any]]] = {}

    def take(self, names: set[str]) -> None:
        main = sys.modules.get("__main__")  # also under other names (multiprocessing's __mp_main__)
        for name in names:
            module = sys.modules.get(name)
            if isinstance(module, ModuleType) and module is not main and name.partition(".")[0] != "krex_lab":
                self.saved[name] = (module, dict(vars(module)))

    def restore(self) -> list[str]:
        """Put back what changed; returns ``module.name`` of each name put back or removed."""
        changed: list[str] = []
        for name, (module, saved) in self.saved.items():
            current = vars(module)
            try:
                if current == saved:  # in C, and the same objects compare equal at once
                    continue
            except Exception:  # a rebound array's __eq__ does not answer one bool
                pass
            for key, value in saved.items():
                if not key.startswith("_") and current.get(key, _MISSING) is not value:
                    current[key] = value
                    changed.append(f"{name}.{key}")
            for key in [k for k, v in current.items() if k not in saved and not k.startswith("_")]:
                if isinstance(current[key], ModuleType):  # a submodule imported since: it stays
                    saved[key] = current[key]
                else:
                    del current[key]
                    changed.append(f"{name}.{key}")
            # private names as they are now: the next quick comparison is of what a job changes
            saved.update((k, v) for k, v in current.items() if k.startswith("_"))
            for key in [k for k in saved if k.startswith("_") and k not in current]:
                del saved[key]
        return changed


def reseed() -> None:
    """Fresh seeds, as a new interpreter draws them: a job's ``random.seed(0)`` must not make the
    next job's draws repeat (nor the baseline's state make every job draw the same)."""
    rand = sys.modules.get("random")
    if rand is not None:
        rand.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass


def _installed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:
        pass
    # KREX's own package, wherever it is (an editable install is outside site-packages): a job
    # that imports krex_lab.evaluate or krex_lab.bench must not pay their import again next time.
    roots.add(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


class Baseline:
    """What the worker looked like when it was ready; :meth:`restore` goes back to it."""

    def __init__(self, memory_slack: int) -> None:
        self.memory_slack = memory_slack
        self.cwd = os.getcwd()
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        self.environ = dict(os.environ)
        self.modules = set(sys.modules)
        self.bindings = ModuleBindings()
        self.bindings.take(self.modules)
        #: the names of loaded modules the last reset put back (``module.name``)
        self.put_back: list[str] = []
        self.roots = _installed_roots()
        self.threads = {t.ident for t in threading.enumerate()}
        self.handlers = {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS}
        self.stdio = (sys.stdin, sys.stdout, sys.stderr)
        self.fds = {fd: os.dup(fd) for fd in (0, 1, 2)}
        for fd in self.fds.values():
            os.set_inheritable(fd, False)
        self.hooks = (sys.excepthook, sys.displayhook, sys.breakpointhook)
        self.warnings = list(warnings.filters)
        root = logging.getLogger()
        self.logging = (list(root.handlers), root.level)
        self.recursion = sys.getrecursionlimit()
        self.torch = _torch_flags()
        _nvml_init()
        empty_caches()
        gc.collect()
        self.memory = gpu_memory()
        self.timings: dict[str, float] = {}

    def restore(self) -> list[str]:
        """Put the process back; returns the reasons it cannot be trusted any more (empty: clean).

        ``self.timings`` says how long each part took (seconds)."""
        t0 = time.perf_counter()
        problems: list[str] = []
        for fd, saved in self.fds.items():
            try:
                os.dup2(saved, fd)
            except OSError as exc:
                problems.append(f"fd {fd}: {exc}")
        sys.stdin, sys.stdout, sys.stderr = self.stdio
        sys.excepthook, sys.displayhook, sys.breakpointhook = self.hooks
        try:
            os.chdir(self.cwd)
        except OSError as exc:
            problems.append(f"cwd: {exc}")
        sys.argv[:] = self.argv
        sys.path[:] = self.path
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        signal.alarm(0)
        for name, handler in self.handlers.items():
            try:
                signal.signal(getattr(signal, name), handler)
            except (OSError, ValueError, TypeError):
                pass
        warnings.filters[:] = self.warnings  # type: ignore[index]
        root = logging.getLogger()
        root.handlers[:] = self.logging[0]
        root.setLevel(self.logging[1])
        sys.setrecursionlimit(self.recursion)
        if self.torch is not None:
            try:
                _restore_torch(self.torch)
            except Exception as exc:
                problems.append(f"torch flags: {exc}")
        t1 = time.perf_counter()
        self._drop_user_modules()
        t_drop = time.perf_counter()
        self.put_back = self.bindings.restore()
        reseed()
        t_bind = time.perf_counter()
        importlib.invalidate_caches()
        t2 = time.perf_counter()
        extra = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]
        if extra:
            problems.append(f"threads left running: {', '.join(t.name for t in extra[:5])}")
        problems.extend(self._children())
        t3 = time.perf_counter()
        problems.extend(self._memory())
        t4 = time.perf_counter()
        self.timings = {
            "state": t1 - t0,
            "modules": t_drop - t1,
            "bindings": t_bind - t_drop,
            "import_caches": t2 - t_bind,
            "processes": t3 - t2,
            "memory": t4 - t3,
        }
        return problems

    def _drop_user_modules(self) -> None:
        """Forget modules a job imported from outside the installed packages (edited candidates reload).

        Installed modules a job imported stay, and are remembered, so each is looked at once."""
        kept = set()
        for name in [n for n in sys.modules if n not in self.modules]:
            module = sys.modules.get(name)
            where = getattr(module, "__file__", None)
            paths = [where] if where else list(getattr(module, "__path__", None) or [])
            if paths and not all(os.path.realpath(p).startswith(self.roots) for p in paths):
                del sys.modules[name]
            else:
                kept.add(name)
        # Kept from here on as the job that imported them left them (the job came first).
        self.modules |= kept
        self.bindings.take(kept)

    def _children(self) -> list[str]:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        from ..contain import kept, tree_without

        # an evaluation judge's zygote and spare are kept on purpose (krex_lab.evaluate.judge.spares)
        spared = {pid for pid, _ in kept()}
        live = [p for p in tree_without(os.getpid(), spared)[1:] if proc_state(p) not in (None, "Z")]
        return [f"child processes left running: {live[:5]}"] if live else []

    def _grown(self, now: dict[str, int]) -> dict[str, int]:
        return {k: now.get(k, 0) - v for k, v in self.memory.items() if now.get(k, 0) > v + self.memory_slack}

    def _memory(self) -> list[str]:
        errors = empty_caches()
        if errors:
            return [f"CUDA error on synchronisation: {e}" for e in errors]
        now = gpu_memory()
        if self._grown(now):
            gc.collect()
            empty_caches()
            now = gpu_memory()
        return [f"GPU memory not back to baseline ({k}: +{d / 2**20:.1f} MiB)" for k, d in self._grown(now).items()]
