"""``krex status --ray``'s text: each node's pool line counts the workers of every GPU of the pool's table."""

from __future__ import annotations

import msgspec
import pytest

pytest.importorskip("ray")

from krex_lab.ray.cluster import ClusterNode
from krex_lab.ray.status import format_cluster
from krex_lab.workers.wire import PoolTable


def _worker(wid: int, gpu: int, state: str) -> dict[str, object]:
    return {
        "id": wid,
        "pid": 100 + wid,
        "gpu": gpu,
        "state": state,
        "role": "active",
        "session": None,
        "lease": None,
        "job": None,
        "jobs_run": 0,
        "since": 0.0,
        "preloaded": [],
        "skipped": {},
        "start_s": None,
        "import_s": {},
        "last_reset_s": {},
    }


def test_the_pool_line_counts_every_gpus_workers() -> None:
    table = {
        "pool": {
            "pid": 4242,
            "uid": 1000,
            "endpoint": "ipc:///x",
            "started": 0.0,
            "on_demand": False,
            "idle_exit_s": 0.0,
            "arbiter": None,
            "preload": [],
            "workers_per_gpu": 1,
            "spares_per_gpu": 1,
            "backend": "fake",
            "simulated": True,
        },
        "gpus": [
            {
                "index": g,
                "gate": "open",
                "holder_pid": None,
                "exclusive_job": None,
                "queued": 0,
                "workers": [_worker(2 * g, g, "busy"), _worker(2 * g + 1, g, "idle")],
            }
            for g in (0, 1)
        ],
        "queue": [{"job": "j9", "kind": "code", "gpu": None, "lease": None, "waiting_s": 0.5}],
        "running": [],
        "leases": [],
        "counters": {},
        "ready": True,
    }
    node = ClusterNode(node="n1", node_id="id1", pool=msgspec.convert(table, PoolTable))
    text = format_cluster([node])
    assert "  pool pid 4242: 4 workers, 2 busy, 1 queued" in text.splitlines(), text
