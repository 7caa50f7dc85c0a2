"""The package's import graph has no cycles: not at module level, not behind TYPE_CHECKING, not
inside functions. Every import of a ``krex_lab`` module counts, wherever it is written."""

from __future__ import annotations

import ast
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
]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for m, targets in graph.items():
        if any(_under(m, s) for s in SERVER_PACKAGES) and "krex_lab" in targets:
            found.append(f"{m} -> krex_lab (a server package imports the facade)")
        for src, dst, why in FORBIDDEN:
            found += [f"{m} -> {t} ({why})" for t in sorted(targets) if _under(m, src) and _under(t, dst)]
    return found


def test_the_layer_checker_sees_an_edge_back_up() -> None:
    graph = {"krex_lab.workers.x": {"krex_lab.evaluate.y"}, "krex_lab.arbiter.a": {"krex_lab"}}
    assert len(forbidden_edges(graph)) == 2


def test_no_import_runs_back_up_through_the_layers() -> None:
    assert forbidden_edges(import_graph()) == []


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
