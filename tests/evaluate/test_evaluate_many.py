"""``evaluate_many`` over every GPU of a node (a real arbiter with 8 simulated GPUs, a real pool
of one worker per GPU), and the MCP tool over it."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import krex_lab
from krex_lab.evaluate.many import evaluate_many
from krex_lab.pytest_plugin import running_arbiter
from tests.support.pool import PoolProc

from .helpers import LIMITS, problem


@pytest.fixture(scope="module")
def node8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    base = tmp_path_factory.mktemp("many")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KREX_POOL_ENDPOINT", f"ipc://{base / 'rt' / 'pool.sock'}")
        mp.setenv("KREX_EVAL_CACHE", str(base / "cache"))
        for arbiter in running_arbiter(base, mp, gpus=8):
            pool = PoolProc(
                arbiter.env(),
                f"ipc://{arbiter.runtime / 'pool.sock'}",
                "--Pool.preload=torch",
                "--workers-per-gpu=1",
                "--spares=0",
                "--Pool.interrupt_grace=1.0",
                log=arbiter.runtime / "pool.log",
            )
            pool.start(300)
            try:
                yield pool
            finally:
                pool.stop()


@pytest.mark.timeout(600)
def test_evaluate_many_spreads_over_8_gpus_and_streams(node8: PoolProc) -> None:
    ref, fast = str(problem("kb_scaled_add")), str(problem("kb_scaled_add", "correct.py"))
    slow = {
        "reference": str(problem("kb_sim_memory")),
        "candidate": str(problem("kb_sim_memory", "slow_load.py")),
        "id": "slow",
    }
    pairs: list[Any] = [slow, *[(ref, fast)] * 7, ("/nonexistent/reference.py", fast)]
    seen: list[tuple[float, Any]] = []
    for record in evaluate_many(pairs, jobs=8, pool=node8.client, measure=False, trials=1, timeouts=LIMITS):
        seen.append((time.monotonic(), record))
    records = [r for _, r in seen]
    assert sorted(r.index for r in records) == list(range(9)), "exactly one result per pair"
    by_index = {r.index: r for r in records}
    assert by_index[8].verdict == "error" and "does not exist" in by_index[8].summary
    good = [by_index[i] for i in range(8)]
    assert [r.verdict for r in good] == ["correct"] * 8, [r.summary for r in good]
    assert sorted(r.gpu for r in good) == list(range(8)), "one evaluation on each GPU"
    assert all(r.metadata["admission"]["gpu"] == r.gpu for r in good)
    # streamed: the fast ones came while the slow one still ran
    slow_at = next(t for t, r in seen if r.id == "slow")
    first_at = seen[0][0]
    assert records[-1].id == "slow" and slow_at - first_at > 2.0, [(round(t - first_at, 2), r.id) for t, r in seen]


def test_evaluate_many_is_public_and_refuses_a_bad_option(node8: PoolProc) -> None:
    assert krex_lab.evaluate.evaluate_many is evaluate_many
    with pytest.raises(ValueError, match="unknown option"):
        next(evaluate_many([("a.py", "b.py")], pool=node8.client, colour="red"))
    with pytest.raises(ValueError, match="timing"):
        next(evaluate_many([("a.py", "b.py")], pool=node8.client, timing="fast"))


@pytest.mark.timeout(300)
async def test_the_mcp_tool_streams_each_result(eval_pool: PoolProc) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {**os.environ, **eval_pool.env}
    server = StdioServerParameters(command=sys.executable, args=["-m", "krex_lab.cli", "mcp"], env=env)
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        inputs = tools["evaluate_kernels"].input_schema["properties"]
        assert {"pairs", "detail", "jobs", "measure"} <= set(inputs)
        pairs = [
            {"reference": str(problem("kb_softmax")), "candidate": str(problem("kb_softmax", "correct.py")), "id": "a"},
            {"reference": str(problem("kb_softmax")), "candidate": str(problem("kb_softmax", "wrong_dim.py"))},
            {"reference": "/nonexistent/r.py", "candidate": "c.py", "id": "missing"},
        ]
        result = await session.call_tool(
            "evaluate_kernels", {"pairs": pairs, "measure": False}, progress_callback=on_progress
        )
    body = json.loads(result.content[0].text)
    assert [r["id"] for r in body["results"]] == ["a", "1", "missing"]
    assert [r["verdict"] for r in body["results"]] == ["correct", "incorrect", "error"], body
    assert body["verdicts"] == {"correct": 1, "incorrect": 1, "error": 1}
    assert len(notes) == 3 and {n.split(" ")[0] for n in notes} == {"1/3", "2/3", "3/3"}, notes
