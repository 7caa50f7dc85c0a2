"""What KREX knows of each GPU vendor, in one place: the backend's name and class, and how a
process is placed on one of its devices (the visibility variables, the device forms they take).

Every other module asks here: the kernel provisioner and the pool place processes with
:meth:`Vendor.device_env`, clear a caller's placement with :func:`placement_variables`, and the
command lines offer :func:`backend_names`. A new backend is one :class:`Vendor` registered under
the entry-point group ``krex_lab.gpu_backends`` (as jupyter_client finds kernel provisioners):

    [project.entry-points."krex_lab.gpu_backends"]
    mygpu = "mypackage.krex:VENDOR"

Cheap to import: a backend's module (and its vendor library) is imported only when
:meth:`Vendor.load` builds it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import GpuBackend

log = logging.getLogger("krex.gpu")

ENTRY_POINT_GROUP = "krex_lab.gpu_backends"


@dataclass(frozen=True)
class Vendor:
    """One GPU backend as the rest of KREX sees it."""

    #: the backend's name (``--backend NAME``, the report's ``backend``)
    name: str
    #: ``"module:Class"`` of its :class:`~krex_lab.gpu.base.GpuBackend`, imported by :meth:`load`
    backend: str
    #: environment variables that place a process on this vendor's devices (all of them are
    #: cleared before a placement, so that a caller's own cannot narrow it further)
    visibility: tuple[str, ...] = ()
    #: ``(index, uuid) -> variables`` placing a process on one device (empty: no placement)
    place: Callable[[int, str], dict[str, str]] = field(default=lambda index, uuid: {})
    #: simulated devices (the fake backend): nothing is placed, nothing is real
    simulated: bool = False
    #: tried by ``--backend auto`` (in registration order); the fake backend is auto's fallback
    auto: bool = True

    def device_env(self, index: int, uuid: str = "") -> dict[str, str]:
        """The variables that place a process on device ``index`` (``uuid``: its stable id, where
        the vendor has one that its runtime accepts)."""
        return self.place(index, uuid)

    def load(self, **kwargs: Any) -> GpuBackend:
        """Build the backend (imports its module and vendor library now)."""
        module, _, cls = self.backend.partition(":")
        backend: GpuBackend = getattr(importlib.import_module(module), cls)(**kwargs)
        return backend


def _nvidia_place(index: int, uuid: str) -> dict[str, str]:
    # A UUID survives renumbering (another GPU's failure, a MIG reconfiguration); CUDA accepts
    # whole-GPU ("GPU-...") and MIG ("MIG-...") ids. Otherwise the index is NVML's, which numbers
    # GPUs in PCI bus order: make CUDA agree.
    device = uuid if uuid.startswith(("GPU-", "MIG-")) else str(index)
    return {"CUDA_VISIBLE_DEVICES": device, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _amd_place(index: int, uuid: str) -> dict[str, str]:
    # HIP's variable only: ROCR_VISIBLE_DEVICES filters first and HIP's index then counts within
    # what is left, so setting both to the same index N > 0 leaves no device at all.
    return {"HIP_VISIBLE_DEVICES": str(index)}


NVIDIA = Vendor(
    "nvidia",
    "krex_lab.gpu.nvidia:NvidiaBackend",
    visibility=("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"),
    place=_nvidia_place,
)
AMD = Vendor(
    "amd",
    "krex_lab.gpu.amd:AmdBackend",
    visibility=("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"),
    place=_amd_place,
)
FAKE = Vendor("fake", "krex_lab.gpu.fake:FakeBackend", simulated=True, auto=False)

_BUILTIN = (NVIDIA, AMD, FAKE)
_registry: dict[str, Vendor] | None = None


def vendors() -> dict[str, Vendor]:
    """Every known backend by name: the built-in ones, then those of installed packages' entry
    points (an entry point that fails to load is logged and left out, never fatal)."""
    global _registry
    if _registry is None:
        found = {v.name: v for v in _BUILTIN}
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in found and found[ep.name] in _BUILTIN:
                continue  # this package's own, declared for others to see
            try:
                vendor = ep.load()
            except Exception as exc:
                log.warning("GPU backend %r (%s) could not be loaded: %s", ep.name, ep.value, exc)
                continue
            if not isinstance(vendor, Vendor) or vendor.name != ep.name:
                log.warning("GPU backend entry point %r (%s) is not a Vendor named %r", ep.name, ep.value, ep.name)
                continue
            found[vendor.name] = vendor
        _registry = found
    return _registry


def vendor(name: str) -> Vendor:
    """The backend called ``name``; ValueError naming the known ones otherwise."""
    known = vendors()
    if name not in known:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(backend_names())}")
    return known[name]


def backend_names() -> list[str]:
    """What ``--backend`` accepts: ``auto``, then every known backend."""
    return ["auto", *vendors()]


def placement_variables() -> tuple[str, ...]:
    """Every vendor's visibility variables: what a placement decides and a caller never forwards."""
    return tuple(dict.fromkeys(var for v in vendors().values() for var in v.visibility))


def place(backend: str, index: int, uuid: str = "", *, simulated: bool = False) -> dict[str, str]:
    """The variables placing a process on device ``index`` of ``backend`` (empty where the devices
    are simulated or the backend is unknown: nothing real to place on)."""
    if simulated or backend not in vendors():
        return {}
    return vendor(backend).device_env(index, uuid)
