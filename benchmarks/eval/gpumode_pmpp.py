"""GPU MODE's reference kernels (``problems/pmpp``) as published: every problem, its submission and
every solution, each judged by KREX as GPU MODE judges it.

    python benchmarks/eval/gpumode_pmpp.py DIR [--backend nvidia|fake] [--workers 4] [--mode leaderboard]
                                          [--layouts published,flat] [--problems conv2d_py,sort_py]

``DIR`` holds the problems as reference-kernels publishes them: ``DIR/<problem>/task.yml`` (its
``files:`` naming ``../utils.py`` and ``../eval.py``, shared by the family), ``submission.py`` and
``solutions/correct/*`` (expected ``correct``) and ``solutions/wrong/*`` (expected anything else).
Nothing is fetched: carry a copy (``git -C reference-kernels archive HEAD problems/pmpp | tar -x``).

Each pair is evaluated in each layout asked for: ``published`` (the problem's directory as it is)
and ``flat`` (the problem gathered into one directory as a runner lays it out: task.yml, reference.py,
task.py, utils.py side by side, the task.yml unchanged). An arbiter and a pool of ``--workers``
warm workers are started; ``--workers`` evaluations run at once, each timing in regions.

Prints one line a pair and a table (problem, pair, expected, verdict per layout), and writes JSON
through ``benchmarks/common.py`` (``benchmarks/results/gpumode-pmpp-<backend>-<date>.json``). A
problem whose inputs are made on a CUDA device cannot run without one: on a machine with no GPU its
pairs are reported ``needs CUDA`` (not counted as right or wrong). Exit status 0 when every pair
that ran came out as expected.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_world
from agent_world import World
from common import machine, write_result

LAYOUTS = ("published", "flat")


@dataclass
class Pair:
    problem: str
    #: the candidate's path relative to the problem's directory (``submission.py``, ``solutions/...``)
    name: str
    expected: str  # "correct" or "not correct"
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


#: the verdict's metadata that says how its time was made (the outside figure and what it takes off)
TIMING_KEYS = (
    "timing_bound_us",
    "timing_roundtrip_us",
    "timing_overhead_us",
    "timing_cost_ms",
    "timing_bound",
    "input_sets",
    "judge_memory_rounds",
)


def pairs_of(root: Path, problems: list[str] | None) -> list[Pair]:
    """Every problem's submission and solutions, with what GPU MODE says they are."""
    out: list[Pair] = []
    for task in sorted(root.glob("*/task.yml")):
        d = task.parent
        if problems and d.name not in problems:
            continue
        if (d / "submission.py").is_file():
            out.append(Pair(d.name, "submission.py", "correct"))
        for kind, expected in (("correct", "correct"), ("wrong", "not correct")):
            for f in sorted((d / "solutions" / kind).glob("*.py")):
                out.append(Pair(d.name, str(f.relative_to(d)), expected))
    return out


def gather(problem: Path, into: Path) -> Path:
    """``problem`` in one directory as a runner lays it out: its own files and, beside them, every
    file its task.yml takes from elsewhere (``../utils.py``, ``../eval.py``) under the name it is
    given there. The task.yml is copied as it is (it still says ``../utils.py``)."""
    import yaml

    flat = into / problem.name
    shutil.copytree(problem, flat)
    data = yaml.safe_load((problem / "task.yml").read_text())
    for entry in data.get("files") or []:
        source = str(entry.get("source", ""))
        if source.startswith("../"):
            src = (problem / source).resolve()
            if src.is_file():
                shutil.copyfile(src, flat / str(entry["name"]))
    return flat


def needs_cuda(reference: Path) -> bool:
    """The problem makes its inputs on a CUDA device (every pmpp problem does)."""
    text = reference.read_text(errors="replace")
    return "device='cuda'" in text or 'device="cuda"' in text


_PRINT = threading.Lock()


def say(line: str) -> None:
    """One whole line, whichever thread says it."""
    with _PRINT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def outcome(pair: Pair, verdict: str) -> str:
    if pair.expected == "correct":
        return "ok" if verdict == "correct" else "WRONG"
    return "ok" if verdict != "correct" else "WRONG"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="the problems, as DIR/<problem>/task.yml (reference-kernels' problems/pmpp)")
    ap.add_argument("--backend", default="nvidia")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--mode", default="leaderboard", choices=("test", "benchmark", "leaderboard"))
    ap.add_argument("--layouts", default="published,flat")
    ap.add_argument("--problems", default="", help="comma-separated problem names (default: all)")
    a = ap.parse_args()
    root = a.dir.resolve()
    layouts = [x for x in a.layouts.split(",") if x]
    if not root.is_dir() or not any(root.glob("*/task.yml")):
        print(f"{root}: no <problem>/task.yml there (carry reference-kernels' problems/pmpp)", file=sys.stderr)
        return 2
    if any(x not in LAYOUTS for x in layouts):
        print(f"--layouts: {', '.join(LAYOUTS)}", file=sys.stderr)
        return 2
    pairs = pairs_of(root, [p for p in a.problems.split(",") if p] or None)
    from krex_lab.evaluate import evaluate
    from krex_lab.evaluate.job import build_job
    from krex_lab.workers.client import PoolClient

    cuda = False
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        pass
    work = Path(tempfile.mkdtemp(prefix="krex-pmpp-"))
    flat_root = work / "flat"
    flat_root.mkdir()
    flat = (
        {d.name: gather(d, flat_root) for d in sorted({root / p.problem for p in pairs})} if "flat" in layouts else {}
    )
    world = World(
        argparse.Namespace(use_arbiter=False, backend=a.backend, gpus=1, pool_memory_slack_mb=None), work / "rt"
    )
    (work / "rt").mkdir(mode=0o700)
    world.env["KREX_EVAL_CACHE"] = str(work / "cache")
    os.environ.update({k: v for k, v in world.env.items() if k.startswith("KREX_")})
    runnable = cuda or not all(needs_cuda(root / p.problem / "reference.py") for p in pairs)
    pool: PoolClient | None = None
    if runnable:
        world.start_arbiter()
        print(f"pool of {a.workers} ready in {world.start_pool(a.workers, ['torch']):.1f} s", flush=True)
        pool = PoolClient.connect(world.env["KREX_POOL_ENDPOINT"], start=False)

    def one(job: tuple[Pair, str]) -> None:
        pair, layout = job
        d = root / pair.problem if layout == "published" else flat[pair.problem]
        if not cuda and needs_cuda(d / "reference.py"):
            # not run; its job is still made (the task read, every file found, the layout named)
            try:
                files = sorted(build_job(str(d), str(d / pair.name), mode=a.mode).files)
                pair.results[layout] = {"verdict": "needs CUDA", "outcome": "not run", "files": files}
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                pair.results[layout] = {"verdict": "error", "outcome": outcome(pair, "error"), "why": why[:400]}
            say(f"{pair.problem:14s} {pair.name:44s} {layout:9s} {pair.results[layout]['verdict']}")
            return
        t0 = time.perf_counter()
        try:
            ev = evaluate(d, d / pair.name, pool=pool, mode=a.mode)
        except Exception as exc:  # a bad call (the task cannot be read): that pair's line says so
            why = f"{type(exc).__name__}: {exc}"
            pair.results[layout] = {"verdict": "error", "outcome": outcome(pair, "error"), "why": why[:400]}
            say(f"{pair.problem:14s} {pair.name:44s} {layout:9s} error          {why[:120]}")
            return
        why = ev.metadata.get("correctness_issue") or ev.metadata.get("runtime_error") or ""
        why = why or ev.metadata.get("reference_error") or ev.metadata.get("evaluation_error") or ""
        regions = [p.region for p in ev.regions if p.region is not None]
        pair.results[layout] = {
            "verdict": ev.verdict,
            "outcome": outcome(pair, ev.verdict),
            "wall_s": round(time.perf_counter() - t0, 3),
            "runtime_us": ev.runtime,
            "ref_runtime_us": ev.ref_runtime,
            "speedup": ev.speedup,
            "gpu_timed": ev.gpu_timed,
            "regions": len(regions),
            "degraded": sum(1 for r in regions if r.degraded),
            "why": str(why)[:400],
            "summary": ev.summary,
            # where the judge's figure came from: its outside bound, the twin's calibration, the sets
            "timing": {k: ev.metadata[k] for k in TIMING_KEYS if k in ev.metadata},
        }
        say(f"{pair.problem:14s} {pair.name:44s} {layout:9s} {ev.verdict:14s} {outcome(pair, ev.verdict)}")

    t0 = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, a.workers)) as ex:
            list(ex.map(one, [(p, layout) for p in pairs for layout in layouts]))
    finally:
        if pool is not None:
            pool.close()
        world.stop()
        shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - t0
    print(f"\n{'problem':14s} {'pair':44s} {'expected':12s} " + " ".join(f"{x:14s}" for x in layouts))
    for p in pairs:
        cells = " ".join(f"{p.results[x]['verdict']:14s}" for x in layouts)
        bad = any(p.results[x]["outcome"] == "WRONG" for x in layouts)
        print(f"{p.problem:14s} {p.name:44s} {p.expected:12s} {cells}{'  <-- not as GPU MODE says' if bad else ''}")
    for p in pairs:  # why each one that is not as GPU MODE says came out as it did
        for x in layouts:
            r = p.results[x]
            if r["outcome"] == "WRONG":
                print(f"  {p.problem}/{p.name} ({x}): {r['verdict']}: {(r.get('why') or r.get('summary') or '')[:300]}")
    ran = [p.results[x] for p in pairs for x in layouts if p.results[x]["outcome"] != "not run"]
    right = sum(1 for r in ran if r["outcome"] == "ok")
    skipped = len(pairs) * len(layouts) - len(ran)
    degraded = sum(r.get("degraded", 0) for r in ran)
    print(
        f"\n{right} of {len(ran)} evaluations as expected ({len(pairs)} pairs x {len(layouts)} layouts; "
        f"{skipped} not run: need CUDA); {degraded} degraded regions; {wall:.1f} s"
    )
    write_result(
        f"gpumode-pmpp-{a.backend}",
        {
            "machine": machine(),
            "source": str(root),
            "mode": a.mode,
            "layouts": layouts,
            "workers": a.workers,
            "cuda": cuda,
            "wall_s": round(wall, 2),
            "as_expected": right,
            "ran": len(ran),
            "not_run": skipped,
            "degraded_regions": degraded,
            "pairs": [
                {"problem": p.problem, "pair": p.name, "expected": p.expected, "results": p.results} for p in pairs
            ],
        },
    )
    return 0 if right == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
