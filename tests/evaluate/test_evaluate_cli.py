"""``krex eval``: one pair (human or JSON, exit codes) and ``--batch`` (exactly one JSON line per
pair, N at once, progress on a terminal), as real subprocesses against the tests' pool."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from krex_lab.evaluate.batch import BatchRecord, Pair, parse_manifest, run_batch
from krex_lab.evaluate.options import EvaluateOptions
from krex_lab.pytest_plugin import ArbiterProc
from tests.support.pool import PoolProc

from .helpers import PROBLEMS, problem

FAST = ["--load-timeout", "120", "--check-timeout", "20", "--time-timeout", "30"]


def krex_eval(
    arb: ArbiterProc, pool: PoolProc, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **pool.env}
    return subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "eval", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_one_pair_prints_a_verdict_and_exits_by_it(eval_arbiter: ArbiterProc, eval_pool: PoolProc) -> None:
    ok = krex_eval(eval_arbiter, eval_pool, str(problem("kb_softmax")), str(problem("kb_softmax", "correct.py")), *FAST)
    assert ok.returncode == 0, ok.stderr
    first = ok.stdout.splitlines()[0]
    assert first.startswith("correct: ") and "[host-clock, no GPU timed, " in first, first  # the clock said once
    assert "region: KREX region" in ok.stdout and "speedup" in ok.stdout
    bad = krex_eval(eval_arbiter, eval_pool, str(problem("kb_softmax")), str(problem("kb_softmax", "wrong_dim.py")))
    assert bad.returncode == 1 and bad.stdout.startswith("incorrect: ")
    as_json = krex_eval(
        eval_arbiter, eval_pool, str(problem("gm_row_max")), str(problem("gm_row_max", "correct.py")), "--json"
    )
    data = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and data["verdict"] == "correct" and data["format"] == "gpumode"
    assert data["benchmarks"][0]["runs"] >= 3
    missing = krex_eval(eval_arbiter, eval_pool, "nope.py", str(problem("kb_softmax", "correct.py")))
    assert missing.returncode == 2 and "krex eval: the reference 'nope.py' does not exist" in missing.stderr


def test_batch_gives_exactly_one_line_per_pair(eval_arbiter: ArbiterProc, eval_pool: PoolProc, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.txt"
    p = PROBLEMS
    manifest.write_text(
        "\n".join(
            [
                "# a comment, then a blank line",
                "",
                f"{p / 'kb_softmax/reference.py'} {p / 'kb_softmax/correct.py'} soft-ok",
                f"{p / 'kb_softmax/reference.py'} {p / 'kb_softmax/wrong_dim.py'}",
                json.dumps(
                    {
                        "reference": str(p / "gm_row_max/reference.py"),
                        "candidate": str(p / "gm_row_max/correct.py"),
                        "id": "rowmax",
                        "mode": "test",
                    }
                ),
                f"{p / 'kb_row_sum/reference.py'} {p / 'kb_row_sum/segfault.py'} crash",
                f"{p / 'kb_row_sum/reference.py'} {tmp_path / 'missing.py'} missing",
                "only-one-field",
                '{"reference": "x.py", "candidate": "y.py", "colour": "blue"}',
            ]
        )
    )
    out = tmp_path / "out.jsonl"
    res = krex_eval(eval_arbiter, eval_pool, "--batch", str(manifest), "--jobs", "3", "-o", str(out), *FAST)
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(7))
    by = {r["index"]: r for r in records}
    assert (by[0]["id"], by[0]["verdict"]) == ("soft-ok", "correct")
    assert by[1]["verdict"] == "incorrect" and by[1]["id"].endswith("wrong_dim.py")
    assert (by[2]["id"], by[2]["verdict"], by[2]["format"]) == ("rowmax", "correct", "gpumode")
    assert by[3]["verdict"] == "crashed"
    assert by[4]["verdict"] == "error" and "does not exist" in by[4]["metadata"]["evaluation_error"]
    assert by[5]["verdict"] == "error" and "line 8" in by[5]["metadata"]["manifest_error"]
    assert by[6]["verdict"] == "error" and "colour" in by[6]["metadata"]["manifest_error"]
    assert "7 pair(s) evaluated" in res.stderr
    assert "\r[" not in res.stderr  # no progress bar without a terminal


def test_manifest_paths_are_relative_to_it_and_stdin_works(eval_arbiter: ArbiterProc, eval_pool: PoolProc) -> None:
    pairs = parse_manifest("kb_softmax/reference.py kb_softmax/correct.py\n", PROBLEMS)
    assert pairs[0].reference == str(PROBLEMS / "kb_softmax/reference.py") and pairs[0].problem is None
    text = f"{problem('kb_clamp')} {problem('kb_clamp', 'correct.py')}\n"
    res = krex_eval(eval_arbiter, eval_pool, "--batch", "-", "--no-timing", stdin=text)
    (record,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert record["verdict"] == "correct" and record["runtime"] == -1.0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_batch_draws_a_progress_bar_on_a_terminal() -> None:
    pairs = [Pair(index=i, line=i + 1, problem="a bad line") for i in range(3)]
    seen: list[BatchRecord] = []
    term = _Terminal()
    verdicts = run_batch(pairs, jobs=2, defaults=EvaluateOptions(), pool=None, emit=seen.append, progress=term)
    assert verdicts == {"error": 3} and sorted(r.index for r in seen) == [0, 1, 2]
    assert "\r[" in term.getvalue() and "3/3 error 3" in term.getvalue()


def test_a_candidate_that_does_not_compile_leaves_no_empty_field(
    eval_arbiter: ArbiterProc, eval_pool: PoolProc, tmp_path: Path
) -> None:
    """It was never checked: its facts line has no trials field (not one with nothing after it)."""
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nclass ModelNew(torch.nn.Module:\n    pass\n")
    out = krex_eval(eval_arbiter, eval_pool, str(problem("kb_softmax")), str(broken), "--format", "kernelbench", *FAST)
    assert out.returncode == 1, out.stderr
    facts = out.stdout.splitlines()[1]
    assert facts == "  format kernelbench; compiled False; correctness False", out.stdout


def test_a_syntax_error_shows_the_users_file_and_line_and_no_frame_of_the_harness(
    eval_arbiter: ArbiterProc, eval_pool: PoolProc, tmp_path: Path
) -> None:
    broken = tmp_path / "syntax_cand.py"
    broken.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n")
    out = krex_eval(eval_arbiter, eval_pool, str(problem("kb_softmax")), str(broken), *FAST)
    assert out.returncode == 1 and out.stdout.startswith("compile_error: SyntaxError: expected ':'"), out.stdout
    assert f'File "{broken}", line 4' in out.stdout and "def forward(self, x)" in out.stdout, out.stdout
    assert "krex_lab" not in out.stdout, out.stdout
    # a candidate that fails when called: its own frame, none of the harness's
    runtime = tmp_path / "calls_nothing.py"
    runtime.write_text(
        "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return nope(x)\n"
    )
    out = krex_eval(eval_arbiter, eval_pool, str(problem("kb_softmax")), str(runtime), *FAST)
    assert out.stdout.startswith("runtime_error: NameError"), out.stdout
    assert f'File "{runtime}", line 5, in forward' in out.stdout and "krex_lab" not in out.stdout, out.stdout


def test_a_failing_reference_says_so_and_nothing_of_the_candidates_compilation(
    eval_arbiter: ArbiterProc, eval_pool: PoolProc, tmp_path: Path
) -> None:
    ref = tmp_path / "bad_ref.py"
    ref.write_text("import torch\nclass Model(torch.nn.Module)\n    pass\n")
    out = krex_eval(eval_arbiter, eval_pool, str(ref), str(problem("kb_softmax", "correct.py")), *FAST)
    assert out.returncode == 1, out.stderr
    assert out.stdout.startswith("error: the reference fails: SyntaxError: expected ':' (bad_ref.py, line 2)"), (
        out.stdout
    )
    assert "compiled" not in out.stdout and "the candidate was not run" in out.stdout, out.stdout


def test_missing_programs_are_all_named(tmp_path: Path) -> None:
    """Both programs missing: the one error names both (exit 2, nothing asked of any worker)."""
    ref, cand = tmp_path / "nope_ref.py", tmp_path / "nope_cand.py"
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "eval", str(ref), str(cand)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and str(ref) in out.stderr and str(cand) in out.stderr, out.stderr
    ref.write_text("x = 1\n")
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "eval", str(ref), str(cand)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and str(cand) in out.stderr and str(ref) not in out.stderr, out.stderr
    assert out.stderr == f"krex eval: the candidate {str(cand)!r} does not exist\n"
    cand.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "eval", str(ref), str(cand)], capture_output=True, text=True, timeout=60
    )
    assert out.stderr == f"krex eval: the candidate {str(cand)!r} is a directory, not a file\n"


#: a wrong candidate that writes over the verdict on its reader's terminal: it prints, and raises
#: with, escape sequences that move the cursor up, erase the lines and print a verdict of its own
TERMINAL_FORGER = r"""
import sys
import torch
from torch import nn

FORGED = "\x1b[2J\x1b[H\x1b[32mcorrect: 4.00 us vs reference 40.00 us (10.00x)\x1b[0m\x1b[8m"
print(FORGED)


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()

    def forward(self, a, b):
        raise RuntimeError(FORGED + "\r\x1b[1A\x1b[2K\u202e")
"""


def test_a_candidate_cannot_write_over_the_verdict_on_a_terminal(
    eval_arbiter: ArbiterProc, eval_pool: PoolProc, tmp_path: Path
) -> None:
    """What the candidate said reaches the person as text: its control characters shown, never
    obeyed by the terminal (the exit status was never in doubt; the eyes were)."""
    cand = tmp_path / "forger.py"
    cand.write_text(TERMINAL_FORGER)
    out = krex_eval(eval_arbiter, eval_pool, str(problem("kb_scaled_add")), str(cand), *FAST)
    assert out.returncode == 1 and out.stdout.startswith("runtime_error: "), out.stdout
    controls = sorted({hex(ord(c)) for c in out.stdout if c not in "\n\t" and not c.isprintable()})
    assert not controls, f"control characters reach the terminal: {controls}"
    assert "\\x1b[2J" in out.stdout  # shown, as text
