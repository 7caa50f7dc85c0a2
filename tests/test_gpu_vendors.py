"""Vendor knowledge in one place: every placement comes from krex_lab.gpu.vendors, and a package
adds a backend with an entry point (a real distribution on sys.path, in a real interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from krex_lab.gpu import make_backend
from krex_lab.gpu.vendors import AMD, NVIDIA, backend_names, place, placement_variables
from krex_lab.workers.pool.spawn import PLACEMENT, NodeBackend, worker_launch


@pytest.mark.parametrize(
    ("uuid", "device"),
    [("GPU-8f1c", "GPU-8f1c"), ("MIG-0a2b", "MIG-0a2b"), ("", "3"), ("FAKE-0003", "3")],
)
def test_nvidia_places_by_uuid_where_cuda_takes_it_else_by_pci_ordered_index(uuid: str, device: str) -> None:
    assert NVIDIA.device_env(3, uuid) == {"CUDA_VISIBLE_DEVICES": device, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_amd_places_with_one_variable_so_that_a_second_gpu_stays_visible() -> None:
    # ROCR filters before HIP counts: both set to 1 would leave no device at all.
    assert AMD.device_env(1) == {"HIP_VISIBLE_DEVICES": "1"}
    assert {"ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} <= set(placement_variables())


def test_simulated_and_unknown_backends_place_nothing() -> None:
    assert place("fake", 1, "FAKE-0001") == {} and place("nvidia", 1, "GPU-x", simulated=True) == {}
    assert place("nosuchgpu", 1) == {}


def _launch_env(backend: str, gpu: int, uuid: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    _, env, _ = worker_launch(
        0,
        gpu,
        python="",
        worker_env={},
        backend=NodeBackend(backend, simulated=False),
        gpu_uuids={gpu: uuid},
        arbiter_endpoint="ipc:///nonexistent",
        arbiter_connected=False,
        arbiter_pid=None,
        preload=[],
        ready_hooks=[],
        warmup=False,
        memory_slack_mb=0,
    )
    return env


def test_a_pool_worker_is_placed_as_the_registry_says_whatever_the_pool_inherited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pool itself may run under someone's placement (a job scheduler's, a shell's).
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    env = _launch_env("amd", 1, "", monkeypatch)
    assert env["HIP_VISIBLE_DEVICES"] == "1" and "ROCR_VISIBLE_DEVICES" not in env
    assert "CUDA_VISIBLE_DEVICES" not in env
    env = _launch_env("nvidia", 2, "MIG-77", monkeypatch)
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-77" and "ROCR_VISIBLE_DEVICES" not in env
    assert set(placement_variables()) <= set(PLACEMENT)


def test_an_unknown_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="choose one of auto, nvidia, amd, fake"):
        make_backend("cuda")
    proc = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", "cuda"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "auto, nvidia, amd, fake" in proc.stderr, proc.stderr[-2000:]


def test_a_package_adds_a_backend_by_entry_point(tmp_path: Path) -> None:
    (tmp_path / "mygpu_krex.py").write_text(
        textwrap.dedent(
            """
            from krex_lab.gpu.fake import FakeBackend
            from krex_lab.gpu.vendors import Vendor

            class MyBackend(FakeBackend):
                name = "mygpu"

            VENDOR = Vendor(
                "mygpu", "mygpu_krex:MyBackend", visibility=("MYGPU_DEVICES",),
                place=lambda index, uuid: {"MYGPU_DEVICES": uuid or str(index)},
            )
            """
        )
    )
    info = tmp_path / "mygpu_krex-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mygpu-krex\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[krex_lab.gpu_backends]\nmygpu = mygpu_krex:VENDOR\nbroken = mygpu_krex:NOT_THERE\n"
    )
    script = textwrap.dedent(
        """
        import json
        from krex_lab.gpu import make_backend
        from krex_lab.gpu.vendors import backend_names, place, placement_variables
        backend = make_backend("mygpu")
        print(json.dumps({
            "names": backend_names(), "class": type(backend).__name__, "place": place("mygpu", 2),
            "vars": list(placement_variables()),
        }))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["names"][-1] == "mygpu" and "broken" not in got["names"]
    assert got["class"] == "MyBackend" and got["place"] == {"MYGPU_DEVICES": "2"}
    assert "MYGPU_DEVICES" in got["vars"]
    assert "GPU backend 'broken'" in proc.stderr  # logged, not fatal
    assert backend_names()[:4] == ["auto", "nvidia", "amd", "fake"]
