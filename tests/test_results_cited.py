"""benchmarks/results/ holds what the project's figures are read from, and nothing else: every file
there is cited by README, docs, RESULTS.md, CHANGELOG, a benchmark or a test (by name), or is an
agent study run that notebook 04 reads. A new run writes to benchmarks/out/ (ignored)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = re.compile(r"[A-Za-z0-9_.+-]+\.(?:json|png|svg|csv|log|txt|ipynb)")


def cited_names() -> set[str]:
    texts = [ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/*.md"), RESULTS.parent / "RESULTS.md"]
    texts += [*RESULTS.parent.glob("*.py"), *RESULTS.parent.glob("*.sh"), *ROOT.glob("tests/**/*.py")]
    texts += [*ROOT.glob("notebooks/*.ipynb")]
    return {name for path in texts for name in NAME.findall(path.read_text(errors="replace"))}


def tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines()]


def uncited(files: list[Path], names: set[str]) -> list[str]:
    # notebook 04 picks agent study runs by their stamps: every one of them is read
    return sorted(
        str(f.relative_to(ROOT))
        for f in files
        if f.name not in names and not (f.name.startswith("agent_study-") and f.suffix == ".json")
    )


def test_the_check_sees_an_uncited_file() -> None:
    files = [RESULTS / "scale-2020-01-01T0000.json", RESULTS / "agent_study-fake-2020-01-01T0000.json"]
    assert uncited(files, {"other.json"}) == ["benchmarks/results/scale-2020-01-01T0000.json"]


def test_every_kept_result_is_cited() -> None:
    files = tracked()
    assert len(files) <= 80, f"{len(files)} results kept: cite what matters, move the rest out"
    assert uncited(files, cited_names()) == []


def test_a_run_writes_outside_the_tree() -> None:
    import sys

    sys.path.insert(0, str(RESULTS.parent))
    import common

    assert common.OUTPUT != common.RESULTS
    ignored = subprocess.run(["git", "check-ignore", "-q", str(common.OUTPUT / "x.json")], cwd=ROOT)
    assert ignored.returncode == 0 or "KREX_RESULTS_DIR" in __import__("os").environ
