"""The judge's static rules on honest candidates: flags per rule (every one a false positive) and
the time of a scan.

The honest corpus: every candidate of benchmarks/eval_problems/manifest.jsonl (CUDA through
load_inline, Triton, numba, torch) and those of tests/evaluate/problems/ named for being right
(``correct.py``, ``cpp_inline.py``). Prints a table, writes
``benchmarks/out/static_rules-<machine>-<date>.json``.

    .venv/bin/python benchmarks/eval/static_rules.py
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, write_result

from krex_lab.evaluate.judge.static_rules import KREX_RULES, scan

HONEST_TEST_NAMES = ("correct.py", "cpp_inline.py")


def honest_candidates() -> list[Path]:
    problems = REPO / "benchmarks" / "eval_problems"
    manifest = (problems / "manifest.jsonl").read_text().splitlines()
    paths = [problems / json.loads(line)["candidate"] for line in manifest if line.strip()]
    tests = REPO / "tests" / "evaluate" / "problems"
    return paths + sorted(p for name in HONEST_TEST_NAMES for p in tests.glob(f"*/{name}"))


def main() -> None:
    candidates = honest_candidates()
    per_rule: Counter[str] = Counter()
    flagged: dict[str, list[str]] = {}
    for path in candidates:
        flags = scan(path.read_text(), filename=str(path))
        for flag in flags:
            per_rule[f"{flag.origin}:{flag.rule}"] += 1
        if flags:
            flagged[str(path.relative_to(REPO))] = [f"{f.origin}:{f.rule}: {f.message}" for f in flags]
    largest = max(candidates, key=lambda p: len(p.read_text()))
    source = largest.read_text()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        scan(source)
        times.append(time.perf_counter() - start)

    print(f"{len(candidates)} honest candidates; flags per rule (each a false positive):")
    for rule in [f"krex:{r}" for r in KREX_RULES] + sorted(r for r in per_rule if not r.startswith("krex:")):
        print(f"  {rule:40} {per_rule[rule]}")
    kernelguard_total = sum(n for rule, n in per_rule.items() if rule.startswith("kernelguard:"))
    print(f"  {'kernelguard: every rule together':40} {kernelguard_total}")
    for path, lines in flagged.items():
        print(f"  {path}: " + "; ".join(lines))
    median_ms = statistics.median(times) * 1e3
    print(f"scan of the largest, {largest.relative_to(REPO)} ({len(source)} chars): median {median_ms:.1f} ms")
    write_result(
        f"static_rules-{socket.gethostname().split('.')[0]}",
        {
            "machine": machine(),
            "candidates": [str(p.relative_to(REPO)) for p in candidates],
            "flags_per_rule": {f"krex:{r}": per_rule[f"krex:{r}"] for r in KREX_RULES} | dict(per_rule),
            "flagged": flagged,
            "largest": {
                "path": str(largest.relative_to(REPO)),
                "chars": len(source),
                "scan_ms_median": round(median_ms, 2),
                "scan_ms_max": round(max(times) * 1e3, 2),
            },
        },
    )


if __name__ == "__main__":
    main()
