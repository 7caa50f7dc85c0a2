"""The package's import graph has no cycles: not at module level, not behind TYPE_CHECKING, not
inside functions. Every import of a ``krex_lab`` module counts, wherever it is written."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "krex_lab"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    """Every ``krex_lab`` module and the ``krex_lab`` modules it imports (a fresh copy each call)."""
    return {m: set(ts) for m, ts in _parsed_graph().items()}


@functools.cache
def _parsed_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                # `from . import x` names a submodule when x is one; else the package itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import a.b.c` of a module's attribute
                    target = target.rpartition(".")[0]
                if target.startswith("krex_lab") and target != name:
                    graph[name].add(target)
    return graph


def _packages_of(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    # A package's __init__ importing its own submodules is how re-exports work, not a cycle.
    edges = {m: {t for t in ts if t not in _packages_of(m)} for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (cycle := visit(t)) is not None:
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)) is not None:
            return cycle
    return None


def test_the_checker_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_in_krex_lab() -> None:
    cycle = find_cycle(import_graph())
    if cycle is not None:
        pytest.fail("import cycle: " + " -> ".join(cycle))


#: packages that run as servers or as the pool's processes: they never import the facade (``krex_lab``
#: itself, which pulls the client API, the evaluator and the magics)
SERVER_PACKAGES = ("krex_lab.arbiter", "krex_lab.workers", "krex_lab.serverext", "krex_lab.hub")

#: (importer prefix, imported prefix, why): edges that would run back up through the layers
FORBIDDEN = [
    ("krex_lab.workers", "krex_lab.evaluate", "the pool runs jobs; the evaluator is one of its clients"),
    ("krex_lab.arbiter", "krex_lab.client", "the arbiter's own tools speak through krex_lab.connection"),
    ("krex_lab.evaluate.judge", "krex_lab.evaluate.candidate", "the judge never loads the candidate's side"),
    ("krex_lab.evaluate.candidate", "krex_lab.evaluate.judge", "the candidate's side knows nothing of the judge"),
]

#: what the candidate's side (the hostile process) may import of the package besides itself: the
#: channel to its judge, and leaves (modules that import nothing of the package)
CANDIDATE = "krex_lab.evaluate.candidate"
CANDIDATE_MAY = ("krex_lab.evaluate.channel",)

#: the candidate kernel library: material for the user's notebooks and the benchmarks, which the lab
#: itself never needs (so no server, pool or ``import krex_lab`` loads numba through it). It imports of
#: the package only the harness its ``KernelSpec.check`` runs.
LIBRARY = "krex_lab.kernels"
LIBRARY_MAY = ("krex_lab.bench",)


#: the only modules outside ``krex_lab.arbiter`` that may import it: what runs or administers an
#: arbiter. Every other module reads the arbiter through the wire (``protocol``, ``node_status``,
#: ``connection``), so a client, a notebook kernel or a pool never loads the server's code.
ARBITER_USERS = {
    "krex_lab.cli": "`krex arbiter` and `krex supervise` run one, `krex history` reads its database",
    "krex_lab.hub.admin_page": "the admin service administers the node: the arbiter's quotas and history",
    "krex_lab.ray.node": "Ray's node service runs the node's arbiter and reads its history",
    "krex_lab.slurm": "the Slurm prolog admits jobs to the arbiter: it writes the job records the arbiter reads",
    "krex_lab.evaluate.mcp_tools": "`krex mcp`'s region history reads the arbiter's database where none answers, "
    "as `krex history` does",
}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for m, targets in graph.items():
        if any(_under(m, s) for s in SERVER_PACKAGES) and "krex_lab" in targets:
            found.append(f"{m} -> krex_lab (a server package imports the facade)")
        for src, dst, why in FORBIDDEN:
            found += [f"{m} -> {t} ({why})" for t in sorted(targets) if _under(m, src) and _under(t, dst)]
        if _under(m, CANDIDATE):
            found += [
                f"{m} -> {t} (the candidate's side imports only the channel and leaves)"
                for t in sorted(targets)
                if not _under(t, CANDIDATE) and t not in CANDIDATE_MAY and graph.get(t)
            ]
        if _under(m, LIBRARY):
            found += [
                f"{m} -> {t} (the kernel library imports only the bench harness)"
                for t in sorted(targets)
                if not _under(t, LIBRARY) and not any(_under(t, may) for may in LIBRARY_MAY)
            ]
        else:
            found += [
                f"{m} -> {t} (nothing of the lab needs the kernel library)"
                for t in sorted(targets)
                if _under(t, LIBRARY)
            ]
        if not _under(m, "krex_lab.arbiter") and m not in ARBITER_USERS:
            found += [
                f"{m} -> {t} (neither runs nor administers an arbiter: read it through the wire)"
                for t in sorted(targets)
                if _under(t, "krex_lab.arbiter")
            ]
    return found


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("krex_lab.arbiter.app", "krex_lab"),
        ("krex_lab.workers.pool.service", "krex_lab"),
        ("krex_lab.serverext.app", "krex_lab"),
        ("krex_lab.hub.config", "krex_lab"),
        ("krex_lab.workers.context.worker", "krex_lab.evaluate.judge.spares"),
        ("krex_lab.arbiter.history_cli", "krex_lab.client"),
        ("krex_lab.client", "krex_lab.arbiter.status"),
        ("krex_lab.serverext.handlers", "krex_lab.arbiter.sessions"),
        ("krex_lab.workers.pool.gates", "krex_lab.arbiter"),
        ("krex_lab.node_status", "krex_lab.arbiter.slurm_jobs"),
        ("krex_lab.evaluate.judge.session", "krex_lab.evaluate.candidate.sandbox"),
        ("krex_lab.evaluate.candidate.process", "krex_lab.workers.context.runner"),
        ("krex_lab.kernels.spec", "krex_lab.client"),
        ("krex_lab.bench.timing", "krex_lab.kernels.registry"),
        ("krex_lab", "krex_lab.kernels"),
    ],
)
def test_the_layer_checker_sees_a_planted_edge(importer: str, imported: str) -> None:
    graph = import_graph()
    assert forbidden_edges(graph) == []
    graph.setdefault(importer, set()).add(imported)
    assert [e.split(" (")[0] for e in forbidden_edges(graph)] == [f"{importer} -> {imported}"]


def test_the_arbiter_users_are_real_and_need_it() -> None:
    """Each module let through imports the arbiter today: one that stopped needing it leaves the list."""
    graph = import_graph()
    for m in ARBITER_USERS:
        assert any(_under(t, "krex_lab.arbiter") for t in graph[m]), f"{m} no longer imports the arbiter"


def test_no_import_runs_back_up_through_the_layers() -> None:
    assert forbidden_edges(import_graph()) == []


EVALUATE = "krex_lab.evaluate"
JUDGE = "krex_lab.evaluate.judge"


def judge_only_at_the_root(graph: dict[str, set[str]]) -> list[str]:
    """Modules at the evaluator's root that only the judge imports: they belong in ``judge/``, so that
    the folders say who runs each file (the root holds the client's side and what both sides share)."""
    found = []
    for m in sorted(graph):
        if m.rpartition(".")[0] != EVALUATE or m == JUDGE:
            continue
        importers = {i for i, ts in graph.items() if m in ts}
        if importers and all(_under(i, JUDGE) for i in importers):
            found.append(f"{m} (imported by {', '.join(sorted(importers))})")
    return found


def test_the_root_checker_sees_a_judge_only_module() -> None:
    graph = import_graph()
    graph[f"{EVALUATE}.planted"] = set()
    graph[f"{JUDGE}.session"].add(f"{EVALUATE}.planted")
    assert judge_only_at_the_root(graph) == [f"{EVALUATE}.planted (imported by {JUDGE}.session)"]
    graph[f"{EVALUATE}.api"].add(f"{EVALUATE}.planted")
    assert judge_only_at_the_root(graph) == []


def test_the_evaluators_root_holds_no_judge_only_module() -> None:
    assert judge_only_at_the_root(import_graph()) == []


def test_no_test_module_imports_from_a_conftest() -> None:
    """A conftest.py holds fixtures and hooks that pytest finds; what tests import from each other
    lives in a helpers module (a conftest imported as a module is loaded twice, under two names)."""
    tests = PACKAGE.parent / "tests"
    found = []
    for path in tests.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError:  # the evaluator's broken candidates, on purpose
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(a.name for a in node.names if not node.module)]
            if any(n.rpartition(".")[2] == "conftest" for n in names):
                found.append(f"{path.relative_to(tests)}:{node.lineno}")
    assert found == [], found
