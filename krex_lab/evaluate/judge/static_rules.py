"""Static pre-check of a candidate's source: advisory flags beside a verdict, never a verdict.

The judge reads the candidate's text (it never imports or runs it) through two sets of rules:

* KernelGuard's (a package, imported lazily here): timer and stat patching, result caches keyed on
  ids or pointers, call counters, stream tricks, monkeypatching, and more. Its performance
  heuristics (``torch.compile`` used, shapes hard-coded) are left out: they describe honest code.
* KREX's own, below, on the syntax tree: attacks on this evaluator rather than on a benchmark
  in general (its package, its cache, other processes' memory, interpreter hooks, leaving the
  candidate's process, libc's clocks).

A flag is a reason to look, not a proof: the dynamic checks decide the verdict, and honest code
may trip a rule. :func:`scan` never raises; text it cannot read gives a flag that says so.
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Iterator
from typing import Any, Literal, TypedDict, cast

import msgspec

__all__ = ["KREX_RULES", "MAX_SOURCE_CHARS", "Flag", "scan"]


class Flag(msgspec.Struct, frozen=True, kw_only=True):
    """One finding: ``rule`` a stable id, ``origin`` whose rule it is, ``line`` where (when known)."""

    rule: str
    origin: Literal["kernelguard", "krex"]
    line: int | None = None
    message: str


# KREX's rules: id -> what a flag of it means (docs/evaluate.md, "Static flags", lists the same).
KREX_RULES: dict[str, str] = {
    "krex-patch": "Assigns to, sets or deletes an attribute of krex_lab, or replaces one of its modules.",
    "krex-import": "Imports the evaluator's or the timing harness's internals (krex_lab.evaluate, krex_lab.bench).",
    "eval-cache-path": "Names the evaluator's cache ($KREX_EVAL_CACHE, ~/.cache/krex), where reference times live.",
    "proc-other-process": "Names /proc/<pid>/mem or /proc/<pid>/environ of a process other than its own.",
    "gc-objects": "Walks the interpreter's objects (gc.get_objects, gc.get_referrers, gc.get_referents).",
    "trace-hook": "Installs a trace or profile hook (sys.settrace, sys.setprofile, threading's, sys.monitoring).",
    "process-escape": "Forks, starts a new session or process group, or daemonises.",
    "libc-time": "Reaches libc's clock functions through ctypes or dlsym.",
}
# Flags about the scan itself, not about the candidate.
SCAN_RULES: dict[str, str] = {
    "unparsable": "The source is not valid Python: KREX's rules could not read it.",
    "too-large": "The source is larger than the static rules read: it was not scanned.",
    "not-text": "The source is not text: it was not scanned.",
    "kernelguard-missing": "KernelGuard is not installed: only KREX's own rules ran.",
    "kernelguard-error": "KernelGuard failed on this source: only KREX's own rules ran.",
    "scan-error": "The static rules failed on this source.",
}

# Past this the text is not scanned (a flag says so): KernelGuard takes about 6 ms per kB, so a
# scan stays near a second at most; the largest candidate of benchmarks/eval_problems has 3.4 kB.
MAX_SOURCE_CHARS = 200_000

_INTERNALS = ("krex_lab.evaluate", "krex_lab.bench")
_GC_WALKS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
_TRACE_HOOKS = frozenset(
    {
        "sys.settrace",
        "sys.setprofile",
        "threading.settrace",
        "threading.setprofile",
        "threading.settrace_all_threads",
        "threading.setprofile_all_threads",
        "sys.monitoring.register_callback",
        "sys.monitoring.set_events",
        "sys.monitoring.set_local_events",
    }
)
_ESCAPES = frozenset(
    {"os.fork", "os.forkpty", "os.setsid", "os.setpgrp", "os.setpgid", "pty.fork", "daemon.DaemonContext"}
)
_SESSION_KEYWORDS = frozenset({"start_new_session", "process_group", "setsid", "setpgroup"})
_SPAWNERS = frozenset(
    {
        *(f"subprocess.{name}" for name in ("Popen", "run", "call", "check_call", "check_output")),
        *(f"asyncio.create_subprocess_{kind}" for kind in ("exec", "shell")),
        "os.posix_spawn",
        "os.posix_spawnp",
    }
)
_TIME_FUNCS = frozenset(
    {
        "clock_gettime",
        "clock_gettime64",
        "gettimeofday",
        "time",
        "clock",
        "times",
        "timespec_get",
        "clock_settime",
        "settimeofday",
        "adjtimex",
    }
)
_NATIVE_LIB = "<native library>"
_LIB_LOADERS = frozenset({"ctypes.CDLL", "ctypes.PyDLL", "ctypes.cdll.LoadLibrary", "ctypes.pydll.LoadLibrary"})
_IMPORTERS = frozenset({"__import__", "builtins.__import__", "importlib.import_module", "importlib.__import__"})
_SETTERS = frozenset(
    {"setattr", "delattr", "builtins.setattr", "builtins.delattr", "object.__setattr__", "object.__delattr__"}
)
_TIME_NAMES = "clock_gettime(?:64)?|gettimeofday|clock_settime|settimeofday|timespec_get"
_C_TIME_HOOK = re.compile(
    rf'dlsym\s*\([^;]*?"(?:{_TIME_NAMES}|time|clock)"|\b(?:int|time_t|clock_t)\s+(?:{_TIME_NAMES}|time)\s*\('
)
_LIBC_TIME_STRING = re.compile(rf"(?:{_TIME_NAMES})")
_CACHE_PATH = re.compile(r"KREX_EVAL_CACHE|\.cache/krex(?:/|$)|XDG_CACHE_HOME/krex(?:/|$)")
_PROC_OTHER = re.compile(r"/proc/(?!self/|thread-self/)(?:[^/\s]+/)?(?:task/[^/\s]+/)?(?:mem|environ)\b")


def scan(source: str, *, filename: str = "<candidate>") -> list[Flag]:
    """Flags for one candidate's source, in line order (KernelGuard's, which carry no line, last)."""
    try:
        if isinstance(source, bytes | bytearray):
            source = bytes(source).decode("utf-8", "replace")
        if not isinstance(source, str):
            return [_scan_flag("not-text")]
        if len(source) > MAX_SOURCE_CHARS:
            return [
                _scan_flag("too-large", f"The source has {len(source)} characters, more than the static rules read")
            ]
        flags = _krex_flags(source, filename) + _kernelguard_flags(source)
        return sorted(dict.fromkeys(flags), key=lambda f: (f.line is None, f.line or 0, f.origin, f.rule))
    except Exception as exc:  # a fault in a rule must never cost the candidate its evaluation
        return [_scan_flag("scan-error", f"The static rules failed on this source ({type(exc).__name__})")]


def _scan_flag(rule: str, message: str | None = None, line: int | None = None) -> Flag:
    text = message + "." if message else SCAN_RULES[rule]
    return Flag(rule=rule, origin="krex", line=line, message=text)


# --- KernelGuard ------------------------------------------------------------------------------

# KernelGuard looks for a GPU MODE entry point by default; a KernelBench candidate's is ModelNew's
# forward, which it finds when ModelNew is named an entry point.
_ENTRYPOINTS = ("custom_kernel", "ModelNew")
# Its rules of these families say how fast code is made, not that it cheats (torch.compile used,
# shapes written as literals): they would flag honest candidates.
_SKIPPED_FAMILIES = frozenset({"performance_heuristic"})
# KernelGuard keeps its configuration in module globals: one scan at a time configures and reads it.
_kernelguard_lock = threading.Lock()


def _kernelguard_flags(source: str) -> list[Flag]:
    try:
        import kernelguard
    except ImportError:
        return [_scan_flag("kernelguard-missing")]
    try:
        with _kernelguard_lock:
            if not all(kernelguard.is_entrypoint_name(name) for name in _ENTRYPOINTS):
                kernelguard.configure_runtime(config_data={"entrypoints": {"names": list(_ENTRYPOINTS)}})
            result = kernelguard.analyze_code(source, compute_structural_hash=False)
            policies = {m.get("pattern"): kernelguard.get_rule_policy(str(m.get("pattern"))) for m in _matches(result)}
    except Exception as exc:  # RecursionError on absurd nesting, or a fault of its own
        return [_scan_flag("kernelguard-error", f"KernelGuard failed on this source ({type(exc).__name__})")]
    flags = []
    for match in _matches(result):
        policy = policies[match.get("pattern")]
        if policy.technique_family in _SKIPPED_FAMILIES:
            continue
        evidence = str(match.get("evidence") or policy.rule_name).strip().rstrip(".")
        message = f"{evidence} (KernelGuard, {policy.evidence_tier} evidence)."
        flags.append(Flag(rule=str(policy.rule_name), origin="kernelguard", line=None, message=message))
    return flags


class _Match(TypedDict, total=False):
    """One of KernelGuard's ``matched_patterns``: the rule's pattern and what it saw."""

    pattern: str
    evidence: str


def _matches(result: Any) -> list[_Match]:
    matched = result.get("matched_patterns") if isinstance(result, dict) else None
    # KernelGuard's own dicts: a match without a pattern names no rule, and is dropped
    return [cast(_Match, m) for m in matched or [] if isinstance(m, dict) and m.get("pattern")]


# --- KREX's rules ---------------------------------------------------------------------------------


def _krex_flags(source: str, filename: str) -> list[Flag]:
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:  # null bytes are a SyntaxError too (Python >= 3.12 and 3.11.4)
        return [_scan_flag("unparsable", f"The source is not valid Python ({exc.msg})", exc.lineno)]
    except (ValueError, RecursionError, MemoryError) as exc:
        return [_scan_flag("unparsable", f"The source is not valid Python ({type(exc).__name__})")]
    return list(_Rules(tree).run())


class _Rules:
    """One pass over the tree after one pass that learns what names stand for (imports, aliases)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.aliases: dict[str, str] = {}
        self.uses_ctypes = False

    def run(self) -> Iterator[Flag]:
        nodes = list(ast.walk(self.tree))
        self._learn_names(nodes)
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield from self._imports(node)
            elif isinstance(node, ast.Attribute | ast.Name | ast.Subscript):
                yield from self._reference(node)
            if isinstance(node, ast.Call):
                yield from self._call(node)
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                yield from self._assignment(node)
            if isinstance(node, ast.stmt):
                yield from self._strings(node)

    # names

    def _learn_names(self, nodes: list[ast.AST]) -> None:
        assignments = []
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    self.uses_ctypes |= alias.name.split(".")[0] == "ctypes"
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self.uses_ctypes |= node.module.split(".")[0] == "ctypes"
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assignments.append(node)
        # `x = some.module` makes x stand for it; twice, for a chain of two such names
        for _ in range(2):
            for node in assignments:
                target = node.targets[0]
                assert isinstance(target, ast.Name)
                dotted = self.dotted(node.value)
                if dotted and dotted != target.id:
                    self.aliases[target.id] = dotted

    def dotted(self, node: ast.AST) -> str | None:
        """What an expression names, as a dotted path (``krex_lab.evaluate.judge.timers.now``), if it names one."""
        parts: list[str] = []
        while True:
            if isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            elif isinstance(node, ast.Subscript) and _const_str(node.slice) is not None:
                if self.dotted(node.value) == "sys.modules":
                    root: str | None = _const_str(node.slice)
                    break
                parts.append(str(_const_str(node.slice)))
                node = node.value
            elif isinstance(node, ast.Name):
                root = self.aliases.get(node.id, node.id)
                break
            elif isinstance(node, ast.Call):
                root = self._call_result(node)
                break
            else:
                return None
        if root is None:
            return None
        return ".".join([root, *reversed(parts)])

    def _call_result(self, call: ast.Call) -> str | None:
        func = self.dotted(call.func)
        first = _const_str(call.args[0]) if call.args else None
        if func in _IMPORTERS:
            return first
        if func in _LIB_LOADERS:
            return _NATIVE_LIB
        if func in {"getattr", "builtins.getattr"} and len(call.args) >= 2 and _const_str(call.args[1]):
            owner = self.dotted(call.args[0])
            return f"{owner}.{_const_str(call.args[1])}" if owner else None
        return None

    # rules

    def _imports(self, node: ast.Import | ast.ImportFrom) -> Iterator[Flag]:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            names = []
        for name in names:
            if _is_internal(name):
                yield _flag("krex-import", node, f"Imports {_internal_root(name)}, the evaluator's own code")
                return

    def _reference(self, node: ast.Attribute | ast.Name | ast.Subscript) -> Iterator[Flag]:
        dotted = self.dotted(node)
        if not dotted:
            return
        if dotted in _GC_WALKS:
            yield _flag("gc-objects", node, f"Uses {dotted}, which reaches every object of the process")
        elif dotted in _TRACE_HOOKS:
            yield _flag("trace-hook", node, f"Uses {dotted}, which sees every call of the process")
        elif dotted in _ESCAPES:
            yield _flag("process-escape", node, f"Uses {dotted}, which leaves the candidate's process or session")
        elif self._is_libc_time(dotted):
            yield _flag("libc-time", node, f"Reaches libc's {dotted.rsplit('.', 1)[1]} through ctypes")
        elif _is_internal(dotted) and not isinstance(node, ast.Name):  # a Name's import is flagged itself
            yield _flag("krex-import", node, f"Uses {_internal_root(dotted)}, the evaluator's own code")

    def _is_libc_time(self, dotted: str) -> bool:
        owner, _, name = dotted.rpartition(".")
        native = owner == _NATIVE_LIB or owner.startswith(("ctypes.cdll.", f"{_NATIVE_LIB}."))
        return native and name in _TIME_FUNCS

    def _call(self, call: ast.Call) -> Iterator[Flag]:
        func = self.dotted(call.func)
        if func in _IMPORTERS:
            name = _const_str(call.args[0]) if call.args else None
            if name and _is_internal(name):
                yield _flag("krex-import", call, f"Imports {_internal_root(name)}, the evaluator's own code")
        elif func in _SETTERS and call.args:
            owner = self.dotted(call.args[0])
            if owner and _is_krex(owner):
                yield _flag("krex-patch", call, f"Calls {func} on {owner}, a part of KREX")
        for keyword in call.keywords if func in _SPAWNERS else ():
            if keyword.arg in _SESSION_KEYWORDS and not _is_falsy(keyword.value):
                yield _flag("process-escape", call, f"Starts a process with {keyword.arg}=, outside its session")

    def _assignment(self, node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete) -> Iterator[Flag]:
        targets: list[ast.expr] = list(node.targets) if isinstance(node, ast.Assign | ast.Delete) else [node.target]
        for target in _flatten(targets):
            if isinstance(target, ast.Attribute | ast.Subscript):
                dotted = self.dotted(target)
                if dotted and _is_krex(dotted) and dotted != "krex_lab":
                    yield _flag("krex-patch", node, f"Writes {dotted}, a part of KREX")
                elif dotted is None and isinstance(target, ast.Subscript):
                    # vars(krex_lab.x)[...] = ..., krex_lab.x.__dict__[...] = ...
                    owner = target.value
                    if isinstance(owner, ast.Call) and self.dotted(owner.func) == "vars" and owner.args:
                        owner = owner.args[0]
                    owner_name = self.dotted(owner)
                    if owner_name and _is_krex(owner_name):
                        yield _flag("krex-patch", node, f"Writes into {owner_name}, a part of KREX")

    def _strings(self, stmt: ast.stmt) -> Iterator[Flag]:
        """The statement's own string constants (not its nested statements'), joined as path parts."""
        texts = [text for text in _statement_strings(stmt) if text]
        if not texts:
            return
        joined = re.sub(r"/+", "/", "/".join(texts).replace("\\", "/"))
        if _CACHE_PATH.search(joined):
            yield _flag("eval-cache-path", stmt, "Names the evaluator's cache, where reference times live")
        if _PROC_OTHER.search(joined):
            yield _flag("proc-other-process", stmt, "Names the memory or environment of another process under /proc")
        for text in texts:
            if _C_TIME_HOOK.search(text) or (self.uses_ctypes and _LIBC_TIME_STRING.fullmatch(text)):
                yield _flag("libc-time", stmt, "Looks up or defines a libc clock function by name")
                break


def _statement_strings(stmt: ast.stmt) -> list[str]:
    # depth first in source order, then by position (a JoinedStr's parts share one before 3.12)
    strings: list[tuple[int, int, str]] = []
    pending = [child for child in ast.iter_child_nodes(stmt) if not isinstance(child, ast.stmt)][::-1]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), node.value))
        elif not isinstance(node, ast.stmt):
            pending.extend(list(ast.iter_child_nodes(node))[::-1])
    return [text for _, _, text in sorted(strings, key=lambda s: s[:2])]


def _flag(rule: str, node: ast.AST, message: str) -> Flag:
    return Flag(rule=rule, origin="krex", line=getattr(node, "lineno", None), message=message + ".")


def _flatten(targets: list[ast.expr]) -> Iterator[ast.expr]:
    for target in targets:
        if isinstance(target, ast.Tuple | ast.List):
            yield from _flatten(list(target.elts))
        elif isinstance(target, ast.Starred):
            yield from _flatten([target.value])
        else:
            yield target


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_falsy(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not node.value


def _is_krex(dotted: str) -> bool:
    return dotted == "krex_lab" or dotted.startswith("krex_lab.")


def _is_internal(dotted: str) -> bool:
    return any(dotted == root or dotted.startswith(root + ".") for root in _INTERNALS)


def _internal_root(dotted: str) -> str:
    return next(root for root in _INTERNALS if dotted == root or dotted.startswith(root + "."))
