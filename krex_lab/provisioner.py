"""The ``krex`` kernelspec's kernel provisioner: each notebook kernel is placed on a GPU.

Before a kernel starts, :class:`KrexProvisioner` asks the arbiter for a GPU (fewest sessions,
then most free memory; ``KREX_GPU`` in the environment pins it; a restarted kernel keeps its
GPU) and puts ``KREX_GPU``, ``KREX_ENDPOINT``, ``KREX_POOL_ENDPOINT``, ``KREX_KERNEL_ID`` and, on
real GPUs, ``CUDA_VISIBLE_DEVICES`` (``HIP_VISIBLE_DEVICES`` on AMD) in its environment. The
kernel registers itself as a session when the ``krex_lab`` IPython extension loads (the
kernelspec loads it), so the session ends with the kernel process: stop and restart included.

Kernels started in the same second must not all land on the same GPU: placements that are
launched but not yet registered are counted as sessions of their GPU.

:class:`SiblingKernel` starts a ``krex`` kernel *outside* the caller's process tree, as a
second notebook's kernel would be: a region never stops its holder's own descendants, so a
kernel started as a child of a notebook would never be stopped by that notebook's regions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.provisioning import LocalProvisioner

from . import discovery, paths, protocol
from .errors import KrexError

log = logging.getLogger("krex.provisioner")

#: a launched kernel that has not registered within this many seconds no longer counts
PENDING_TTL = 60.0


@dataclass
class _Pending:
    gpu: int
    since: float
    pid: int | None = None


class Placements:
    """Placements made by this process: pending ones (not yet registered) and sticky ones (restarts)."""

    def __init__(self) -> None:
        self.pending: dict[str, _Pending] = {}
        self.sticky: dict[str, int] = {}
        self._lock = threading.Lock()

    def choose(self, conn: Any, kernel_id: str) -> int:
        with self._lock:
            now = time.monotonic()
            self.pending = {k: p for k, p in self.pending.items() if now - p.since < PENDING_TTL and k != kernel_id}
            if not self.pending:
                gpu = int(conn.call(protocol.Place()).gpu)
            else:
                gpu = self._choose_with_pending(conn.call(protocol.Status(ticket=conn.ticket())))
            self.pending[kernel_id] = _Pending(gpu, now)
            return gpu

    def _choose_with_pending(self, status: object) -> int:
        """The GPU with the fewest sessions, counting the kernels placed but not yet registered
        (``status``: the arbiter's ``Status`` answer), then the most free memory."""
        from .node_status import NodeStatus

        gpus = NodeStatus.of(status).gpus
        registered = {s.pid for g in gpus for s in g.sessions}
        self.pending = {k: p for k, p in self.pending.items() if p.pid is None or p.pid not in registered}
        # Every user's sessions count (other users' appear only as counts on a private node).
        others = {g.index: sum(g.other_sessions.values()) if g.other_sessions else 0 for g in gpus}
        counts = {g.index: len(g.sessions) + others[g.index] for g in gpus}
        free = {g.index: g.memory_total - g.memory_used for g in gpus}
        for p in self.pending.values():
            if p.gpu in counts:
                counts[p.gpu] += 1
        return min(counts, key=lambda g: (counts[g], -free[g], g))

    def launched(self, kernel_id: str, pid: int | None) -> None:
        with self._lock:
            if kernel_id in self.pending:
                self.pending[kernel_id].pid = pid

    def forget(self, kernel_id: str, restart: bool) -> None:
        with self._lock:
            self.pending.pop(kernel_id, None)
            if not restart:
                self.sticky.pop(kernel_id, None)


placements = Placements()


def place_kernel(kernel_id: str, env: dict[str, str]) -> dict[str, str]:
    """The environment variables that place kernel ``kernel_id`` (``env`` is its environment so far).

    Without an arbiter the kernel starts unplaced (its magics then say why), with a warning.
    """
    from .client import Connection

    endpoint = env.get(paths.ENDPOINT_ENV) or discovery.default_endpoint()
    out = {"KREX_KERNEL_ID": kernel_id, paths.ENDPOINT_ENV: endpoint}
    try:
        conn = Connection(endpoint)
    except KrexError as exc:
        log.warning("KREX: kernel %s starts without a GPU placement: %s", kernel_id, exc)
        return out
    try:
        info = conn.call(protocol.Hello(), timeout=2.0)
        pinned = env.get(paths.GPU_ENV, "").strip()
        if pinned:
            gpu = int(pinned)
            if not 0 <= gpu < info.gpus:
                raise KrexError(f"{paths.GPU_ENV}={pinned} but this node has GPUs 0..{info.gpus - 1}")
        elif kernel_id in placements.sticky:
            gpu = placements.sticky[kernel_id]
        else:
            gpu = placements.choose(conn, kernel_id)
        placements.sticky[kernel_id] = gpu
        out[paths.GPU_ENV] = str(gpu)
        if not info.simulated:
            out.update(_device_env(conn, info.backend, gpu))
    except (KrexError, ValueError) as exc:
        log.warning("KREX: kernel %s starts without a GPU placement: %s", kernel_id, exc)
    finally:
        conn.close()
    log.info("KREX: kernel %s placed on GPU %s", kernel_id, out.get(paths.GPU_ENV, "-"))
    return out


def _device_env(conn: Any, backend: str, gpu: int) -> dict[str, str]:
    from .gpu.vendors import place

    uuid_ = next((g.get("uuid", "") for g in conn.call(protocol.Status())["gpus"] if g["index"] == gpu), "")
    return place(backend, gpu, str(uuid_ or ""))


class KrexProvisioner(LocalProvisioner):
    """LocalProvisioner that places the kernel on a GPU through the arbiter first."""

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        env: dict[str, str] = kwargs["env"]
        placed = await asyncio.get_running_loop().run_in_executor(None, place_kernel, self.kernel_id, dict(env))
        env.update(placed)
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        info = await super().launch_kernel(cmd, **kwargs)
        placements.launched(self.kernel_id, self.pid)
        return info

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        placements.forget(self.kernel_id, restart)


class SiblingKernel:
    """A ``krex`` kernel outside this process's tree (as another notebook's kernel), with a client.

    It ends when :meth:`shutdown` is called or when this process exits (its extension watches
    us through ``KREX_EXIT_WITH``).
    """

    def __init__(self, kernel_name: str = "krex", env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        from jupyter_client.blocking import BlockingKernelClient
        from jupyter_client.connect import write_connection_file
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_core.paths import jupyter_runtime_dir

        spec = KernelSpecManager().get_kernel_spec(kernel_name)
        self.kernel_id = str(uuid.uuid4())
        runtime = Path(jupyter_runtime_dir())
        runtime.mkdir(parents=True, exist_ok=True)
        self.connection_file, _ = write_connection_file(str(runtime / f"kernel-{self.kernel_id}.json"))
        kenv = {**os.environ, **spec.env, **(env or {})}
        kenv.pop("JPY_PARENT_PID", None)  # its parent will be init: ipykernel would take that as orphaned
        kenv["KREX_EXIT_WITH"] = str(os.getpid())
        kenv.update(place_kernel(self.kernel_id, kenv))
        self.gpu = int(kenv[paths.GPU_ENV]) if kenv.get(paths.GPU_ENV) else None
        argv = [a.replace("{connection_file}", self.connection_file) for a in spec.argv]
        if argv[0] in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
            argv[0] = sys.executable
        helper = subprocess.run(
            [sys.executable, "-m", "krex_lab.provisioner", "detach", *argv],
            env=kenv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        self.pid = int(helper.stdout.strip())
        placements.launched(self.kernel_id, self.pid)
        self.client = BlockingKernelClient(connection_file=self.connection_file)
        self.client.load_connection_file()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=timeout)
        except BaseException:
            self.shutdown()
            raise

    def execute(self, code: str, timeout: float = 60.0) -> str:
        """Run ``code`` in the kernel; returns its stdout. Raises RuntimeError on an error reply."""
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{reply['content'].get('ename')}: {reply['content'].get('evalue')}")
        return "".join(out)

    def shutdown(self) -> None:
        try:
            self.client.shutdown()
        except Exception:
            pass
        _end_pid(self.pid, 5.0)
        self.client.stop_channels()
        placements.forget(self.kernel_id, restart=False)
        try:
            os.unlink(self.connection_file)
        except OSError:
            pass

    def __enter__(self) -> SiblingKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _end_pid(pid: int, grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if _state(pid) in (None, "Z"):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _state(pid: int) -> str | None:
    from .procutil import proc_state

    return proc_state(pid)


def _detach(argv: list[str]) -> None:
    """Start ``argv`` in its own session and exit at once, so it is reparented (not our child)."""
    proc = subprocess.Popen(
        argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    print(proc.pid, flush=True)
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["detach"] and len(sys.argv) > 2:
        _detach(sys.argv[2:])
    sys.exit("usage: python -m krex_lab.provisioner detach CMD [ARGS...]")
