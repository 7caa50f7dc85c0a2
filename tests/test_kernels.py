"""Real ``krex`` kernels through jupyter_client: placement by the provisioner, sessions that live
and die with the kernel, and a region in one kernel stopping another kernel on its GPU."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from krex_lab import protocol
from krex_lab.connection import Connection
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.serverext.lab import jupyter_env
from tests.support import ROOT

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def krex_spec(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The source tree's kernelspec first on JUPYTER_PATH (what `krex lab` does too)."""
    monkeypatch.setenv("JUPYTER_PATH", jupyter_env()["JUPYTER_PATH"])
    assert "krex" in KernelSpecManager().find_kernel_specs()
    yield


class Kernels:
    """Started kernels, shut down (and continued first, should one be stopped) at teardown.

    Over ipc sockets in ``sockets``: a TCP port that jupyter_client found free can be taken by
    another process before the kernel binds it, and the kernel then dies at start ("Address
    already in use", once in a CI-like run on 2026-12-02)."""

    def __init__(self, sockets: Path) -> None:
        self.managers: list[AsyncKernelManager] = []
        self.sockets = sockets

    async def start(self, n: int, env: dict[str, str] | None = None) -> list[tuple[AsyncKernelManager, Any]]:
        async def one() -> tuple[AsyncKernelManager, Any]:
            where = self.sockets / f"kernel-{len(self.managers)}"
            km = AsyncKernelManager(kernel_name="krex", transport="ipc", ip=str(where))
            self.managers.append(km)
            await km.start_kernel(env={**os.environ, **(env or {})})
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            return km, kc

        return list(await asyncio.gather(*(one() for _ in range(n))))

    async def shutdown(self) -> None:
        for km in self.managers:
            pid = pid_of(km)
            if pid:
                try:
                    os.kill(pid, signal.SIGCONT)  # a stopped kernel cannot answer its shutdown
                except ProcessLookupError:
                    pass
        await asyncio.gather(
            *(km.shutdown_kernel(now=True) for km in self.managers if km.has_kernel), return_exceptions=True
        )


@pytest.fixture
def pool(arbiter: ArbiterProc, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pytest.importorskip("krex_lab.workers.pool")
    from krex_lab.workers.client import PoolClient

    endpoint = f"ipc://{arbiter.runtime / 'pool.sock'}"
    env = {**arbiter.env(), "KREX_POOL_ENDPOINT": endpoint}
    log = open(arbiter.runtime / "pool.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "krex_lab.workers.pool",
            f"--endpoint={endpoint}",
            f"--arbiter={arbiter.endpoint}",
            "--no-preload",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    monkeypatch.setenv("KREX_POOL_ENDPOINT", endpoint)

    def answers() -> bool:
        try:
            PoolClient.connect(endpoint, start=False).close()
            return True
        except Exception:
            assert proc.poll() is None, (arbiter.runtime / "pool.log").read_text()
            return False

    wait_for(answers, 30, 0.1)
    yield endpoint
    proc.terminate()
    proc.wait(15)
    log.close()


@pytest.fixture
def detached(arbiter: ArbiterProc) -> Iterator[Any]:
    """Start sessions outside this process's tree: a region never stops its holder's own children,
    and here the holder is this test process."""
    pids: list[int] = []

    def start(gpu: int) -> int:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "krex_lab.provisioner",
                "detach",
                sys.executable,
                "-m",
                "tests.procs.session",
                "sibling",
                str(gpu),
                "--sleep",
            ],
            cwd=ROOT,
            env=arbiter.env(),
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(out.stdout)
        pids.append(pid)
        wait_for(lambda: any(s["pid"] == pid for g in arbiter.status()["gpus"] for s in g["sessions"]), 20)
        return pid

    yield start
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


@pytest.fixture
async def kernels(arbiter: ArbiterProc, krex_spec: None, tmp_path: Path) -> AsyncIterator[Kernels]:
    ks = Kernels(tmp_path)
    yield ks
    await ks.shutdown()


def pid_of(km: AsyncKernelManager) -> int | None:
    prov = km.provisioner
    return getattr(prov, "pid", None) if prov is not None else None


async def run(kc: Any, code: str, timeout: float = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; returns the reply content and the iopub outputs (each with its arrival time)."""
    outputs: list[dict[str, Any]] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] in ("stream", "error", "execute_result"):
            outputs.append({"type": msg["msg_type"], "t": time.monotonic(), **msg["content"]})

    reply = await kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], outputs


def text(outputs: list[dict[str, Any]]) -> str:
    return "".join(o.get("text", "") for o in outputs if o["type"] == "stream")


def kernel_sessions(arbiter: ArbiterProc) -> dict[int, dict[str, Any]]:
    return {s["pid"]: s for g in arbiter.status()["gpus"] for s in g["sessions"] if s["role"] == "kernel"}


async def test_region_in_one_kernel_stops_the_other(arbiter: ArbiterProc, kernels: Kernels) -> None:
    (km_a, kc_a), (km_b, kc_b) = await kernels.start(2, {"KREX_GPU": "0"})
    pid_a, pid_b = pid_of(km_a), pid_of(km_b)
    assert pid_a and pid_b
    sessions = kernel_sessions(arbiter)
    assert sessions[pid_a]["gpu"] == 0 and sessions[pid_b]["gpu"] == 0, "registered when the extension loaded"
    assert sessions[pid_a]["name"].startswith("kernel ")

    t0 = time.monotonic()
    wall = time.time() - t0  # monotonic arrival times of outputs -> wall clock, as region reports use
    cell_a = asyncio.ensure_future(run(kc_a, "%%krex_exclusive\nimport time\ntime.sleep(3)\n'done'"))
    # A's region stops B: watched on this loop with a /proc read (status requests and threads can
    # answer late on a loaded machine; a late look must not read as B running on).
    while proc_state(pid_b) != "T":
        assert time.monotonic() - t0 < 10, "kernel B's process is never stopped while A holds the GPU"
        await asyncio.sleep(0.01)
    cell_b = asyncio.ensure_future(run(kc_b, "1 + 1"))
    reply_a, out_a = await cell_a
    reply_b, out_b = await cell_b
    assert reply_a["status"] == "ok" and reply_b["status"] == "ok"
    conn = Connection(arbiter.endpoint)
    try:
        (region,) = [r for r in conn.call(protocol.Regions(limit=10, ticket="")) if r["holder_pid"] == pid_a]
    finally:
        conn.close()
    assert pid_b in region["frozen"] and region["hold_s"] >= 3.0, region
    # B answered only once A's region was over: its result arrived after the release
    answered = min(o["t"] for o in out_b if o["type"] == "execute_result") + wall
    assert answered >= region["released_at"] - 0.05, ("B answered while A's region lasted", answered, region)
    summary = text(out_a)
    assert "KREX region" in summary and "frozen 1" in summary and "drained 1" in summary, summary
    assert "[simulated GPU]" in summary
    assert [o["data"]["text/plain"] for o in out_a if o["type"] == "execute_result"] == ["'done'"]
    assert [o["data"]["text/plain"] for o in out_b if o["type"] == "execute_result"] == ["2"]
    assert proc_state(pid_b) in ("S", "R")

    # Afterwards B runs normally, and its own region stops A.
    reply, out = await run(kc_b, "%%krex_exclusive --no-isolate\nsum(range(10))")
    assert reply["status"] == "ok" and "frozen 1" in text(out) and "45" in str(out[-1].get("data"))
    assert time.monotonic() - t0 < 30


async def test_four_kernels_placed_two_and_two(
    arbiter: ArbiterProc, kernels: Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KREX_GPU", raising=False)
    started = await kernels.start(4)
    pids = [pid_of(km) for km, _ in started]
    sessions = kernel_sessions(arbiter)
    assert set(pids) <= set(sessions), "every kernel registered itself"
    gpus = [sessions[p]["gpu"] for p in pids]
    assert sorted(gpus) == [0, 0, 1, 1], gpus
    # The kernel knows its placement (what CUDA_VISIBLE_DEVICES means on a real GPU).
    km, kc = started[0]
    _, out = await run(kc, "import os; print(os.environ['KREX_GPU'], os.environ.get('CUDA_VISIBLE_DEVICES'))")
    assert text(out).split() == [str(gpus[0]), "None"], "the fake backend sets no CUDA_VISIBLE_DEVICES"

    # A restart ends the old session and registers the new process, on the same GPU.
    old = pids[0]
    await km.restart_kernel(now=True)
    await kc.wait_for_ready(timeout=60)
    new = pid_of(km)
    assert new != old
    await asyncio.to_thread(wait_for, lambda: old not in kernel_sessions(arbiter) and new in kernel_sessions(arbiter))
    assert kernel_sessions(arbiter)[new]["gpu"] == gpus[0]

    # Stopped kernels' sessions disappear.
    await asyncio.gather(*(km.shutdown_kernel() for km, _ in started))
    for _, kc in started:
        kc.stop_channels()
    took = await asyncio.to_thread(wait_for, lambda: not kernel_sessions(arbiter), 5)
    assert took < 2


async def test_kernel_without_arbiter_still_starts(kernels: Kernels, arbiter: ArbiterProc) -> None:
    arbiter.stop()
    [(_, kc)] = await kernels.start(1)
    reply, out = await run(kc, "%%krex_exclusive\n1")
    assert reply["status"] == "error" and reply["ename"] == "KrexCellError"
    err = next(o for o in out if o["type"] == "error")
    assert err["traceback"][0].count("\n") == 0 and "no KREX arbiter answers" in err["traceback"][0]
    assert "client.py" not in "".join(err["traceback"]), "no traceback from inside KREX"
    reply, out = await run(kc, "1 + 1")
    assert reply["status"] == "ok", "the kernel itself works"


async def test_krex_cell_in_a_kernel(arbiter: ArbiterProc, pool: str, kernels: Kernels) -> None:
    [(km, kc)] = await kernels.start(1)
    pid = pid_of(km)
    t0 = time.monotonic()
    reply, out = await run(
        kc,
        "%%krex\nimport os, time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
        "    time.sleep(0.4)\nos.getpid()",
    )
    assert reply["status"] == "ok"
    ticks = [o["t"] for o in out if o["type"] == "stream" and "tick" in o["text"]]
    result = [o for o in out if o["type"] == "execute_result"]
    assert ticks and ticks[0] < result[0]["t"] - 0.6, "the first tick arrived while the cell still ran"
    assert int(result[0]["data"]["text/plain"]) != pid, "it ran on the context worker"
    assert time.monotonic() - t0 >= 1.2

    reply, out = await run(kc, "%%krex\nimport ctypes\nctypes.string_at(0)")
    assert reply["status"] == "error" and reply["ename"] == "KrexCellError"
    err = next(o for o in out if o["type"] == "error")
    assert "died" in err["traceback"][0] and "SIGSEGV" in err["traceback"][0], err["traceback"]
    assert "client.py" not in "".join(err["traceback"]) and "Traceback (most recent" not in err["traceback"][0]
    assert km.provisioner is not None and await km.is_alive() and pid_of(km) == pid, "the kernel never died"

    reply, out = await run(kc, "%%krex\nprint('after the crash', flush=True)")
    assert reply["status"] == "ok" and "after the crash" in text(out)
    reply, out = await run(kc, "'still here'")
    assert reply["status"] == "ok"


async def test_a_wait_in_a_notebook_is_one_display_updated(arbiter: ArbiterProc, kernels: Kernels) -> None:
    """A cell that waits for a held GPU shows one display, updated in place (not stderr lines)."""
    [(_, kc)] = await kernels.start(1, {"KREX_GPU": "1"})  # waits for GPU 0 without being frozen by it
    holder = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--gpu", "0", "--", "sleep", "3"],
        env=arbiter.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stderr is not None and holder.stderr.readline().startswith("KREX region")
        messages: list[dict[str, Any]] = []
        reply = await kc.execute_interactive(
            "%%krex_exclusive --gpu 0 --quiet\n'held'", timeout=60, output_hook=messages.append
        )
        assert reply["content"]["status"] == "ok" and holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    shown = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data")]
    ids = {m["content"]["transient"]["display_id"] for m in shown}
    texts = [m["content"]["data"]["text/plain"] for m in shown]
    assert len(ids) == 1 and shown[0]["msg_type"] == "display_data", texts
    assert texts[0].startswith("krex: waiting for GPU 0: held by") and len(texts) >= 2, texts
    assert texts[-1].startswith("krex: GPU 0 granted after"), texts
    streams = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "krex: waiting" not in streams, streams
