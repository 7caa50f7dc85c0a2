"""``krex mcp``: KREX as a Model Context Protocol server on stdio, for LLM agents.

Tools (:mod:`.mcp_tools`): ``evaluate_kernel`` (:func:`krex_lab.evaluate` on a reference and a
candidate, paths or source text: the :class:`~krex_lab.evaluate.result.Evaluation` as a JSON
object, its schema the tool's output schema), ``gpu_status`` (the node's GPUs, holders, queues and
sessions) and ``region_history`` (finished regions). Built on the ``mcp`` SDK (``pip install
'krex-lab[eval]'``): ``MCPServer`` of mcp 2, ``FastMCP`` of mcp 1.

stdout is the protocol's: the server keeps the real one for it and points fd 1 at stderr, so a
stray print (a library's, a pool started on demand) can never corrupt a message.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from typing import Any, TypedDict

__all__ = ["add_arguments", "build_server", "client_config", "run"]

INSTRUCTIONS = (
    "KREX evaluates GPU kernels on shared GPUs, each timed with the GPU to itself. evaluate_kernel takes a "
    "reference and a candidate (file paths, or the source text) in KernelBench format (Model / get_inputs / "
    "get_init_inputs against ModelNew) or GPU MODE format (generate_input / ref_kernel / check_implementation "
    "against custom_kernel) and returns a verdict: compiled, correctness, runtime and ref_runtime in "
    "microseconds, speedup, and metadata naming any error."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default="krex", help="the server's name, as clients list it")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the JSON an MCP client's configuration takes to start this server (absolute paths), and exit",
    )


class _ServerCommand(TypedDict):
    command: str
    args: list[str]


class ServerEntry(_ServerCommand, total=False):
    """How an MCP client starts this server: ``command`` with ``args``, in ``env``."""

    env: dict[str, str]


class ClientConfig(TypedDict):
    """An MCP client's configuration of this server (the JSON ``--print-config`` prints)."""

    mcpServers: dict[str, ServerEntry]  # the MCP clients' own key


def client_config(name: str = "krex") -> ClientConfig:
    """An MCP client's ``mcpServers`` entry that starts this very installation's server: the
    ``krex`` beside this Python (a virtualenv's ``bin/``), by its absolute path, else this Python
    with ``-m krex_lab.cli``; ``KREX_RUNTIME_DIR`` where it is set (the lab to talk to)."""
    python = os.path.abspath(sys.executable)  # not resolved: a virtualenv's python is a link out of it
    krex = os.path.join(os.path.dirname(python), "krex")
    if os.path.isfile(krex) and os.access(krex, os.X_OK):
        entry: ServerEntry = {"command": krex, "args": ["mcp"]}
    else:
        entry = {"command": python, "args": ["-m", "krex_lab.cli", "mcp"]}
    if name != "krex":
        entry["args"] += ["--name", name]
    runtime = os.environ.get("KREX_RUNTIME_DIR")
    if runtime:
        entry["env"] = {"KREX_RUNTIME_DIR": os.path.abspath(runtime)}
    return {"mcpServers": {name: entry}}


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


def build_server(name: str = "krex") -> Any:
    server = _server_class()(name, instructions=INSTRUCTIONS)
    from .mcp_tools import TOOLS, refuse_unknown_arguments  # pydantic: there with the mcp SDK

    for tool in TOOLS:
        server.tool()(tool)
    refuse_unknown_arguments(server)
    return server


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        import json

        print(json.dumps(client_config(args.name), indent=2))
        return 0
    server = build_server(args.name)
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything written to fd 1 from now on goes to stderr, never into a message
    sys.stdout = io.TextIOWrapper(protocol_out, encoding="utf-8", line_buffering=True)
    # A client that ends the server (SIGTERM, after closing its stdin) ends it through the
    # finally below: the pool it started on demand goes with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.run("stdio")
    finally:
        from .mcp_pool import end_started_pool

        said = end_started_pool()
        if said:
            print(f"krex mcp: {said}", file=sys.stderr, flush=True)
    return 0
