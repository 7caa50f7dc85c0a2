"""The agent study's Triton candidates on a real GPU (marker ``gpu``; skipped without a GPU, Triton
or torch): each correct one compiles, checks and is timed on torch's stream, each wrong one fails
its check, and every written candidate is new code to Triton (a compile of its own, not a cache hit)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import subprocess_pythonpath

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("triton", "torch", "numba")),
        reason="needs Triton, torch and numba",
    ),
]

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """\
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    import agent_kernels as ak
    work = Path(sys.argv[1])
    out = []
    for i, c in enumerate(ak.space(None, ("triton",)) + ak.space(["matmul"], ("triton",))[:1]):
        path = ak.write_source(c, work, f"cand{i:02d}")
        job = {"candidate": ak.candidate_dict(c), "path": str(path), "mode": "none", "gpu": 0,
               "check_size": "0.05ms", "time_size": "0.1ms", "bench": {"min_time": 0.05}}
        rec = ak.evaluate(job)
        out.append({"id": c.id, "wrong": bool(c.wrong), **{k: rec.get(k) for k in
                    ("status", "error", "compile_s", "median_ms", "compiler", "traceback")}})
    print("RESULT " + json.dumps(out))
    """
)


def test_triton_candidates_compile_check_and_time_as_new_code(tmp_path: Path) -> None:
    cache = tmp_path / "triton-cache"
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONPATH=subprocess_pythonpath())
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), str(REPO / "benchmarks" / "agent")],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, r.stdout[-2000:] + r.stderr[-4000:]
    recs = json.loads(lines[0][len("RESULT ") :])
    assert len(recs) == 11
    for rec in recs:
        assert rec["compiler"] == "triton"
        if rec["wrong"]:
            assert rec["status"] == "wrong", rec
        else:
            assert rec["status"] == "ok", rec
            assert rec["median_ms"] > 0.0, rec
    # matmul/triton was written twice: two kernels in Triton's cache, one per written file
    kernels = [p for p in cache.rglob("matmul_kernel.json")]
    assert len(kernels) >= 2 + 2 + 1, sorted(str(p.relative_to(cache)) for p in cache.rglob("*.json"))
