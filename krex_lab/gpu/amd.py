"""AMD backend: inventory and processes through amdsmi; no driver-level lock.

ROCm has no equivalent of the NVIDIA driver's checkpoint lock, so on AMD GPUs the drain is
cooperative (KREX-aware processes synchronise and pause when asked) and the region report
names every process that could not be drained. amdsmi is imported when the backend is built,
never at ``import krex_lab``; its Python API changed across ROCm releases, so every reading
tolerates both shapes that exist in the field and ``None`` where a GPU does not report.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..errors import BackendError
from .base import Capabilities, GpuBackend, GpuInfo, GpuProcess

log = logging.getLogger("krex.gpu.amd")

NO_LOCK_REASON = "AMD GPUs have no driver-level process lock; drain is cooperative"
_MIB = 1 << 20


def _num(value: Any) -> float | None:
    # amdsmi writes "N/A" for readings a GPU does not have.
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class AmdBackend(GpuBackend):
    """GPUs seen by amdsmi. Raises BackendError if amdsmi is missing or finds no GPU.

    ``smi`` replaces the ``amdsmi`` module (tests).
    """

    name = "amd"
    simulated = False

    def __init__(self, smi: Any = None) -> None:
        if smi is None:
            try:
                import amdsmi
            except ImportError as exc:
                raise BackendError("amdsmi is not installed: pip install 'krex-lab[amd]'") from exc
            smi = amdsmi
        self._smi = smi
        self._lock = threading.Lock()
        try:
            flags = getattr(getattr(smi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            if flags is not None:
                smi.amdsmi_init(flags)
            else:
                smi.amdsmi_init()
            self._handles: list[Any] = list(smi.amdsmi_get_processor_handles())
        except Exception as exc:  # amdsmi raises its own AmdSmiException hierarchy
            raise BackendError(f"amdsmi init failed: {exc}") from exc
        if not self._handles:
            self.close()
            raise BackendError("amdsmi found no AMD GPU")
        self._open = True
        self._driver = self._read_driver()

    def _try(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self._smi, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            log.debug("amdsmi %s: %s", fn_name, exc)
            return None

    def _read_driver(self) -> str:
        info = self._try("amdsmi_get_gpu_driver_info", self._handles[0])
        if isinstance(info, dict):
            return str(info.get("driver_version", ""))
        return ""

    def gpu_count(self) -> int:
        return len(self._handles)

    def _clock(self, handle: Any, kind: str) -> int | None:
        clk_type = getattr(getattr(self._smi, "AmdSmiClkType", None), kind, None)
        if clk_type is None:
            return None
        info = self._try("amdsmi_get_clock_info", handle, clk_type)
        if not isinstance(info, dict):
            return None
        value = _num(info.get("clk", info.get("cur_clk")))  # key renamed across ROCm releases
        return int(value) if value is not None else None

    def _throttle(self, handle: Any) -> list[str]:
        metrics = self._try("amdsmi_get_gpu_metrics_info", handle)
        if not isinstance(metrics, dict):
            return []
        status = metrics.get("throttle_status")
        if isinstance(status, bool):
            return ["throttled"] if status else []
        value = _num(status)
        return ["throttled"] if value else []

    def inventory(self) -> list[GpuInfo]:
        out: list[GpuInfo] = []
        for i, handle in enumerate(self._handles):
            asic = self._try("amdsmi_get_gpu_asic_info", handle)
            name = str(asic.get("market_name", "")) if isinstance(asic, dict) else ""
            uuid = self._try("amdsmi_get_gpu_device_uuid", handle)
            vram = self._try("amdsmi_get_gpu_vram_usage", handle)
            total = used = 0
            if isinstance(vram, dict):
                # amdsmi reports VRAM in MiB.
                total = int((_num(vram.get("vram_total")) or 0) * _MIB)
                used = int((_num(vram.get("vram_used")) or 0) * _MIB)
            activity = self._try("amdsmi_get_gpu_activity", handle)
            util = _num(activity.get("gfx_activity")) if isinstance(activity, dict) else None
            out.append(
                GpuInfo(
                    index=i,
                    name=name or f"AMD GPU {i}",
                    uuid=str(uuid) if uuid else "",
                    memory_total=total,
                    memory_used=used,
                    utilization_gpu=util,
                    sm_clock_mhz=self._clock(handle, "GFX"),
                    mem_clock_mhz=self._clock(handle, "MEM"),
                    throttle_reasons=self._throttle(handle),
                )
            )
        return out

    def processes(self, gpu: int) -> list[GpuProcess]:
        if not 0 <= gpu < len(self._handles):
            raise BackendError(f"no GPU {gpu}: this node has {len(self._handles)}")
        handle = self._handles[gpu]
        fn = getattr(self._smi, "amdsmi_get_gpu_process_list", None)
        if fn is None:
            return []
        try:
            entries = fn(handle)
        except Exception as exc:
            raise BackendError(f"amdsmi process list of GPU {gpu} failed: {exc}") from exc
        out: dict[int, GpuProcess] = {}
        for entry in entries or []:
            # ROCm 6.1+: dicts; older releases: handles to resolve with amdsmi_get_gpu_process_info.
            info = entry
            if not isinstance(entry, dict):
                info = self._try("amdsmi_get_gpu_process_info", handle, entry)
            if not isinstance(info, dict) or _num(info.get("pid")) is None:
                continue
            pid = int(info["pid"])
            mem = info.get("memory_usage")
            used = _num(mem.get("vram_mem")) if isinstance(mem, dict) else _num(info.get("mem"))
            out[pid] = GpuProcess(pid=pid, gpu=gpu, used_memory=int(used) if used is not None else None)
        return sorted(out.values(), key=lambda p: p.pid)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(lock=False, reason=NO_LOCK_REASON, driver=self._driver)

    def close(self) -> None:
        with self._lock:
            if getattr(self, "_open", True):
                self._open = False
                try:
                    self._smi.amdsmi_shut_down()
                except Exception as exc:
                    log.debug("amdsmi shutdown: %s", exc)
