"""Cheats judged inside one batch of concurrent evaluations, beside honest candidates: shared by
the CPU test (tests/evaluate/test_redteam_batch.py) and the GPU one
(tests/gpu/test_redteam_batch_gpu.py). The batch goes through the API's batch path
(:func:`krex_lab.evaluate.batch.run_batch`), every evaluation submitted at once; each cheat is
judged against the honest candidates of its problem in the same batch (their median runtime and
reference time), which also must be ``correct`` and agree with each other within noise."""

from __future__ import annotations

import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krex_lab.evaluate import Evaluation
from krex_lab.evaluate.batch import BatchRecord, Pair, run_batch
from krex_lab.evaluate.options import EvaluateOptions

from . import PROBLEMS, Cheat
from .harness import SLACK, clean_up, daemons


@dataclass
class BatchOutcome:
    """What one batch showed: ``found`` lists every forged verdict and every honest candidate
    that was not judged as it should be (empty: nothing)."""

    cheats: dict[str, Evaluation] = field(default_factory=dict)
    honest: dict[str, list[Evaluation]] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [
            f"{name:30} {ev.verdict:12} {ev.runtime:10.2f} us  {ev.summary[:90]}" for name, ev in self.cheats.items()
        ]
        for problem, evs in self.honest.items():
            rows += [f"{'honest ' + problem:30} {ev.verdict:12} {ev.runtime:10.2f} us" for ev in evs]
        return "\n".join(rows)


def judge_batch(cheats: list[Cheat], honest: dict[str, int], pool: Any, jobs: int, **defaults: Any) -> BatchOutcome:
    """``cheats`` and ``honest[problem]`` plain honest candidates of each problem, in one batch of
    ``jobs`` at once on ``pool`` (a PoolProc); each cheat's reference timed in its own evaluation."""
    pairs: list[Pair] = []
    names: list[tuple[str, str]] = []  # (cheat name or "", problem) by index
    for cheat in cheats:
        options = {"retime_reference": True} if cheat.retime else {}
        pairs.append(_pair(len(pairs), cheat.problem, cheat.path, cheat.name, options))
        names.append((cheat.name, cheat.problem))
    for problem, count in honest.items():
        for k in range(count):
            pairs.append(_pair(len(pairs), problem, PROBLEMS / problem / "honest.py", f"honest-{problem}-{k}", {}))
            names.append(("", problem))
    got: list[BatchRecord] = []
    try:
        run_batch(
            pairs,
            jobs=jobs,
            defaults=EvaluateOptions.of(defaults),
            pool=pool.client,
            emit=got.append,
            progress=io.StringIO(),
        )
        left = daemons()
    finally:
        clean_up(pool.env.get("PYTHONPATH", ""))
    out = BatchOutcome()
    if len(got) != len(pairs) or sorted(r.index for r in got) != list(range(len(pairs))):
        out.found.append(f"{len(pairs)} evaluations submitted, {len(got)} results")
        return out
    for rec in got:
        name, problem = names[rec.index]
        if name:
            out.cheats[name] = rec
        else:
            out.honest.setdefault(problem, []).append(rec)
    out.found += _honest_issues(out.honest)
    for cheat in cheats:
        ev, peers = out.cheats[cheat.name], out.honest.get(cheat.problem, [])
        if why := _forged(ev, peers):
            out.found.append(f"{cheat.name} ({cheat.kind}): {why}")
    if left:
        out.found.append(f"process(es) {left} outlived the batch")
    return out


def _pair(index: int, problem: str, candidate: Path, pair_id: str, options: dict[str, Any]) -> Pair:
    return Pair(
        index=index,
        line=index + 1,
        reference=str(PROBLEMS / problem / "reference.py"),
        candidate=str(candidate),
        id=pair_id,
        options=options,  # type: ignore[arg-type]
    )


def _honest_issues(honest: dict[str, list[Evaluation]]) -> list[str]:
    issues = []
    for problem, evs in honest.items():
        wrong = [ev.summary for ev in evs if ev.verdict != "correct" or ev.runtime <= 0]
        issues += [f"an honest candidate of {problem}: {s}" for s in wrong]
        times = [ev.runtime for ev in evs if ev.verdict == "correct" and ev.runtime > 0]
        if times:
            mid = statistics.median(times)
            issues += [
                f"an honest candidate of {problem} at {t:.2f} us, the others' median {mid:.2f} us"
                for t in times
                if not mid / SLACK <= t <= mid * SLACK
            ]
    return issues


def _forged(ev: Evaluation, peers: list[Evaluation]) -> str | None:
    """Why ``ev`` is a forged ``correct`` against the honest candidates of its problem."""
    fine = [p for p in peers if p.verdict == "correct" and p.runtime > 0]
    if ev.verdict != "correct" or not fine:
        return None
    runtime = statistics.median(p.runtime for p in fine)
    ref = statistics.median(p.ref_runtime for p in fine)
    if 0 < ev.runtime < runtime / SLACK:
        return f"correct at {ev.runtime:.2f} us, honest candidates beside it take {runtime:.2f} us"
    if ev.ref_runtime > ref * SLACK:
        return f"reference time {ev.ref_runtime:.2f} us, beside honest candidates {ref:.2f} us"
    return None
