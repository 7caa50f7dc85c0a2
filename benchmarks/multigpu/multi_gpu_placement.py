"""Part A of ``multi_gpu.py``: four krex kernels started without ``KREX_GPU`` must land two on each GPU
(through jupyter_client's kernel provisioner; if that fails, ``krex_lab.attach`` processes, which do
not count as the check)."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "regions"))  # fidelity's harness and roles
from fidelity import Child
from fidelity_roles import MSG
from multi_gpu_report import Terminated, say

PROVISIONER_GROUP = "jupyter_client.kernel_provisioners"


def ensure_provisioner_entry_point(tmp: Path) -> str:
    """Make jupyter_client find ``krex-provisioner``; where krex_lab is not installed, from a temporary dist-info."""
    from importlib import metadata

    def found() -> bool:
        return any(ep.name == "krex-provisioner" for ep in metadata.entry_points(group=PROVISIONER_GROUP))

    if found():
        return "installed"
    info = tmp / "entry-points" / "krex_lab_multi_gpu_shim-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: krex-lab-multi-gpu-shim\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        f"[{PROVISIONER_GROUP}]\nkrex-provisioner = krex_lab.provisioner:KrexProvisioner\n"
    )
    sys.path.insert(0, str(info.parent))
    importlib.invalidate_caches()
    if not found():
        raise RuntimeError("could not register the krex-provisioner entry point")
    return "temporary dist-info (krex_lab is not installed on this machine)"


class Placement:
    def __init__(self, env: dict[str, str], tmp: Path, gpus: list[dict[str, Any]], simulated: bool) -> None:
        self.env, self.tmp, self.gpus, self.simulated = env, tmp, gpus, simulated

    def run(self, checks: dict[str, bool]) -> dict[str, Any]:
        """Part A; sets its checks in ``checks``."""
        say("A: four krex kernels without KREX_GPU ...")
        t0 = time.monotonic()
        try:
            entry_point = ensure_provisioner_entry_point(self.tmp)
            result = asyncio.run(self._kernels(4))
            result.update(method="kernelspec", provisioner_entry_point=entry_point)
        except Terminated:
            raise
        except Exception as exc:
            print(
                f"A: krex kernels through jupyter_client failed ({exc!r}); FALLING BACK to 4 krex_lab.attach() "
                "processes: placement by the arbiter, not by the kernel provisioner",
                file=sys.stderr,
                flush=True,
            )
            result = self._attachers(4)
            result.update(method="attach", kernel_error=repr(exc))
        result["wall_s"] = round(time.monotonic() - t0, 2)
        gpus = sorted(k["gpu"] for k in result["placed"])
        checks["A_krex_kernels"] = result["method"] == "kernelspec"  # the attach fallback does not count
        checks["A_two_per_gpu"] = gpus == [0, 0, 1, 1]
        checks["A_env_agrees"] = all(k["env_ok"] for k in result["placed"])
        checks["A_sessions_end"] = result.get("sessions_left", 0) == 0
        say(
            f"A ({result['method']}): GPUs {[k['gpu'] for k in result['placed']]}, env agrees: "
            f"{checks['A_env_agrees']}, {result['wall_s']} s"
        )
        return result

    def _env_ok(self, gpu: int, krex_gpu: str | None, cvd: str | None) -> bool:
        if krex_gpu != str(gpu):
            return False
        if self.simulated:
            return cvd in (None, "", "None")
        uuid = str(self.gpus[gpu].get("uuid") or "")
        return cvd in (uuid, str(gpu))

    async def _kernels(self, n: int) -> dict[str, Any]:
        from jupyter_client.manager import AsyncKernelManager

        from krex_lab import client

        managers: list[Any] = []
        clients: list[Any] = []

        async def one() -> tuple[Any, Any]:
            km = AsyncKernelManager(kernel_name="krex")
            managers.append(km)
            await km.start_kernel(env=dict(os.environ))
            kc = km.client()
            clients.append(kc)
            kc.start_channels()
            await kc.wait_for_ready(timeout=120)
            return km, kc

        async def env_of(kc: Any) -> list[str]:
            out: list[str] = []

            def hook(msg: dict[str, Any]) -> None:
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])

            code = "import os; print(os.getpid(), os.environ.get('KREX_GPU'), os.environ.get('CUDA_VISIBLE_DEVICES'))"
            reply = await kc.execute_interactive(code, timeout=60, output_hook=hook)
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"kernel error: {reply['content'].get('evalue')}")
            return "".join(out).split()

        def kernel_sessions() -> dict[int, dict[str, Any]]:
            st = client.status(self.env["KREX_ENDPOINT"])
            return {s["pid"]: s for g in st["gpus"] for s in g["sessions"] if s["role"] == "kernel"}

        result: dict[str, Any] = {}
        try:
            started = await asyncio.gather(*(one() for _ in range(n)))
            say(f"A: {n} kernels ready")
            pids = [getattr(km.provisioner, "pid", None) for km, _ in started]
            deadline = time.monotonic() + 15
            while not set(pids) <= set(sessions := kernel_sessions()) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            placed = []
            for pid, (_, kc) in zip(pids, started):
                kpid, krex_gpu, cvd = (await env_of(kc) + [None, None, None])[:3]
                s = sessions.get(pid or -1)
                if s is None:
                    raise RuntimeError(f"kernel pid {pid} has no session of role 'kernel' at the arbiter")
                placed.append(
                    {
                        "pid": pid,
                        "kernel_pid": int(kpid) if kpid else None,
                        "gpu": s["gpu"],
                        "session": s["id"],
                        "name": s["name"],
                        "krex_gpu": krex_gpu,
                        "cuda_visible_devices": cvd,
                        "env_ok": self._env_ok(s["gpu"], krex_gpu, cvd),
                    }
                )
            result["placed"] = placed
            return result
        finally:
            for kc in clients:
                kc.stop_channels()
            await asyncio.gather(
                *(km.shutdown_kernel(now=True) for km in managers if km.has_kernel), return_exceptions=True
            )
            deadline = time.monotonic() + 10
            while kernel_sessions() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            result["sessions_left"] = len(kernel_sessions())  # a kernel's session ends with it

    def _attachers(self, n: int) -> dict[str, Any]:
        from krex_lab import client

        code = (
            "import json, os, sys, krex_lab; s = krex_lab.attach(name='multi-gpu-placement'); "
            f"print({MSG!r} + json.dumps({{'gpu': s.gpu, 'pid': os.getpid()}}), flush=True); sys.stdin.read()"
        )
        procs = []
        try:
            for k in range(n):  # one at a time: each registers before the next is placed
                child = Child(f"attacher{k}", self.env, argv=[sys.executable, "-c", code])
                procs.append(child)
                child.read(60, MSG)
            st = client.status(self.env["KREX_ENDPOINT"])
            sessions = {s["pid"]: s for g in st["gpus"] for s in g["sessions"]}
            placed = [
                {
                    "pid": c.proc.pid,
                    "gpu": sessions[c.proc.pid]["gpu"],
                    "session": sessions[c.proc.pid]["id"],
                    "env_ok": True,
                }
                for c in procs
            ]
        finally:
            for c in procs:
                c.kill()
        deadline = time.monotonic() + 5
        left: list[Any] = []
        while time.monotonic() < deadline:
            st = client.status(self.env["KREX_ENDPOINT"])
            left = [s for g in st["gpus"] for s in g["sessions"] if s["name"] == "multi-gpu-placement"]
            if not left:
                break
            time.sleep(0.1)
        return {"placed": placed, "sessions_left": len(left)}

    # -- victims --------------------------------------------------------------------------
