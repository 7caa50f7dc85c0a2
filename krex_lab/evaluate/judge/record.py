"""The reproducibility record of an evaluation: :func:`collect`, called by the judge as it starts.

What it takes to run the same evaluation again and to compare two results: package versions, the
GPU (name, UUID, driver, its clocks at the start), the seeds, the hash of every source (the
reference, the candidate, each laid-out file of a published problem), the timing method with
every setting it runs under, the tolerances. The parts that do not change within a process
(versions, the GPU's name and driver, a file's hash) are read once and kept, so a call after the
first costs a few tens of microseconds plus one NVML clock reading on a GPU.

It imports nothing heavy: torch only where the judge has imported it already, NVML through
:mod:`krex_lab.gpu.nvml` (nvidia-ml-py) only on a CUDA device.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import platform
import socket
import sys
from typing import Any

from ..numerics import settings_for
from ..options import Job
from ..result import Packages, Reproducibility

__all__ = ["collect", "packages", "timing_settings"]

_PACKAGES = ("krex_lab", "torch", "triton", "numpy")
#: distribution names where they differ from the module's
_DISTRIBUTION = {"krex_lab": "krex-lab"}


def _version(module: str) -> str | None:
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None) if loaded is not None else None
    if isinstance(version, str):
        return str(version)  # torch's is a str subclass (TorchVersion) that msgpack will not take
    try:
        return importlib.metadata.version(_DISTRIBUTION.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _static_packages() -> tuple[tuple[str, str | None], ...]:
    return tuple((m, _version(m)) for m in _PACKAGES)


def packages() -> Packages:
    """The versions of Python and of the packages an evaluation's figures depend on."""
    found = dict(_static_packages())
    torch = sys.modules.get("torch")
    if found["torch"] is None and torch is not None:  # imported since the first call
        found["torch"] = str(getattr(torch, "__version__", "")) or None
    build = None
    if torch is not None:
        tv = getattr(torch, "version", None)
        build = getattr(tv, "cuda", None) or getattr(tv, "hip", None)
    return Packages(python=platform.python_version(), torch_cuda=build, **found)


def timing_settings(job: Job) -> dict[str, str | float | int | bool]:
    """The timing method asked for and every setting it runs under (those of its format)."""
    o = job.options
    out: dict[str, str | float | int | bool] = {
        "timing": o.timing,
        "measure": o.measure,
        "exclusive": o.exclusive,
        "strict": o.strict,
    }
    if job.format == "kernelbench":
        out.update(trials=o.trials, perf_trials=o.perf_trials, warmup_calls=o.warmup_calls)
    else:
        out.update(mode=o.mode, warmup_s=o.warmup_s, max_case_s=o.max_case_s)
        if o.timing == "converge":
            out.update(max_rel_err=o.converge_rel_err)
        else:
            out.update(min_runs=o.min_runs, max_runs=o.max_runs, max_rel_err=o.max_rel_err)
    return out


@functools.lru_cache(maxsize=256)
def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()


class _Gpu:
    """NVML, opened once per process: the static facts of a GPU by index, and its clocks now."""

    def __init__(self, api: Any = None) -> None:
        self.api = api
        self.static: dict[int, tuple[str | None, str | None]] = {}
        self.driver: str | None = None
        self.failed = False

    def _open(self) -> Any:
        if self.api is None and not self.failed:
            try:
                from ...gpu.nvml import PynvmlApi

                self.api = PynvmlApi()
            except Exception:  # no NVML here (an AMD GPU, a container without it): the record says less
                self.failed = True
        return self.api

    def index_of(self, uuid: str | None) -> int | None:
        api = self._open()
        if api is None or uuid is None:
            return None
        with contextlib.suppress(Exception):
            for i in range(api.device_count()):
                if self.facts(i)[1] == uuid:
                    return i
        return None

    def facts(self, index: int) -> tuple[str | None, str | None]:
        """(name, UUID) of GPU ``index``; the driver's version in ``self.driver``."""
        if index not in self.static:
            api = self._open()
            name = uuid = None
            if api is not None:
                with contextlib.suppress(Exception):
                    name, uuid = api.name(index), api.uuid(index)
                    self.driver = self.driver or api.driver_version()
            self.static[index] = (name, uuid)
        return self.static[index]

    def clocks(self, index: int) -> dict[str, int]:
        api = self._open()
        if api is None:
            return {}
        try:
            sm, mem = api.clocks(index)
        except Exception:
            return {}
        return {k: int(v) for k, v in (("sm", sm), ("memory", mem)) if v is not None}


_GPU = _Gpu()


@functools.lru_cache(maxsize=16)
def _torch_uuid(device_index: int) -> str | None:
    """The NVML-style UUID (``GPU-...``) of torch's CUDA device ``device_index``."""
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)  # type: ignore[union-attr]
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    return None


def _cuda_device() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    with contextlib.suppress(Exception):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    return None


def collect(
    job: Job,
    *,
    seed: int | None,
    device: str,
    nvml_index: int | None = None,
    nvml: Any = None,
) -> Reproducibility:
    """The record of ``job`` as the judge starts it.

    ``seed``: the seed the caller gave (``job.options.seed``; None: each set's drawn alone); ``device``: the
    device's name as the result states it (the GPU's model, or ``cpu: <model>``). ``nvml_index``:
    the GPU's NVML index where the caller knows it (default: found by the UUID of torch's current
    CUDA device, where torch has initialised CUDA; none on a CPU). ``nvml``: an
    :class:`~krex_lab.gpu.nvml.NvmlApi` to read instead of the process's own (tests).
    """
    gpu = _GPU if nvml is None else _Gpu(nvml)
    if nvml_index is None and nvml is None:
        cuda = _cuda_device()
        if cuda is not None:
            nvml_index = gpu.index_of(_torch_uuid(cuda))
    name = uuid = None
    clocks: dict[str, int] = {}
    if nvml_index is not None:
        name, uuid = gpu.facts(nvml_index)
        clocks = gpu.clocks(nvml_index)
    o = job.options
    return Reproducibility(
        packages=packages(),
        device=device,
        gpu_name=name,
        gpu_uuid=uuid,
        driver=gpu.driver if nvml_index is not None else None,
        clocks_mhz=clocks,
        seed=seed,
        seed_given=o.seed is not None,
        init_seed=o.init_seed if job.format == "kernelbench" else None,
        reference_sha256=job.reference.sha256,
        candidate_sha256=job.candidate.sha256,
        files={n: _sha256(t) for n, t in sorted(job.files.items())},
        task=job.task.path if job.task is not None else None,
        timing=timing_settings(job),
        tolerances={"atol": o.atol, "rtol": o.rtol},
        numerics=settings_for(job.format) or {},
        hostname=_hostname(),
    )


@functools.lru_cache(maxsize=1)
def _hostname() -> str:
    return socket.gethostname()
