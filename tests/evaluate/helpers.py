"""What the evaluate tests share besides their fixtures (conftest.py): the problems' folder, the
short phase limits, and the path of one problem's file."""

from __future__ import annotations

from pathlib import Path

PROBLEMS = Path(__file__).parent / "problems"
#: short phase limits: every hostile candidate of these tests ends within them
LIMITS = {"load": 120.0, "check": 20.0, "time": 30.0}


def problem(name: str, file: str = "reference.py") -> Path:
    return PROBLEMS / name / file
