"""``krex mcp``: KREX as a Model Context Protocol server on stdio, for LLM agents.

Tools: ``evaluate_kernel`` (:func:`krex_lab.evaluate` on a reference and a candidate, paths or
source text: the :class:`~krex_lab.evaluate.result.Evaluation` as a JSON object),
``gpu_status`` (the node's GPUs, holders, queues and sessions) and ``region_history`` (finished
regions). Built on the ``mcp`` SDK (``pip install 'krex-lab[eval]'``): ``MCPServer`` of mcp 2,
``FastMCP`` of mcp 1.

stdout is the protocol's: the server keeps the real one for it and points fd 1 at stderr, so a
stray print (a library's, a pool started on demand) can never corrupt a message.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Any

__all__ = ["add_arguments", "build_server", "run"]

INSTRUCTIONS = (
    "KREX evaluates GPU kernels on shared GPUs, each timed with the GPU to itself. evaluate_kernel takes a "
    "reference and a candidate (file paths, or the source text) in KernelBench format (Model / get_inputs / "
    "get_init_inputs against ModelNew) or GPU MODE format (generate_input / ref_kernel / check_implementation "
    "against custom_kernel) and returns a verdict: compiled, correctness, runtime and ref_runtime in "
    "microseconds, speedup, and metadata naming any error."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default="krex", help="the server's name, as clients list it")


def _server_class() -> Any:
    try:
        from mcp.server.mcpserver import MCPServer

        return MCPServer
    except ImportError:
        pass
    try:  # mcp 1 (its FastMCP module is gone in mcp 2)
        import importlib

        return importlib.import_module("mcp.server.fastmcp").FastMCP
    except ImportError:
        from ..errors import MissingDependency

        raise MissingDependency(
            "krex mcp needs the mcp package: pip install 'krex-lab[eval]' (or pip install mcp)"
        ) from None


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
) -> dict[str, Any]:
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
        return {"verdict": "error", "summary": f"error: {exc}", "metadata": {"evaluation_error": str(exc)}}
    return ev.to_dict()


def gpu_status() -> dict[str, Any]:
    """The node's GPUs: who holds each, the queues, the sessions (the arbiter's status)."""
    from ..connection import status

    return status()


def region_history(user: str = "", since_hours: float = 24.0, limit: int = 50) -> dict[str, Any]:
    """Finished regions (newest last): the last ``limit`` of ``user`` (all: "") of the last ``since_hours``."""
    import time

    from .. import protocol
    from ..connection import Connection

    conn = Connection()
    try:
        request = protocol.History(limit=limit, user=user, since=time.time() - since_hours * 3600, ticket=conn.ticket())
        result: dict[str, Any] = conn.call(request)
    finally:
        conn.close()
    return result


def build_server(name: str = "krex") -> Any:
    server = _server_class()(name, instructions=INSTRUCTIONS)
    for tool in (evaluate_kernel, gpu_status, region_history):
        server.tool()(tool)
    return server


def run(args: argparse.Namespace) -> int:
    server = build_server(args.name)
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything written to fd 1 from now on goes to stderr, never into a message
    sys.stdout = io.TextIOWrapper(protocol_out, encoding="utf-8", line_buffering=True)
    server.run("stdio")
    return 0
