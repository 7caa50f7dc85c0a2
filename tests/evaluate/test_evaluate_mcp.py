"""``krex mcp``: the MCP SDK's own client (stdio_client + ClientSession) starts the server, lists
its tools and gets a verdict from evaluate_kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from krex_lab.evaluate.result import VERDICTS
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.workers.client import PoolClient
from tests.support import ROOT
from tests.support.pool import PoolProc

from .helpers import problem


def _payload(result: Any) -> Any:
    return json.loads(result.content[0].text)


@pytest.mark.timeout(300)
async def test_an_mcp_client_gets_a_verdict_from_evaluate_kernel(eval_pool: PoolProc) -> None:
    env = {**os.environ, **eval_pool.env}
    server = StdioServerParameters(command=sys.executable, args=["-m", "krex_lab.cli", "mcp"], env=env)
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"evaluate_kernel", "gpu_status", "region_history", "evaluate_kernels"}
        # every option evaluate() takes, each described, the closed ones as enums
        inputs = tools["evaluate_kernel"].input_schema["properties"]
        assert {"atol", "rtol", "seed", "strict", "timing", "mode", "trials", "load_timeout", "check_timeout"} <= set(
            inputs
        ) and {"time_timeout", "max_case_s", "detail", "memory_limit_mb", "output_limit_mb", "disk_limit_mb"} <= set(
            inputs
        )
        assert all(prop.get("description") for prop in inputs.values()), [
            n for n, p in inputs.items() if not p.get("description")
        ]
        assert inputs["timing"]["enum"] == ["format", "bench", "converge"]
        assert inputs["mode"]["enum"] == ["test", "benchmark", "leaderboard"]
        assert inputs["detail"]["enum"] == ["compact", "full"]
        assert inputs["check_timeout"]["anyOf"][0]["exclusiveMinimum"] == 0
        # the output schema is the compact verdict's, field by field, the whole result's under "evaluation"
        schema = tools["evaluate_kernel"].output_schema or {}
        assert schema.get("type") == "object" and {"verdict", "summary", "format"} <= set(schema["required"])
        full_schema = schema["properties"]["evaluation"]["anyOf"][0]
        assert full_schema["properties"]["runtime_stats"]["anyOf"][0]["properties"]["mean"]["type"] == "number"
        phases: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            phases.append((message or "").split(":")[0])

        result = await session.call_tool(
            "evaluate_kernel",
            {"reference": str(problem("kb_softmax")), "candidate": str(problem("kb_softmax", "correct.py"))},
            progress_callback=on_progress,
        )
        verdict = _payload(result)
        assert len(result.content[0].text.encode()) <= 1024, "compact by default"
        assert verdict["verdict"] == "correct" and verdict["runtime"] > 0 and "evaluation" not in verdict
        assert result.structured_content == verdict, "the output stays structured"
        assert phases[0] == "queued" and phases[-1] == "done", phases
        missing = await session.call_tool("evaluate_kernel", {"reference": "/nonexistent/ref.py", "candidate": "x"})
        assert not missing.is_error and (missing.structured_content or {})["verdict"] == "error"
        assert _payload(missing)["reason_key"] == "evaluation_error" and "exists" in _payload(missing)["reason"]
        bad = await session.call_tool("evaluate_kernel", {"reference": "r.py", "candidate": "c.py", "timing": "fast"})
        assert bad.is_error and "timing" in bad.content[0].text  # the schema's enum refuses it, saying which
        wrong = _payload(
            await session.call_tool(
                "evaluate_kernel",
                {
                    "reference": str(problem("kb_softmax")),
                    "candidate": str(problem("kb_softmax", "wrong_dim.py")),
                    "detail": "full",
                    "seed": 3,
                },
            )
        )
        assert wrong["verdict"] == "incorrect" and wrong["reason_key"] == "correctness_issue"
        assert wrong["first_mismatch"] and "correctness_issue" in wrong["evaluation"]["metadata"]
        status = _payload(await session.call_tool("gpu_status", {}))
        assert status["gpus"][0]["index"] == 0
        history = _payload(await session.call_tool("region_history", {"limit": 5}))
        assert history["rows"] and len(history["rows"]) <= 5  # the evaluation's regions among them


@pytest.mark.timeout(300)
async def test_an_mcp_client_is_told_each_phase(eval_pool: PoolProc) -> None:
    env = {**os.environ, **eval_pool.env}
    server = StdioServerParameters(command=sys.executable, args=["-m", "krex_lab.cli", "mcp"], env=env)
    phases: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        phases.append((message or "").split(":")[0])

    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool(
            "evaluate_kernel",
            {"reference": str(problem("kb_softmax")), "candidate": str(problem("kb_softmax", "correct.py"))},
            progress_callback=on_progress,
        )
    assert phases == ["queued", "load", "check", "time", "done"]


def _alone(tmp_path: Path) -> dict[str, str]:
    """A user's environment on a machine where no arbiter and no pool of theirs runs yet."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("KREX_ENDPOINT", "KREX_POOL_ENDPOINT")}
    return env | {"KREX_RUNTIME_DIR": str(runtime), "KREX_NODE_ENDPOINT": "", "PYTHONPATH": str(ROOT)}


def _krex_mcp(env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "krex_lab.cli", "mcp"], env=env)


@pytest.mark.timeout(120)
async def test_the_tools_schemas_say_what_each_field_is_and_unknown_arguments_are_refused(tmp_path: Path) -> None:
    async with stdio_client(_krex_mcp(_alone(tmp_path))) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        out = tools["evaluate_kernel"].output_schema or {}
        undescribed = [n for n, p in out["properties"].items() if not p.get("description")]
        assert len(out["properties"]) == 14 and not undescribed, undescribed
        assert out["properties"]["verdict"]["enum"] == list(VERDICTS)
        status = tools["gpu_status"].output_schema or {}
        gpu = status["properties"]["gpus"]["items"]
        assert {"index", "gate", "holder", "queue"} <= set(gpu["properties"]), gpu
        history = tools["region_history"].output_schema or {}
        row = history["properties"]["rows"]["items"]["properties"]
        assert {"region", "gpu", "user", "granted_at", "released_at"} <= set(row), row
        args = tools["region_history"].input_schema["properties"]
        assert set(args) == {"user", "since_hours", "limit"} and all(a.get("description") for a in args.values())
        for tool in tools.values():
            assert tool.input_schema.get("additionalProperties") is False, tool.name
        refused = await session.call_tool("region_history", {"limit": 5, "timeout": 5})
        assert refused.is_error and "timeout" in refused.content[0].text, refused.content[0].text
        assert "Extra inputs are not permitted" in refused.content[0].text
        refused = await session.call_tool("evaluate_kernel", {"reference": "r.py", "candidate": "c.py", "timeout": 5})
        assert refused.is_error and "timeout" in refused.content[0].text


@pytest.mark.timeout(180)
async def test_without_an_arbiter_each_tool_says_why_and_history_reads_the_database(tmp_path: Path) -> None:
    env = _alone(tmp_path)
    arb = ArbiterProc(Path(env["KREX_RUNTIME_DIR"]), gpus=1).start()  # one region, recorded; then gone
    try:
        held = subprocess.run(
            [sys.executable, "-m", "krex_lab.cli", "exclusive", "--quiet", "--", "true"],
            env=arb.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert held.returncode == 0, held.stderr
    finally:
        arb.stop()
    async with stdio_client(_krex_mcp(env)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        status = await session.call_tool("gpu_status", {})
        assert status.is_error and "no KREX arbiter answers at" in status.content[0].text, status.content[0].text
        history = await session.call_tool("region_history", {"limit": 5})
        assert not history.is_error, history.content[0].text
        found = history.structured_content or {}
        assert len(found["rows"]) == 1 and found["rows"][0]["gpu"] == 0, found
        assert "history database" in found["source"], found


@pytest.mark.timeout(300)
async def test_the_pool_the_server_started_ends_with_it(tmp_path: Path) -> None:
    env = _alone(tmp_path)
    endpoint = f"ipc://{env['KREX_RUNTIME_DIR']}/pool.sock"
    async with stdio_client(_krex_mcp(env)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool(
            "evaluate_kernel",
            {
                "reference": str(problem("kb_softmax")),
                "candidate": str(problem("kb_softmax", "correct.py")),
                "measure": False,
                "exclusive": False,
            },
        )
        assert (result.structured_content or {}).get("verdict") == "correct", result.content[0].text
        with PoolClient.connect(endpoint, start=False) as pool:
            assert pool.info is not None
            pid = pool.info.pid
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30)


def test_print_config_names_this_installation_by_absolute_path(tmp_path: Any) -> None:
    env = {**os.environ, "KREX_RUNTIME_DIR": "relative/rt"}
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "mcp", "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)["mcpServers"]["krex"]
    command = entry["command"]
    assert os.path.isabs(command) and os.access(command, os.X_OK)
    assert entry["env"] == {"KREX_RUNTIME_DIR": str(tmp_path / "relative" / "rt")}
    # the command it names starts this server: run it as a client would, from anywhere
    ran = subprocess.run([command, *entry["args"], "--help"], capture_output=True, text=True, timeout=60, cwd="/")
    assert ran.returncode == 0 and "--print-config" in ran.stdout
