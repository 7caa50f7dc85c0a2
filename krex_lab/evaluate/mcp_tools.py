"""The tools ``krex mcp`` serves; :func:`krex_lab.evaluate.mcp_server.build_server` imports this
module once the mcp SDK (which brings pydantic) is known to be there.

The SDK reads a tool's input schema from the signature (pydantic: each argument's type, range,
enum and description) and its output schema from the return annotation, which cannot be a msgspec
Struct: :class:`EvaluationOutput` is the pydantic model that stands for the compact verdict
(:class:`~krex_lab.evaluate.compact.Compact`, the whole
:class:`~krex_lab.evaluate.result.Evaluation` under ``evaluation`` on request), with msgspec's
own schemas, so that ``evaluate_kernel``'s output stays structured and described field by field.

``evaluate_kernel`` runs the evaluation in a thread of the server and reports its phases to the
client as MCP progress notifications (when the client asked for them with a progress token).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal

import anyio
import msgspec
import pydantic
from pydantic import Field
from pydantic.json_schema import JsonSchemaValue

from ..arbiter.history import HistoryRow
from ..node_status import NodeStatus
from .compact import Compact, compact
from .mcp_pool import server_pool  # the server's one pool (ended with it)
from .progress import PHASES
from .result import Evaluation
from .task import Case

try:  # mcp 2
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1
    from mcp.server.fastmcp import Context  # type: ignore[no-redef,attr-defined,unused-ignore]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef,import-not-found,unused-ignore]


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


def _schema_of(struct: Any) -> JsonSchemaValue:
    schema = msgspec.json.schema(struct)
    inlined: JsonSchemaValue = _inlined({"$ref": schema["$ref"]}, schema["$defs"])
    return inlined


class EvaluationOutput(pydantic.BaseModel):
    """``evaluate_kernel``'s output: the compact verdict (:class:`~.compact.Compact`), with the
    whole :class:`Evaluation` under ``evaluation`` on request. Its schema is msgspec's of both,
    field by field; its fields pass as they are."""

    model_config = pydantic.ConfigDict(extra="allow")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> JsonSchemaValue:
        schema = _schema_of(Compact)
        schema["properties"]["evaluation"] = {
            "anyOf": [_schema_of(Evaluation), {"type": "null"}],
            "description": 'the whole result (detail: "full")',
        }
        return schema

    @classmethod
    def of(cls, evaluation: Evaluation, full: bool = False) -> EvaluationOutput:
        return cls.model_validate_json(msgspec.json.encode(compact(evaluation, full=full)))


_STEPS = {phase: n for n, phase in enumerate(PHASES)}

_DEFAULT_LIMIT = "; default: a GPU MODE task's limit for the mode, else "
LoadTimeout = Annotated[
    float | None, Field(gt=0, description="seconds the load phase (compile, import) may take" + _DEFAULT_LIMIT + "600")
]
CheckTimeout = Annotated[
    float | None,
    Field(gt=0, description="seconds the check phase (correctness trials) may take" + _DEFAULT_LIMIT + "300"),
]
TimeTimeout = Annotated[
    float | None, Field(gt=0, description="seconds the time phase (warm-up, timing) may take" + _DEFAULT_LIMIT + "300")
]


async def evaluate_kernel(
    reference: Annotated[
        str,
        Field(
            description="the reference: a file path, its source text, or a published GPU MODE problem "
            "(its directory, or a file beside its task.yml)"
        ),
    ],
    candidate: Annotated[
        str, Field(description="the candidate (ModelNew, or custom_kernel): a file path or its source")
    ],
    format: Annotated[
        Literal["auto", "kernelbench", "gpumode"], Field(description="auto: told by the names the files define")
    ] = "auto",
    detail: Annotated[
        Literal["compact", "full"],
        Field(
            description='compact: the verdict and its reasons (under 1 KB); full: also the whole result ("evaluation")'
        ),
    ] = "compact",
    gpu: Annotated[int | None, Field(ge=0, description="the GPU's index; default: the pool picks")] = None,
    timing: Annotated[
        Literal["format", "bench", "converge"],
        Field(
            description="format: the format's own method; bench: krex_lab.bench's (held stream, L2 flush); "
            "converge: GPU MODE's until the mean's relative standard error is 0.1 % or max_case_s"
        ),
    ] = "format",
    measure: Annotated[bool, Field(description="false: compile and check only, no timing")] = True,
    trials: Annotated[int | None, Field(ge=1, description="correctness trials (KernelBench: 5)")] = None,
    perf_trials: Annotated[int | None, Field(ge=1, description="KernelBench's timed calls (100)")] = None,
    mode: Annotated[
        Literal["test", "benchmark", "leaderboard"],
        Field(description="GPU MODE: test (check only), benchmark, leaderboard (re-check every timed run)"),
    ] = "benchmark",
    tests: Annotated[
        str | list[Case] | None,
        Field(description="GPU MODE test cases: 'key: value; key: value' lines, a file of them, or a list of objects"),
    ] = None,
    benchmarks: Annotated[str | list[Case] | None, Field(description="GPU MODE benchmark cases, as tests")] = None,
    atol: Annotated[float | None, Field(ge=0, description="absolute tolerance; default by the output's dtype")] = None,
    rtol: Annotated[float | None, Field(ge=0, description="relative tolerance; default by the output's dtype")] = None,
    seed: Annotated[
        int | None, Field(ge=0, description="the inputs' seed (default: a secret one, said in the result)")
    ] = None,
    strict: Annotated[bool, Field(description="re-check the output of every timed call")] = False,
    max_case_s: Annotated[
        float | None, Field(gt=0, description="seconds of timing per case at most (GPU MODE's methods; 10)")
    ] = None,
    load_timeout: LoadTimeout = None,
    check_timeout: CheckTimeout = None,
    time_timeout: TimeTimeout = None,
    memory_limit_mb: Annotated[
        int | None, Field(ge=0, description="host memory the candidate may add, MiB (16384; 0: no limit)")
    ] = None,
    output_limit_mb: Annotated[
        int | None, Field(ge=1, description="what the candidate may print per phase, MiB (16)")
    ] = None,
    disk_limit_mb: Annotated[
        int | None, Field(ge=0, description="disk the candidate may use, MiB (4096; 0: not watched)")
    ] = None,
    retime_reference: Annotated[bool, Field(description="time the reference again though its time is cached")] = False,
    time_reference: Annotated[bool, Field(description="false: no reference time, no speedup")] = True,
    exclusive: Annotated[bool, Field(description="false: time without a region (the GPU shared; said)")] = True,
    ctx: Context | None = None,
) -> EvaluationOutput:
    """Compile, check and time a candidate kernel against its reference; returns the verdict.

    KernelBench (Model / get_inputs / get_init_inputs against ModelNew) or GPU MODE
    (generate_input / ref_kernel / check_implementation against custom_kernel; a problem's
    directory with its task.yml). verdict: correct, incorrect, compile_error, runtime_error, crashed,
    timeout, out_of_memory, rejected, error; reason_key and reason say why; runtime and
    ref_runtime are microseconds. Progress is reported per phase (queued, load, check, time, done)."""
    from .api import evaluate
    from .options import EvaluateOptions

    timeouts = {
        phase: s
        for phase, s in (("load", load_timeout), ("check", check_timeout), ("time", time_timeout))
        if s is not None
    }
    given = {k: v for k, v in locals().items() if k in EvaluateOptions.__struct_fields__}

    def progress(phase: str, what: str) -> None:
        if ctx is not None:
            step = _STEPS.get(phase, 0)
            anyio.from_thread.run(ctx.report_progress, step, len(PHASES) - 1, f"{phase}: {what}"[:200])

    def run() -> Evaluation:
        try:
            options = EvaluateOptions.of({**given, "timeouts": given["timeouts"] or None})
            return evaluate(reference, candidate, options=options, progress=progress, pool=server_pool())
        except Exception as exc:  # every failure is an answer saying why, never a bare protocol error
            kind = "evaluation_error" if isinstance(exc, (FileNotFoundError, ValueError, TypeError)) else "pool_error"
            return Evaluation(
                format=format,
                verdict="error",
                summary=f"error: {type(exc).__name__}: {exc}",
                reference=reference if "\n" not in reference else "<string>",
                candidate=candidate if "\n" not in candidate else "<string>",
                metadata={"evaluation_error": f"{kind}: {type(exc).__name__}: {exc}"},
            )

    ev = await anyio.to_thread.run_sync(run)
    return EvaluationOutput.of(ev, full=detail == "full")


class _MsgspecOutput(pydantic.BaseModel):
    """An output whose schema is msgspec's of :attr:`STRUCT` (pydantic does not know msgspec's
    types); its fields pass as they are."""

    model_config = pydantic.ConfigDict(extra="allow")
    STRUCT: ClassVar[Any] = None

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> JsonSchemaValue:
        return _schema_of(cls.STRUCT)


class GpuStatusOutput(_MsgspecOutput):
    """``gpu_status``'s output: the node's table, as ``krex status --json`` gives it."""

    STRUCT = NodeStatus


class RegionHistoryOutput(pydantic.BaseModel):
    """``region_history``'s output."""

    rows: list[dict[str, Any]] = Field(
        description="finished regions, newest last; another user's keep only their public fields"
    )
    source: str = Field(
        description="where the rows come from: the arbiter, or (none answering) its history database, read here"
    )

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> JsonSchemaValue:
        schema: JsonSchemaValue = handler(core_schema)
        row = _schema_of(HistoryRow)
        row.pop("required", None)  # a reduced row (another user's) leaves fields out
        schema["properties"]["rows"]["items"] = row
        return schema


def _refused(exc: BaseException) -> ToolError:
    """A failure as the agent's result says it (the SDK hides an unexpected exception's text)."""
    return ToolError(str(exc) or type(exc).__name__)


def gpu_status() -> GpuStatusOutput:
    """The node's GPUs: who holds each, the queues, the sessions (the arbiter's status). Fails,
    saying so, where no arbiter answers (evaluate_kernel still runs then, without a region)."""
    from ..connection import status
    from ..errors import KrexError

    try:
        return GpuStatusOutput.model_validate(status())
    except KrexError as exc:
        raise _refused(exc) from None


def region_history(
    user: Annotated[str, Field(description="only this user's regions (a login name); \"\": everyone's")] = "",
    since_hours: Annotated[float, Field(gt=0, description="only regions of the last this many hours")] = 24.0,
    limit: Annotated[int, Field(ge=1, le=10000, description="at most this many regions, the newest")] = 50,
) -> RegionHistoryOutput:
    """Finished regions (newest last): who held which GPU, when, how long, how long they waited.
    Read from the arbiter's history database directly where no arbiter answers, as `krex history`."""
    import argparse

    from .. import discovery
    from ..arbiter.history_cli import _query, read_database
    from ..errors import ArbiterUnavailable, KrexError

    since = time.time() - since_hours * 3600
    args = argparse.Namespace(limit=limit, user=user, until=None, usage=False, slurm_job="", by="", db=None, json=True)
    endpoint = discovery.default_endpoint()
    try:
        try:
            answer: Any = _query(args, since, endpoint)
            return RegionHistoryOutput(rows=list(answer.get("rows", [])), source=f"the arbiter at {endpoint}")
        except ArbiterUnavailable:
            recent = read_database(args, since, endpoint)
            rows = [r.to_dict() for r in getattr(recent, "rows", [])]
            return RegionHistoryOutput(
                rows=rows, source=f"no KREX arbiter answers at {endpoint}: its history database, read directly"
            )
    except KrexError as exc:
        raise _refused(exc) from None


from .mcp_many import evaluate_kernels  # noqa: E402 - many pairs over every GPU: a module of its own

TOOLS = (evaluate_kernel, gpu_status, region_history, evaluate_kernels)


def refuse_unknown_arguments(server: Any) -> None:
    """Every tool of ``server`` refuses an argument it does not take, naming it (the SDK drops
    them silently), and its input schema says so (``additionalProperties: false``)."""
    manager = getattr(server, "_tool_manager", None)
    for tool in manager.list_tools() if manager is not None else ():
        model = tool.fn_metadata.arg_model
        model.model_config["extra"] = "forbid"
        model.model_rebuild(force=True)
        tool.parameters["additionalProperties"] = False
