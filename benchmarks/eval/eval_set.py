"""The KernelBench-format problem set of ``benchmarks/eval_problems/`` and its manifest.

Each problem is a folder ``NN_name/`` with ``reference.py`` (``Model``, ``get_inputs``,
``get_init_inputs``) and one or more candidates ``new_<kind>.py`` (``ModelNew``), the kind being
``cuda`` (CUDA C++ through ``torch.utils.cpp_extension.load_inline``), ``triton`` (``@triton.jit``),
``torch`` (a plain torch rewrite) or ``numba`` (a ``numba.cuda`` kernel on torch's tensors; two
problems have one, for the agent study: numba's CUDA simulator runs them without a GPU).
``EVAL_PROBLEM_SIZE=small`` in the environment of the process that runs a reference gives
CPU-sized inputs (the tests); the full sizes are for an H200 (some problems over 1 ms there, the
elementwise ones about 0.1 ms).

    python benchmarks/eval/eval_set.py            # rewrite benchmarks/eval_problems/manifest.jsonl
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: beside common.py: the agent study's KernelBench mode reads the set too
PROBLEMS = HERE.parent / "eval_problems"
MANIFEST = PROBLEMS / "manifest.jsonl"
KINDS = ("cuda", "triton", "torch", "numba")
#: what eval_batch.py compares by default (the kinds of the KernelBench comparison)
BATCH_KINDS = ("cuda", "triton", "torch")
#: the size knob the references read
SIZE_ENV = "EVAL_PROBLEM_SIZE"


@dataclass(frozen=True)
class Pair:
    problem: str  # the folder's name, e.g. "15_matmul_square"
    kind: str  # cuda | triton | torch

    @property
    def id(self) -> str:
        return f"{self.problem}/{self.kind}"

    @property
    def reference(self) -> Path:
        return PROBLEMS / self.problem / "reference.py"

    @property
    def candidate(self) -> Path:
        return PROBLEMS / self.problem / f"new_{self.kind}.py"


def problems() -> list[str]:
    return sorted(p.name for p in PROBLEMS.iterdir() if (p / "reference.py").is_file())


def pairs(kinds: tuple[str, ...] = KINDS, only: list[str] | None = None) -> list[Pair]:
    """Every (reference, candidate) pair of the given kinds, by problem; ``only``: problem names
    (or their number prefixes, "15" for "15_matmul_square") to keep."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown candidate kinds {unknown}: one of {', '.join(KINDS)}")
    names = problems()
    if only:
        keep = [n for n in names if n in only or n.split("_", 1)[0] in only]
        missing = [o for o in only if not any(o in (n, n.split("_", 1)[0]) for n in names)]
        if missing:
            raise ValueError(f"no such problems: {', '.join(missing)}")
        names = keep
    return [Pair(n, k) for n in names for k in KINDS if k in kinds and (PROBLEMS / n / f"new_{k}.py").is_file()]


def manifest_lines(selected: list[Pair], root: Path | None = None) -> list[str]:
    """One JSON line per pair, as ``krex eval --batch`` reads them; paths relative to ``root``
    (the manifest's folder) when given, else absolute."""
    out = []
    for p in selected:
        ref, cand = p.reference, p.candidate
        if root is not None:
            ref, cand = ref.relative_to(root), cand.relative_to(root)
        out.append(json.dumps({"id": p.id, "reference": str(ref), "candidate": str(cand)}))
    return out


def write_manifest(path: Path, selected: list[Pair]) -> Path:
    """A manifest of absolute paths (for a run's own folder)."""
    path.write_text("\n".join(manifest_lines(selected)) + "\n")
    return path


def main() -> None:
    MANIFEST.write_text("\n".join(manifest_lines(pairs(), PROBLEMS)) + "\n")
    print(f"wrote {MANIFEST} ({len(pairs())} pairs, {len(problems())} problems)")


if __name__ == "__main__":
    sys.exit(main())
