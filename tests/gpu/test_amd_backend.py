"""AMD backend over a stand-in ``amdsmi`` module (no AMD GPU in CI)."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from krex_lab.errors import BackendError
from krex_lab.gpu.amd import NO_LOCK_REASON, AmdBackend


class StandInSmi:
    """The few amdsmi calls the backend makes; process lists in both historical shapes."""

    class AmdSmiInitFlags(enum.IntEnum):
        INIT_AMD_GPUS = 2

    class AmdSmiClkType(enum.IntEnum):
        GFX = 0
        MEM = 3

    def __init__(self, gpus: int = 2, old_process_api: bool = False) -> None:
        self.handles = [object() for _ in range(gpus)]
        self.old = old_process_api
        self.init_flags: Any = None
        self.shut = 0

    def amdsmi_init(self, flags: Any = None) -> None:
        self.init_flags = flags

    def amdsmi_shut_down(self) -> None:
        self.shut += 1

    def amdsmi_get_processor_handles(self) -> list[object]:
        return self.handles

    def amdsmi_get_gpu_driver_info(self, h: object) -> dict[str, str]:
        return {"driver_name": "amdgpu", "driver_version": "6.8.5"}

    def amdsmi_get_gpu_asic_info(self, h: object) -> dict[str, Any]:
        return {"market_name": "AMD Instinct MI300X"}

    def amdsmi_get_gpu_device_uuid(self, h: object) -> str:
        return f"uuid-{self.handles.index(h)}"

    def amdsmi_get_gpu_vram_usage(self, h: object) -> dict[str, int]:
        return {"vram_total": 196592, "vram_used": 1024}  # MiB

    def amdsmi_get_gpu_activity(self, h: object) -> dict[str, Any]:
        return {"gfx_activity": 37, "umc_activity": "N/A", "mm_activity": "N/A"}

    def amdsmi_get_clock_info(self, h: object, kind: Any) -> dict[str, Any]:
        if kind == self.AmdSmiClkType.MEM:
            return {"cur_clk": 1300}  # the older key
        return {"clk": 2100, "min_clk": 500, "max_clk": 2100}

    def amdsmi_get_gpu_metrics_info(self, h: object) -> dict[str, Any]:
        raise RuntimeError("not supported on this ASIC")

    def amdsmi_get_gpu_process_list(self, h: object) -> list[Any]:
        if self.handles.index(h) == 1:
            return []
        if self.old:
            return ["p1", "p2"]
        return [{"pid": 4242, "mem": 1, "memory_usage": {"vram_mem": 8 << 20}}, {"pid": "N/A"}]

    def amdsmi_get_gpu_process_info(self, h: object, p: str) -> dict[str, Any]:
        return {"pid": 100 if p == "p1" else 101, "mem": 4096}


def test_inventory_and_capabilities() -> None:
    smi = StandInSmi()
    be = AmdBackend(smi=smi)
    assert smi.init_flags == StandInSmi.AmdSmiInitFlags.INIT_AMD_GPUS
    inv = be.inventory()
    assert [g.index for g in inv] == [0, 1] and be.gpu_count() == 2
    g = inv[0]
    assert (g.name, g.uuid, g.memory_total, g.memory_used) == ("AMD Instinct MI300X", "uuid-0", 196592 << 20, 1 << 30)
    assert (g.utilization_gpu, g.sm_clock_mhz, g.mem_clock_mhz, g.throttle_reasons) == (37.0, 2100, 1300, [])
    assert g.simulated is False
    caps = be.capabilities
    assert caps.lock is False and caps.reason == NO_LOCK_REASON and caps.driver == "6.8.5"
    with pytest.raises(NotImplementedError):
        be.lock(1, 1.0)
    be.close()
    be.close()
    assert smi.shut == 1


def test_processes_in_both_api_shapes() -> None:
    new = AmdBackend(smi=StandInSmi())
    assert [(p.pid, p.gpu, p.used_memory) for p in new.processes(0)] == [(4242, 0, 8 << 20)]
    assert new.processes(1) == []
    old = AmdBackend(smi=StandInSmi(old_process_api=True))
    assert [(p.pid, p.used_memory) for p in old.processes(0)] == [(100, 4096), (101, 4096)]
    with pytest.raises(BackendError, match="no GPU 2"):
        old.processes(2)


def test_no_gpu_or_no_library_raises() -> None:
    smi = StandInSmi(gpus=0)
    with pytest.raises(BackendError, match="no AMD GPU"):
        AmdBackend(smi=smi)
    assert smi.shut == 1
    try:
        import amdsmi  # noqa: F401
    except ImportError:
        with pytest.raises(BackendError, match="amdsmi is not installed"):
            AmdBackend()
