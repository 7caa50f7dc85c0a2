"""What each defence of the judge's data path costs, per evaluation, measured in-process.

    EVAL_PROBLEM_SIZE=small python benchmarks/eval/judge_data_cost.py [--problems 15,13,04,11]

For each problem (its reference as the judge loads it), the judge-side pieces are timed on its
own inputs, the median of several runs, and scaled by how often one evaluation with the defaults
does each (KernelBench: 5 checked trials and a refilled one, then one warm-up and one timed round
over as many sets as the round has, and the sets made after it, two outputs re-checked):

* ``seeds``: a CSPRNG seed per set against a counter;
* ``set memory``: a set moved into a memfd of its own, with its output buffers, poisoned, against
  the shared arena of before (the refill in place it replaces is the same copy);
* ``round checks``: every set's inputs against their pristine copies and every output against
  what the judge read (after each round);
* ``spread``: the reference's spread for the tolerance (each comparison);
* ``idle check``: the candidate's CPU time read once more per round.

The candidate's copy into the judge's buffers replaces the copy into a memfd its answer made
before (the same bytes), so it is not counted. JSON beside the printout (``--out``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _median(fn, repeat: int = 7) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(p: Path) -> dict[str, object]:
    """One problem's costs (see the module's docstring)."""
    from krex_lab.evaluate.channel import Shared, share_input
    from krex_lab.evaluate.job import build_job
    from krex_lab.evaluate.judge.buffers import out_spec, share_set
    from krex_lab.evaluate.judge.clock import harness_cpu as cpu_seconds
    from krex_lab.evaluate.judge.compare import same, spread
    from krex_lab.evaluate.judge.problems import problem_for
    from krex_lab.evaluate.judge.rounds import MAX_SETS, budget
    from krex_lab.evaluate.judge.seeds import Seeds
    from krex_lab.evaluate.judge.session import _module
    from krex_lab.evaluate.judge.tensors import arrays, clone

    ref = p / "reference.py"
    job = build_job(ref, ref.read_text() + "\nModelNew = Model\n")
    problem = problem_for(job, _module(job.reference, "reference"), "cpu", 0)
    data = problem.make(None, 1)
    expected = problem.reference(clone(data))
    spec = out_spec(expected)
    per_set = 2 * sum(int(x.nbytes) for x in arrays(data)) + 2 * spec.nbytes
    k = max(1, min(job.options.perf_trials or 100, budget("cpu") // per_set, MAX_SETS))
    calls_checked = (job.options.trials or 5) + 2
    # the check's calls; a warm-up round, a timed round and the sets made after it (which the
    # reference is timed on)
    sets_made = calls_checked + 3 * k
    rounds = 1
    comparisons = calls_checked + 2

    counter = itertools.count()
    seeds = Seeds(None)
    seed_new = _median(lambda: [seeds.next() for _ in range(1000)]) / 1000
    seed_old = _median(lambda: [next(counter) for _ in range(1000)]) / 1000

    def old_round() -> None:  # a round's sets packed into shared memfds, one after another
        shared = Shared()
        for _ in range(k):
            for x in arrays(data):
                shared.arrays.append(share_input(x, shared)[0])
        shared.close()

    def new_round() -> None:  # each set in a memfd of its own, with its output buffers, poisoned
        shared = Shared()
        sets = [share_set(problem, data, spec, shared) for _ in range(k)]
        shared.close()
        for cs in sets:
            cs.release()

    set_old, set_new = _median(old_round, 3) / k, _median(new_round, 3) / k
    shared = Shared()
    cs = share_set(problem, data, spec, shared)
    for b, e in zip(cs.outs, arrays(expected)):
        b.copy_(e)
    pristine = clone(data)
    read = cs.read([])
    check = _median(
        lambda: (
            [same(x, y) for x, y in zip(arrays(pristine), cs.inputs)]
            + [same(x, y) for x, y in zip(cs.outs, arrays(read))]
        )
    )
    spread_s = _median(lambda: [spread(e) for e in arrays(expected)])
    idle = _median(lambda: cpu_seconds(os.getpid()))
    shared.close()
    cs.release()
    costs = {
        "seeds_ms": (seed_new - seed_old) * sets_made * 1e3,
        "set_memory_ms": (set_new - set_old) * sets_made * 1e3,
        "round_checks_ms": check * k * rounds * 1e3,
        "spread_ms": spread_s * comparisons * 1e3,
        "idle_check_ms": idle * rounds * 1e3,
    }
    return {
        "problem": p.name,
        "sets_per_round": k,
        "sets_made": sets_made,
        "per_set_us": {"old_arena": round(set_old * 1e6, 2), "own_memfd": round(set_new * 1e6, 2)},
        **{key: round(v, 3) for key, v in costs.items()},
        "total_ms": round(sum(costs.values()), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="15,13,04,11")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    probs = sorted((ROOT / "benchmarks" / "eval_problems").iterdir())
    chosen = [p for p in probs if p.is_dir() and p.name.split("_")[0] in a.problems.split(",")]
    rows = []
    for p in chosen:
        row = measure(p)
        rows.append(row)
        print(
            f"{p.name:20s} sets {row['sets_per_round']:3d}  "
            + "  ".join(f"{key[:-3]} {row[key]:7.2f} ms" for key in row if str(key).endswith("_ms"))
            + f"  (a set: {row['per_set_us']})",
            flush=True,
        )
    text = json.dumps({"size": os.environ.get("EVAL_PROBLEM_SIZE", ""), "rows": rows}, indent=1)
    if a.out:
        Path(a.out).write_text(text)
        print("wrote", a.out)


if __name__ == "__main__":
    main()
