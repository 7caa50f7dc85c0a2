"""The tools ``krex mcp`` serves; :func:`krex_lab.evaluate.mcp_server.build_server` imports this
module once the mcp SDK (which brings pydantic) is known to be there.

The SDK reads a tool's output schema from its return annotation with pydantic, which cannot read a
msgspec Struct: :class:`EvaluationOutput` is the pydantic model that stands for
:class:`~krex_lab.evaluate.result.Evaluation`, with msgspec's own schema of it, so that
``evaluate_kernel``'s output stays structured and described field by field.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pydantic
from pydantic.json_schema import JsonSchemaValue

from .result import Evaluation


def _inlined(node: Any, defs: dict[str, JsonSchemaValue], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``#/$defs/`` reference replaced by its definition (pydantic keeps its own
    table of definitions and does not know msgspec's)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                raise ValueError(f"{name} refers to itself: its schema cannot be inlined")
            return _inlined(defs[name], defs, (*seen, name))
        return {k: _inlined(v, defs, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [_inlined(v, defs, seen) for v in node]
    return node


class EvaluationOutput(pydantic.BaseModel):
    """``evaluate_kernel``'s output: made from an :class:`Evaluation`'s JSON by the tool, read by
    MCP clients. Its schema is msgspec's of :class:`Evaluation`; its fields pass as they are."""

    model_config = pydantic.ConfigDict(extra="allow")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> JsonSchemaValue:
        schema = msgspec.json.schema(Evaluation)
        inlined: JsonSchemaValue = _inlined({"$ref": schema["$ref"]}, schema["$defs"])
        return inlined

    @classmethod
    def of(cls, evaluation: Evaluation) -> EvaluationOutput:
        return cls.model_validate_json(evaluation.to_json())


def evaluate_kernel(
    reference: str,
    candidate: str,
    format: str = "auto",
    gpu: int | None = None,
    timing: str = "format",
    measure: bool = True,
    trials: int | None = None,
    mode: str = "benchmark",
    tests: str | None = None,
    benchmarks: str | None = None,
) -> EvaluationOutput:
    """Compile, check and time a candidate kernel against its reference; returns the verdict.

    reference / candidate: file paths, or the programs' source text. format: auto, kernelbench or
    gpumode. timing: format (the format's own method) or bench. measure=False: check only.
    GPU MODE: mode (test, benchmark, leaderboard), tests / benchmarks ('key: value; ...' lines).
    The result's verdict is one of correct, incorrect, compile_error, runtime_error, crashed,
    timeout, out_of_memory, rejected, error; runtime and ref_runtime are microseconds."""
    from .api import evaluate

    try:
        ev = evaluate(
            reference,
            candidate,
            format=format,
            gpu=gpu,
            timing=timing,
            measure=measure,
            trials=trials,
            mode=mode,
            tests=tests,
            benchmarks=benchmarks,
        )
    except (FileNotFoundError, ValueError, TypeError) as exc:
        ev = Evaluation(
            format=format,
            verdict="error",
            summary=f"error: {exc}",
            reference=reference,
            candidate=candidate,
            metadata={"evaluation_error": str(exc)},
        )
    return EvaluationOutput.of(ev)


def gpu_status() -> dict[str, Any]:
    """The node's GPUs: who holds each, the queues, the sessions (the arbiter's status)."""
    from ..connection import status

    return status()


def region_history(user: str = "", since_hours: float = 24.0, limit: int = 50) -> dict[str, Any]:
    """Finished regions (newest last): the last ``limit`` of ``user`` (all: "") of the last ``since_hours``."""
    from .. import protocol
    from ..connection import Connection

    conn = Connection()
    try:
        request = protocol.History(limit=limit, user=user, since=time.time() - since_hours * 3600, ticket=conn.ticket())
        result: dict[str, Any] = conn.call(request)
    finally:
        conn.close()
    return result


TOOLS = (evaluate_kernel, gpu_status, region_history)
