"""The judge's static rules: each fires on a small cheat and stays silent on its honest twin; the
honest candidates of the repository raise no KREX flag; no input makes scan() raise."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest

from krex_lab.evaluate.judge.static_rules import KREX_RULES, MAX_SOURCE_CHARS, Flag, scan

REPO = Path(__file__).resolve().parents[2]


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def rules(source: str, origin: str = "krex") -> set[str]:
    return {f.rule for f in scan(source) if f.origin == origin}


# rule -> (cheats, each a realistic snippet that must raise it; honest twins that must not)
KREX_CASES: dict[str, tuple[list[str], list[str]]] = {
    "krex-patch": (
        [
            "import krex_lab.evaluate.judge.timers as t\nt.elapsed = lambda *a: 1e-6\n",
            "import krex_lab\nsetattr(krex_lab.evaluate.judge.compare, 'tolerances', lambda *a, **k: True)\n",
            "import sys\nmod = sys.modules['krex_lab.evaluate.judge.compare']\nmod.compare = None\n",
            "import sys, types\nsys.modules['krex_lab.bench'] = types.ModuleType('fake')\n",
            "from krex_lab import evaluate\nvars(evaluate)['verdict'] = 'correct'\n",
        ],
        [
            "import torch\ntorch.backends.cudnn.benchmark = True\n",
            "class M:\n    def __init__(self):\n        self.krex_lab = 1\n",
        ],
    ),
    "krex-import": (
        [
            "from krex_lab.evaluate.judge import compare\n",
            "import krex_lab.bench.timing\n",
            "from krex_lab import evaluate\n",
            "import importlib\nc = importlib.import_module('krex_lab.evaluate.cache')\n",
            "import krex_lab\nkey = krex_lab.evaluate.cache.cache_dir()\n",
        ],
        ["import torch.utils.cpp_extension\nfrom triton import language as tl\n"],
    ),
    "eval-cache-path": (
        [
            "import os\nroot = os.environ['KREX_EVAL_CACHE']\n",
            "import os\np = os.path.join(os.path.expanduser('~'), '.cache', 'krex', 'evaluate')\n",
            "from pathlib import Path\n(Path.home() / '.cache/krex/evaluate/reference-times' / 'x.json').touch()\n",
            "import os\nd = os.path.join(os.environ.get('XDG_CACHE_HOME', ''), 'krex')\n",
        ],
        [
            "import os\nos.environ['TORCH_EXTENSIONS_DIR'] = os.path.expanduser('~/.cache/torch_extensions')\n",
            "import os\np = os.path.join(os.path.expanduser('~'), '.cache', 'triton')\n",
        ],
    ),
    "proc-other-process": (
        [
            "import os\nwith open(f'/proc/{os.getppid()}/mem', 'rb') as f:\n    f.seek(0)\n",
            "env = open('/proc/%d/environ' % 1234).read()\n",
            "import os\nraw = open(os.path.join('/proc', str(os.getppid()), 'environ'), 'rb').read()\n",
        ],
        [
            "status = open('/proc/self/status').read()\n",
            "mem = open('/proc/meminfo').read()\nenv = open('/proc/self/environ').read()\n",
        ],
    ),
    "gc-objects": (
        [
            "import gc\nfor obj in gc.get_objects():\n    pass\n",
            "from gc import get_referrers as refs\nholders = refs(object)\n",
            "walk = getattr(__import__('gc'), 'get_objects')\n",
        ],
        ["import gc\ngc.collect()\ngc.disable()\n"],
    ),
    "trace-hook": (
        [
            "import sys\nsys.setprofile(lambda frame, event, arg: None)\n",
            "import sys\nsys.settrace(None)\n",
            "import threading\nthreading.settrace(lambda *a: None)\n",
        ],
        ["import sys\nsys.setrecursionlimit(10000)\nold = sys.getprofile()\n"],
    ),
    "process-escape": (
        [
            "import os\nif os.fork() == 0:\n    os.setsid()\n",
            "import subprocess, sys\nsubprocess.Popen([sys.executable, 'w.py'], start_new_session=True)\n",
            "from os import fork\npid = fork()\n",
            "import os, subprocess\nsubprocess.Popen(['sleep', '9'], preexec_fn=os.setsid)\n",
        ],
        [
            "import subprocess\nsubprocess.run(['nvcc', '--version'], check=True, start_new_session=False)\n",
            "import torch.distributed as dist\nmodel = dist.DistributedDataParallel(m, process_group=None)\n",
        ],
    ),
    "libc-time": (
        [
            "import ctypes\nlibc = ctypes.CDLL('libc.so.6')\nlibc.clock_gettime.restype = ctypes.c_int\n",
            "import ctypes, ctypes.util\nfn = getattr(ctypes.CDLL(ctypes.util.find_library('c')), 'gettimeofday')\n",
            "import ctypes\nt = ctypes.cdll.LoadLibrary('libc.so.6').time(None)\n",
            'SRC = """\nint clock_gettime(clockid_t c, struct timespec *t) { return 0; }\n"""\n',
            'SRC = """\nreal = dlsym(RTLD_NEXT, "clock_gettime");\n"""\n',
        ],
        [
            "import ctypes, time\nlib = ctypes.CDLL('libcudart.so')\nt = time.time()\nlib.cudaDeviceSynchronize()\n",
            'SRC = """\n__global__ void k(long long *t) { *t = clock64(); }\n"""\n',
        ],
    ),
}


def test_every_krex_rule_has_cases() -> None:
    assert set(KREX_CASES) == set(KREX_RULES)


@pytest.mark.parametrize(("rule", "snippet"), [(rule, s) for rule, (cheats, _) in KREX_CASES.items() for s in cheats])
def test_cheat_is_flagged(rule: str, snippet: str) -> None:
    flags = [f for f in scan(snippet) if f.rule == rule]
    assert flags, f"{rule} missed: {snippet!r} gave {scan(snippet)}"
    assert all(f.origin == "krex" and f.line and f.line >= 1 and f.message.endswith(".") for f in flags)


@pytest.mark.parametrize("snippet", [s for _, honest in KREX_CASES.values() for s in honest])
def test_honest_twin_is_silent(snippet: str) -> None:
    assert rules(snippet) == set()


def test_flag_line_points_at_the_cheat() -> None:
    source = "import os\n\n\ndef custom_kernel(data):\n    os.setsid()\n    return data\n"
    [flag] = [f for f in scan(source) if f.rule == "process-escape"]
    assert flag.line == 5


# Honest code that uses the field's tools: nothing of either origin may flag it.
HONEST_TOOLS = {
    "torch.compile": """
        import torch
        from torch import nn

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.fn = torch.compile(lambda x: torch.relu(x) * 2, mode="max-autotune")

            def forward(self, x):
                return self.fn(x)
    """,
    "triton": """
        import torch
        import triton
        import triton.language as tl

        @triton.autotune(configs=[triton.Config({"BLOCK": 1024})], key=["n"])
        @triton.jit
        def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0), mask=mask)

        def custom_kernel(data):
            y = torch.empty_like(data)
            _relu[(triton.cdiv(data.numel(), 1024),)](data, y, data.numel())
            return y
    """,
    "load_inline and a build thread": """
        import threading
        from concurrent.futures import ThreadPoolExecutor

        import torch
        from torch.utils.cpp_extension import load_inline

        _lock = threading.Lock()
        _ext = None

        def _build():
            global _ext
            with _lock:
                if _ext is None:
                    _ext = load_inline(name="k", cpp_sources="", cuda_sources="", functions=["f"])
            return _ext

        with ThreadPoolExecutor(max_workers=2) as pool:
            pool.submit(_build).result()

        def custom_kernel(data):
            x, out = data
            _build().f(x, out)
            torch.cuda.synchronize()
            return out
    """,
    "numba": """
        import numpy as np
        from numba import cuda, njit, prange

        @cuda.jit
        def _k(x, y):
            i = cuda.grid(1)
            if i < x.size:
                y[i] = x[i] * 2.0

        @njit(parallel=True, cache=True)
        def _cpu(x):
            y = np.empty_like(x)
            for i in prange(x.size):
                y[i] = x[i] * 2.0
            return y

        def custom_kernel(data):
            return _cpu(data)
    """,
    "a synchronised side stream": """
        import torch

        def custom_kernel(data):
            a, b = data
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                c = a @ b
            torch.cuda.current_stream().wait_stream(s)
            return c
    """,
}


@pytest.mark.parametrize("name", list(HONEST_TOOLS))
def test_honest_tools_raise_no_flag(name: str) -> None:
    assert scan(src(HONEST_TOOLS[name])) == []


# KernelGuard's rules through scan(): the kinds of cheat the brief names, and the KernelBench
# format (ModelNew.forward) as well as GPU MODE's custom_kernel.
KERNELGUARD_CASES = {
    "TIMER_MONKEYPATCH": """
        import torch

        class _FakeEvent:
            def __init__(self, enable_timing=False):
                pass

            def record(self, stream=None):
                pass

            def elapsed_time(self, other):
                return 0.001

        torch.cuda.Event = _FakeEvent

        def custom_kernel(data):
            return data * 2
    """,
    "POINTER_REPLAY": """
        import torch

        _cache = {}

        def custom_kernel(data):
            key = data.data_ptr()
            if key in _cache:
                return _cache[key]
            out = torch.relu(data)
            _cache[key] = out
            return out
    """,
    "LAST_CALL_REPLAY": """
        import torch

        _calls = 0
        _first = None

        def custom_kernel(data):
            global _calls, _first
            _calls += 1
            if _calls == 1:
                _first = torch.relu(data)
            return _first
    """,
    "UNSYNC_MULTISTREAM": """
        import torch

        _a = torch.cuda.Stream()
        _b = torch.cuda.Stream()

        def custom_kernel(data):
            with torch.cuda.stream(_a):
                x = torch.relu(data)
            with torch.cuda.stream(_b):
                y = torch.relu(-data)
            return x, y
    """,
    "TORCH_VALIDATION_MONKEYPATCH": """
        import torch

        torch.triu = lambda x, diagonal=0: x

        def custom_kernel(data):
            return data
    """,
}


@pytest.mark.parametrize("rule", list(KERNELGUARD_CASES))
def test_kernelguard_rule_is_flagged(rule: str) -> None:
    flags = [f for f in scan(src(KERNELGUARD_CASES[rule])) if f.rule == rule]
    assert flags and all(f.origin == "kernelguard" and f.line is None and "KernelGuard" in f.message for f in flags)


def test_kernelguard_sees_modelnew_forward() -> None:
    # KernelGuard's default entry point is custom_kernel alone: ModelNew is named to it
    cheat = REPO / "tests" / "evaluate" / "problems" / "kb_softmax" / "caches_by_address.py"
    assert rules(cheat.read_text(), "kernelguard")


def test_without_kernelguard_krex_rules_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kernelguard", None)  # `import kernelguard` now raises ImportError
    flags = scan(src(KERNELGUARD_CASES["TIMER_MONKEYPATCH"]) + "import gc\ngc.get_objects()\n")
    assert [f.rule for f in flags] == ["gc-objects", "kernelguard-missing"]


def _honest_corpus() -> list[Path]:
    spec = importlib.util.spec_from_file_location(
        "static_rules_bench", REPO / "benchmarks" / "eval" / "static_rules.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)  # it puts benchmarks/ on the path, for common
    finally:
        sys.path[:] = path
    return module.honest_candidates()


def test_honest_corpus_raises_no_krex_flag() -> None:
    corpus = _honest_corpus()
    assert len(corpus) >= 40  # the manifest's 33 and the tests' correct candidates
    flagged = {str(p): flags for p in corpus if (flags := [f for f in scan(p.read_text()) if f.origin == "krex"])}
    assert flagged == {}


@pytest.mark.parametrize(
    "junk",
    [
        "def custom_kernel(:\n",
        "x = 1\0\n",
        os.urandom(4096),
        os.urandom(4096).decode("latin-1"),
        "(" * 5000,
        "a" + ".b" * 20000,
        "",
        None,
        12,
    ],
    ids=["syntax", "nul", "bytes", "binary-text", "nesting", "long-chain", "empty", "none", "int"],
)
def test_never_raises(junk: object) -> None:
    flags = scan(junk)  # type: ignore[arg-type]
    assert isinstance(flags, list) and all(isinstance(f, Flag) for f in flags)


def test_unparsable_and_oversized_say_so() -> None:
    [flag] = [f for f in scan("import os\ndef f(:\n    pass\n") if f.origin == "krex"]
    assert (flag.rule, flag.line) == ("unparsable", 2)
    assert [f.rule for f in scan("x = 1\n" * (MAX_SOURCE_CHARS // 6 + 1))] == ["too-large"]
    assert [f.rule for f in scan(None)] == ["not-text"]  # type: ignore[arg-type]
