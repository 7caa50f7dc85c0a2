"""The arbiter's Prometheus endpoint (``--Arbiter.metrics_port``): labelled series after real
regions, gauges while a region is held, and clear refusals (port taken, no prometheus_client)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from krex_lab.pytest_plugin import ROOT, ArbiterProc, wait_for
from tests.support import ME
from tests.support.procs import kill_tree


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _get(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "rt"
    path.mkdir(mode=0o700)
    return path


def _exclusive(arb: ArbiterProc, gpu: int, *cmd: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "exclusive", "--quiet", "--gpu", str(gpu), "--", *cmd],
        env=arb.env(),
    )


def test_metrics_endpoint_labels_regions_by_user_and_gpu(runtime: Path) -> None:
    port = _free_port()
    arb = ArbiterProc(runtime, extra=(f"--Arbiter.metrics_port={port}", "--Arbiter.telemetry_interval=0.2")).start()
    holding = None
    try:
        before = _scrape(port)
        assert _get(before, "krex_gpu_held", gpu="0") == 0.0 and _get(before, "krex_queue_length", gpu="1") == 0.0
        assert _get(before, "krex_regions_total", user=ME, gpu="1", outcome="completed") is None
        assert _exclusive(arb, 1, "sleep", "0.3").wait(60) == 0
        assert _exclusive(arb, 1, "true").wait(60) == 0
        after = _scrape(port)
        assert _get(after, "krex_regions_total", user=ME, gpu="1", outcome="completed") == 2.0
        hold = _get(after, "krex_region_hold_seconds_total", user=ME, gpu="1")
        assert hold is not None and 0.3 <= hold < 5.0
        assert _get(after, "krex_region_wait_seconds_count", gpu="1") == 2.0
        assert _get(after, "krex_degraded_regions_total", user=ME, gpu="1") is None  # none degraded
        assert _get(after, "krex_history_dropped_total") == 0.0
        assert _get(after, "krex_regions_total", user=ME, gpu="0", outcome="completed") is None
        holding = _exclusive(arb, 0, "sleep", "30")

        def held() -> bool:
            now = _scrape(port)
            return (
                _get(now, "krex_gpu_held", gpu="0") == 1.0
                and _get(now, "krex_sessions", user=ME, gpu="0") == 1.0
                and _get(now, "krex_gpu_held", gpu="1") == 0.0
            )

        wait_for(held, timeout=20, interval=0.1)
    finally:
        if holding is not None:
            kill_tree(holding)  # krex exclusive and its `sleep 30`
        arb.stop()


def test_metrics_endpoint_binds_loopback_by_default(runtime: Path) -> None:
    port = _free_port()
    arb = ArbiterProc(runtime, extra=(f"--Arbiter.metrics_port={port}",)).start()
    try:
        listening = [c for c in __import__("psutil").net_connections("tcp") if c.laddr and c.laddr.port == port]
        assert listening and {c.laddr.ip for c in listening if c.status == "LISTEN"} == {"127.0.0.1"}
    finally:
        arb.stop()


def _start_fails(runtime: Path, env: dict[str, str], *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", "fake", "--no-guardian", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_a_taken_port_refuses_to_start(runtime: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _start_fails(runtime, ArbiterProc(runtime).env(), f"--Arbiter.metrics_port={port}")
    assert f"cannot serve metrics on 127.0.0.1:{port}" in out


def test_without_prometheus_client_it_refuses_to_start(runtime: Path, tmp_path: Path) -> None:
    fake = tmp_path / "noprom" / "prometheus_client"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('prometheus_client hidden by the test')\n")
    env = {**ArbiterProc(runtime).env(), "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    out = _start_fails(runtime, env, "--Arbiter.metrics_port=1")
    assert "prometheus_client cannot be imported" in out


def test_degraded_regions_are_counted_by_user_and_gpu() -> None:
    """The arbiter's counter and the server extension's both count a degraded region once."""
    from prometheus_client import generate_latest

    from krex_lab.arbiter.metrics import ArbiterMetrics
    from krex_lab.node_status import ArbiterRow
    from krex_lab.region_report import RegionReport
    from krex_lab.serverext.metrics import RegionStats

    def report(region: str, degraded: bool) -> RegionReport:
        return RegionReport(
            region=region, user="alice", gpu=1, acquire_s=0.001, wait_s=0.0, hold_s=0.5, degraded=degraded
        )

    metrics = ArbiterMetrics()
    for r in (report("r1", True), report("r2", False), report("r3", True)):
        metrics.region_finished(r)
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }
    assert _get(samples, "krex_degraded_regions_total", user="alice", gpu="1") == 2.0
    stats = RegionStats()
    reports = [report("r1", True), report("r2", False)]
    arbiter = ArbiterRow(pid=1, started=0.0)
    assert stats.observe(arbiter, reports) == 2
    assert stats.observe(arbiter, reports) == 0, "a report seen before is not counted again"
    assert stats.degraded.labels("1")._value.get() == 1.0
