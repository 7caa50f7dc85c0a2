"""``evaluate_kernels``, the MCP tool over :func:`krex_lab.evaluate.many.evaluate_many`: many
pairs placed over every GPU of the node, admitted by GPU memory, each result reported as a
progress notification the moment it finishes, and all of them in the answer (in the pairs'
order). Imported by :mod:`.mcp_tools` with the SDK (pydantic)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

import anyio
import msgspec
import pydantic
from pydantic import Field

from .compact import compact

try:  # mcp 2
    from mcp.server.mcpserver import Context
except ImportError:  # mcp 1
    from mcp.server.fastmcp import Context  # type: ignore[no-redef,attr-defined,unused-ignore]

__all__ = ["evaluate_kernels"]


class KernelPair(pydantic.BaseModel):
    """One pair to evaluate."""

    model_config = pydantic.ConfigDict(extra="forbid")

    reference: str = Field(description="the reference: a file path, its source text, or a GPU MODE problem")
    candidate: str = Field(description="the candidate: a file path or its source text")
    id: str | None = Field(default=None, description="a name for the pair in the answer (default: its index)")
    format: Literal["auto", "kernelbench", "gpumode"] = Field(default="auto", description="auto: told by the names")


class ManyOutput(pydantic.BaseModel):
    """Every pair's result, in the order given."""

    results: list[dict[str, Any]] = Field(
        description="per pair: index, id, and evaluate_kernel's compact verdict (verdict, summary, speedup, "
        "runtime, reason ...); the whole result under evaluation with detail full"
    )
    verdicts: dict[str, int] = Field(description="how many pairs had each verdict")


async def evaluate_kernels(
    pairs: Annotated[
        list[KernelPair], Field(min_length=1, max_length=1000, description="the (reference, candidate) pairs")
    ],
    detail: Annotated[
        Literal["compact", "full"], Field(description="compact: each verdict and its reasons; full: each whole result")
    ] = "compact",
    jobs: Annotated[
        int | None, Field(ge=1, description="evaluations at once (default: 4 per GPU); GPU memory bounds them too")
    ] = None,
    measure: Annotated[bool, Field(description="false: compile and check only, no timing")] = True,
    trials: Annotated[int | None, Field(ge=1, description="correctness trials (KernelBench: 5)")] = None,
    perf_trials: Annotated[int | None, Field(ge=1, description="KernelBench's timed calls (100)")] = None,
    ctx: Context | None = None,
) -> ManyOutput:
    """Evaluate many candidate kernels against their references at once, over every GPU of the
    node; each evaluation starts when its GPU has the memory for it. Each result is reported as a
    progress notification as soon as it finishes ("N/TOTAL id: summary"); the answer holds every
    pair's, in order, exactly one each (a pair that cannot run is verdict error, saying why)."""
    from .many import evaluate_many
    from .mcp_pool import server_pool

    given = [p.model_dump() for p in pairs]
    items = [{**p, "id": p["id"] if p["id"] is not None else str(i)} for i, p in enumerate(given)]
    results: list[dict[str, Any] | None] = [None] * len(items)
    done = 0

    def report(index: int, line: str) -> None:
        if ctx is not None:
            anyio.from_thread.run(ctx.report_progress, index, len(items), line[:300])

    def run() -> None:
        nonlocal done
        # the server's pool: one it had to start ends with the server, as evaluate_kernel's does
        given = evaluate_many(
            items, jobs=jobs, pool=server_pool(), measure=measure, trials=trials, perf_trials=perf_trials
        )
        for record in given:
            body = msgspec.to_builtins(compact(record, full=detail == "full"))
            results[record.index] = {"index": record.index, "id": record.id, **body}
            done += 1
            report(done, f"{done}/{len(items)} {record.id}: {record.summary}")

    try:
        await anyio.to_thread.run_sync(run)
    except Exception as exc:  # no pool, a bad option: every pair still has its answer
        for i, item in enumerate(items):
            if results[i] is None:
                results[i] = {
                    "index": i,
                    "id": item["id"],
                    "verdict": "error",
                    "summary": f"error: {type(exc).__name__}: {exc}",
                }
    out = [r for r in results if r is not None]
    return ManyOutput(results=out, verdicts=dict(Counter(str(r["verdict"]) for r in out)))
