"""The server extension's choice of arbiter on a real jupyter_server (pytest-jupyter): the node
arbiter when one answers at ``KrexExtensionApp.node_endpoint`` (no embedded one is started),
an embedded one otherwise; the log, ``/krex/api/status`` and the kernels' environment say which."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 - the jp_* fixtures, for this module only

from krex_lab.pytest_plugin import ArbiterProc
from tests.support.procs import descendants_with


@pytest.fixture
def node_arbiter(tmp_path: Path) -> Iterator[ArbiterProc]:
    runtime = tmp_path / "node-rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=2).start()
    yield arb
    arb.stop()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No explicit endpoint: the extension must find the node arbiter on its own."""
    for name in ("KREX_ENDPOINT", "KREX_POOL_ENDPOINT", "KREX_NODE_ENDPOINT", "KREX_ARBITER_KIND"):
        monkeypatch.delenv(name, raising=False)
    own = tmp_path / "own-rt"
    own.mkdir(mode=0o700)
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(own))


def embedded_children() -> list[psutil.Process]:
    """Arbiters the server started (under its guard), not the node arbiter the test started."""
    return descendants_with(os.getpid(), "krex_lab.launcher", "arbiter")


def status(jp_fetch: Any, jp_asyncio_loop: Any) -> dict[str, Any]:
    # tornado's client looks the loop up (a test module run before may have cleared it)
    asyncio.set_event_loop(jp_asyncio_loop)
    r = jp_asyncio_loop.run_until_complete(jp_fetch("krex/api/status"))
    data: dict[str, Any] = json.loads(r.body)
    return data


class TestNodeArbiterAnswers:
    @pytest.fixture
    def jp_server_config(self, node_arbiter: ArbiterProc, clean_env: None) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"krex_lab.serverext": True}},
            "KrexExtensionApp": {"node_endpoint": node_arbiter.endpoint, "start_pool": False, "watch_interval": 0},
        }

    def test_uses_it_and_embeds_nothing(
        self,
        jp_serverapp: Any,
        jp_fetch: Any,
        jp_asyncio_loop: Any,
        node_arbiter: ArbiterProc,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        data = status(jp_fetch, jp_asyncio_loop)
        server = data["server"]
        assert server["arbiter"] == "node" and server["endpoint"] == node_arbiter.endpoint
        assert server["embedded_arbiter"] is None and embedded_children() == []
        assert data["arbiter"]["pid"] == node_arbiter.proc.pid  # type: ignore[union-attr]
        who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
        assert server["arbiter_description"] == f"node arbiter ({who}, {node_arbiter.endpoint})"
        assert os.environ["KREX_ENDPOINT"] == node_arbiter.endpoint and os.environ["KREX_ARBITER_KIND"] == "node"


class TestNoNodeArbiter:
    @pytest.fixture
    def jp_server_config(self, tmp_path: Path, clean_env: None) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"krex_lab.serverext": True}},
            "KrexExtensionApp": {
                "node_endpoint": f"ipc://{tmp_path}/nobody-here.sock",
                "start_pool": False,
                "watch_interval": 0,
                "backend": "fake",
            },
        }

    def test_embeds_its_own(self, jp_serverapp: Any, jp_fetch: Any, jp_asyncio_loop: Any) -> None:
        data = status(jp_fetch, jp_asyncio_loop)
        server = data["server"]
        assert server["arbiter"] == "embedded"
        assert server["arbiter_description"] == "embedded arbiter (this server's own)"
        pid = server["embedded_arbiter"]
        assert pid is not None and psutil.pid_exists(pid) and [p.pid for p in embedded_children()] == [pid]
        assert os.environ["KREX_ARBITER_KIND"] == "embedded"


def test_describe_kinds() -> None:
    from krex_lab.serverext.arbiter_kind import describe

    assert describe("embedded", "ipc:///x") == "embedded arbiter (this server's own)"
    assert (
        describe("node", "ipc:///run/krex/nonexistent.sock") == "node arbiter (root, ipc:///run/krex/nonexistent.sock)"
    )
    assert describe("user", "tcp://h:1") == "arbiter of this user (tcp://h:1)"


def test_log_says_which(caplog: pytest.LogCaptureFixture, node_arbiter: ArbiterProc, clean_env: None) -> None:
    from krex_lab.serverext.processes import Options, Services

    services = Services(
        Options(node_endpoint=node_arbiter.endpoint, start_pool=False), logger=logging.getLogger("krex.test")
    )
    with caplog.at_level(logging.INFO, logger="krex.test"):
        services.start()
    try:
        assert any("using the node arbiter (" in r.getMessage() for r in caplog.records), caplog.text
        assert services.arbiter is None
    finally:
        import asyncio

        asyncio.run(services.stop())
