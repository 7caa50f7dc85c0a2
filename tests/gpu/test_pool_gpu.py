"""The pool on a real NVIDIA GPU: warm torch contexts, GPU memory back to baseline or recycle,
recycle after a sticky CUDA error, and a region held by a worker that drains its pool siblings."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from krex_lab.pytest_plugin import wait_for
from tests.gpu.helpers import nvidia_pool
from tests.support.pool import PoolProc, alive

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(
        tmp_path_factory, "--Pool.preload=torch", "--Pool.preload=numba.cuda", "--workers-per-gpu=2", "--spares=1"
    )


def test_workers_are_warm_on_their_gpu(gpu_pool: PoolProc) -> None:
    worker = gpu_pool.status().gpus[0].workers[0]
    assert worker.preloaded == ["torch", "numba.cuda"], worker
    code = (
        "import os, torch\nwarm = torch.cuda.is_initialized()\nx = torch.ones(256, 256, device='cuda')\n"
        "(warm, os.environ['CUDA_VISIBLE_DEVICES'][:4], torch.cuda.device_count(), float((x @ x)[0, 0]))"
    )
    t0 = time.perf_counter()
    r = gpu_pool.client.run_code(code, gpu=0)
    elapsed = time.perf_counter() - t0
    assert r.ok, r
    assert r.value == "(True, 'GPU-', 1, 256.0)"
    assert elapsed < 0.5, f"a warm matmul job took {elapsed:.3f} s"


def test_gpu_memory_back_to_baseline_or_recycled(gpu_pool: PoolProc) -> None:
    client = gpu_pool.client
    recycled = gpu_pool.status().counters.get("recycled", 0)
    tmp = client.run_code("import torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\nx.numel()")
    assert tmp.ok and tmp.value == str(1 << 30)
    time.sleep(1.0)  # the reset runs after the result
    assert alive(tmp.worker_pid or 0)  # memory freed with the namespace: the worker stays
    assert gpu_pool.status().counters.get("recycled", 0) == recycled
    leak = client.run_code(
        "import torch\ntorch._krex_test_leak = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')"
    )
    assert leak.ok
    wait_for(lambda: not alive(leak.worker_pid or 0), timeout=20)  # a leak: the worker is recycled
    assert gpu_pool.status().counters.get("recycled", 0) == recycled + 1
    gpu_pool.wait_ready(120)


def test_numba_memory_freed_by_a_job_keeps_the_worker(gpu_pool: PoolProc) -> None:
    # agent_study's jobs allocate a few hundred MiB with numba and free them; on the H200 (2026-12-02)
    # the pool recycled the worker after most of them: the freed memory still counted.
    client = gpu_pool.client
    gpu_pool.wait_ready(120)
    recycled = gpu_pool.status().counters.get("recycled", 0)
    code = (
        "import numpy as np\nnp.row_stack = getattr(np, 'row_stack', np.vstack)  # krex_lab/kernels/spec.py says why\n"
        "from numba import cuda\n"
        "x = cuda.device_array(600 << 18, dtype=np.float32)\nx[:] = 1.0\ncuda.synchronize()\nint(x.size)"
    )
    r = client.run_code(code, gpu=0)
    assert r.ok and r.value == str(600 << 18), r
    time.sleep(1.5)  # the reset runs after the result
    assert alive(r.worker_pid or 0)
    assert gpu_pool.status().counters.get("recycled", 0) == recycled


def test_sticky_cuda_error_recycles_the_worker(gpu_pool: PoolProc) -> None:
    # An out-of-range gather trips a device-side assert: the context is unusable afterwards.
    code = (
        "import torch\nx = torch.zeros(4, device='cuda')\ni = torch.tensor([1 << 20], device='cuda')\n"
        "x[i].sum().item()\n"
    )
    r = gpu_pool.client.run_code(code, gpu=0)
    assert r.status == "exception" and "device-side assert" in (r.error or "") + (r.traceback or ""), r
    wait_for(lambda: not alive(r.worker_pid or 0), timeout=20)
    gpu_pool.wait_ready(120)
    after = gpu_pool.client.run_code("import torch\nfloat(torch.ones(2, device='cuda').sum())", gpu=0)
    assert after.ok and after.value == "2.0", after


def test_region_in_a_job_locks_the_other_workers(gpu_pool: PoolProc) -> None:
    gpu_pool.wait_ready(120)
    others = gpu_pool.worker_pids(gpu=0)
    r = gpu_pool.client.run_code(
        "import torch\nx = torch.ones(1024, 1024, device='cuda')\nfloat((x @ x).sum())", gpu=0, exclusive=True
    )
    assert r.ok, r
    report = r.region
    assert report is not None and report["backend"] == "nvidia" and report["holder_pid"] == r.worker_pid
    siblings = [p for p in others if p != r.worker_pid]
    assert siblings and set(siblings) <= set(report["locked"]) | set(report["drained"]), report
    assert set(siblings) <= set(report["frozen"]), report
    assert not report["degraded"], report
