"""The KernelBench-format problem set of benchmarks/eval_problems: complete, consistent, and every
candidate that can run on a CPU agrees with its reference there (the CUDA ones are built on a GPU
machine: here their sources are checked for what load_inline needs)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "eval"
sys.path.insert(0, str(BENCH))

import eval_kb  # noqa: E402
import eval_set  # noqa: E402


def names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def test_the_set_has_twenty_problems_of_every_kind_and_a_current_manifest() -> None:
    problems = eval_set.problems()
    pairs = eval_set.pairs()
    assert len(problems) >= 20
    assert {p.problem for p in pairs} == set(problems)  # every problem has a candidate
    for kind in eval_set.BATCH_KINDS:
        assert sum(1 for p in pairs if p.kind == kind) >= 8, kind
    assert any(p.kind == "numba" for p in pairs)
    lines = eval_set.manifest_lines(pairs, eval_set.PROBLEMS)
    assert eval_set.MANIFEST.read_text().splitlines() == lines, "run python benchmarks/eval/eval_set.py"
    for line in lines:
        assert (eval_set.PROBLEMS / json.loads(line)["candidate"]).is_file()


def test_selection_by_number_or_name_and_bad_selections_say_what() -> None:
    picked = eval_set.pairs(("torch",), ["15", "20_cdist"])
    assert [p.id for p in picked] == ["15_matmul_square/torch", "20_cdist/torch"]
    with pytest.raises(ValueError, match="no such problems: 99"):
        eval_set.pairs(only=["99"])
    with pytest.raises(ValueError, match="unknown candidate kinds"):
        eval_set.pairs(("cobol",))


@pytest.mark.parametrize("problem", eval_set.problems())
def test_files_define_what_the_format_needs(problem: str) -> None:
    assert {"Model", "get_inputs", "get_init_inputs", "SMALL"} <= names(eval_set.PROBLEMS / problem / "reference.py")
    for cand in (eval_set.PROBLEMS / problem).glob("new_*.py"):
        assert "ModelNew" in names(cand), cand
        text = cand.read_text()
        if cand.stem == "new_triton":
            assert "@triton.jit" in text
        if cand.stem == "new_cuda":
            # each exported function is declared for the binding and defined in the CUDA source
            tree = ast.parse(text)
            assigns = [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]
            consts = {n.targets[0].id: n.value.value for n in assigns if isinstance(n.targets[0], ast.Name)}
            exported = re.search(r"functions=\[([^\]]*)\]", text)
            assert exported and "load_inline(" in text
            for fn in re.findall(r'"(\w+)"', exported.group(1)):
                assert re.search(rf"\b{fn}\(", consts["CPP_SOURCE"]), fn
                assert re.search(rf"at::Tensor {fn}\(", consts["CUDA_SOURCE"]), fn
            assert "getCurrentCUDAStream()" in consts["CUDA_SOURCE"]  # launches on torch's stream


def small_pairs(kind: str) -> list[eval_set.Pair]:
    return eval_set.pairs((kind,))


@pytest.mark.parametrize("pair", small_pairs("torch"), ids=lambda p: p.id)
def test_torch_candidates_agree_with_their_reference_on_the_cpu(
    pair: eval_set.Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv(eval_set.SIZE_ENV, "small")
    rec = eval_kb.evaluate(str(pair.reference), str(pair.candidate), "cpu", trials=3, perf_trials=2, tol=1e-4)
    assert rec["compiled"] and rec["correctness"], rec["metadata"]
    assert rec["runtime_stats"]["num_trials"] == 2 and rec["runtime"] > 0


def test_the_baseline_check_fails_a_wrong_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv(eval_set.SIZE_ENV, "small")
    ref = eval_set.PROBLEMS / "21_cumsum" / "reference.py"
    wrong = tmp_path / "new_wrong.py"
    wrong.write_text(
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.cumsum(x, 0)\n"
    )
    rec = eval_kb.evaluate(str(ref), str(wrong), "cpu", trials=2, perf_trials=5, tol=1e-4)
    assert rec["compiled"] and not rec["correctness"]
    assert rec["metadata"]["correctness_issue"] == "output mismatch" and rec["runtime"] == -1.0
    broken = tmp_path / "new_broken.py"
    broken.write_text("import torch\nraise RuntimeError('nvcc says no')\n")
    rec = eval_kb.evaluate(str(ref), str(broken), "cpu", trials=2, perf_trials=5, tol=1e-4)
    assert not rec["compiled"] and "nvcc says no" in rec["metadata"]["compilation_error"]


@pytest.mark.parametrize("pair", small_pairs("triton"), ids=lambda p: p.id)
def test_triton_candidates_agree_in_tritons_interpreter(pair: eval_set.Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (not in the test extras): its kernels run on the GPU machine")
    monkeypatch.setenv(eval_set.SIZE_ENV, "small")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when a kernel is decorated: set before the import
    rec = eval_kb.evaluate(str(pair.reference), str(pair.candidate), "cpu", trials=2, perf_trials=0, tol=1e-4)
    assert rec["compiled"] and rec["correctness"], rec["metadata"]


@pytest.mark.parametrize("pair", small_pairs("numba"), ids=lambda p: p.id)
def test_numba_candidates_agree_in_numbas_simulator(pair: eval_set.Pair) -> None:
    """Through eval_kb.py's command line, in a process of its own (the simulator is chosen when
    numba.cuda is first imported)."""
    pytest.importorskip("torch")
    env = {**os.environ, eval_set.SIZE_ENV: "small", "NUMBA_ENABLE_CUDASIM": "1"}
    cmd = [sys.executable, str(BENCH / "eval_kb.py"), "eval", str(pair.reference), str(pair.candidate)]
    r = subprocess.run([*cmd, "--device", "cpu", "--perf-trials", "2"], env=env, capture_output=True, text=True)
    recs = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("EVALKB ")]
    assert r.returncode == 0 and len(recs) == 1, r.stderr[-2000:]
    assert recs[0]["correctness"] and recs[0]["runtime_stats"]["num_trials"] == 2, recs[0]
