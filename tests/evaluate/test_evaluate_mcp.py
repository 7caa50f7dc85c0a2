"""``krex mcp``: the MCP SDK's own client (stdio_client + ClientSession) starts the server, lists
its tools and gets a verdict from evaluate_kernel."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

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
        assert set(tools) == {"evaluate_kernel", "gpu_status", "region_history"}
        # the output schema is the Evaluation's, field by field (not a bare "object")
        schema = tools["evaluate_kernel"].output_schema or {}
        assert schema.get("type") == "object" and {"verdict", "summary", "reference"} <= set(schema["required"])
        assert schema["properties"]["runtime_stats"]["anyOf"][0]["properties"]["mean"]["type"] == "number"
        result = await session.call_tool(
            "evaluate_kernel",
            {"reference": str(problem("kb_softmax")), "candidate": str(problem("kb_softmax", "correct.py"))},
        )
        verdict = _payload(result)
        assert verdict["verdict"] == "correct" and verdict["correctness"] is True and verdict["runtime"] > 0
        assert result.structured_content == verdict, "the output stays structured"
        missing = await session.call_tool("evaluate_kernel", {"reference": "/nonexistent/ref.py", "candidate": "x"})
        assert not missing.is_error and (missing.structured_content or {})["verdict"] == "error"
        assert "evaluation_error" in _payload(missing)["metadata"]
        wrong = _payload(
            await session.call_tool(
                "evaluate_kernel",
                {"reference": str(problem("kb_softmax")), "candidate": str(problem("kb_softmax", "wrong_dim.py"))},
            )
        )
        assert wrong["verdict"] == "incorrect" and "correctness_issue" in wrong["metadata"]
        status = _payload(await session.call_tool("gpu_status", {}))
        assert status["gpus"][0]["index"] == 0
        history = _payload(await session.call_tool("region_history", {"limit": 5}))
        assert history["rows"] and len(history["rows"]) <= 5  # the evaluation's regions among them
