"""The README says what the browser tests need, and how many skip without it: as many as take the
``chromium`` fixture, installed as ``.ci/run`` installs it."""

from __future__ import annotations

import ast
import re

from tests.support import ROOT

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def _browser_tests() -> list[str]:
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            if node.name.startswith("test_") and "chromium" in [a.arg for a in node.args.args]:
                found.append(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def test_the_readme_names_chromium_and_counts_the_tests_that_skip_without_it() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"The (\w+) browser tests", readme)
    assert said, "the README does not say which tests need a browser"
    assert WORDS[said.group(1)] == len(_browser_tests()), _browser_tests()
    assert "sudo apt-get install chromium" in readme and "KREX_CHROMIUM" in readme and ".ci/run" in readme
    assert "apt-get install -y chromium" in (ROOT / ".ci" / "run").read_text()
