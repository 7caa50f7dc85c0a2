"""What the evaluate tests share besides their fixtures (conftest.py): the problems' folder, the
short phase limits, and the path of one problem's file."""

from __future__ import annotations

from pathlib import Path

PROBLEMS = Path(__file__).parent / "problems"
#: short phase limits: every hostile candidate of these tests ends within them
LIMITS = {"load": 120.0, "check": 20.0, "time": 30.0}


def problem(name: str, file: str = "reference.py") -> Path:
    return PROBLEMS / name / file


#: the scaled-add problem's honest ModelNew (``kb_scaled_add``), without its imports
SCALED_ADD_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return torch.add(b, a, alpha=self.alpha)
"""
