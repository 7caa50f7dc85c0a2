"""A batch of KernelBench-format candidates evaluated two ways, on one GPU, and compared.

    python benchmarks/eval/eval_batch.py [--backend fake|nvidia] [--jobs 16] [--problems 04,15,...]
        [--kinds cuda,triton,torch] [--size full|small] [--long-ms 1.0] [--no-alone] [--budget-s S]
        [--foreign N --foreign-gib X [--foreign-busy]] [--overlap-pool-start] [--pool-start-concurrency N]

The set is ``benchmarks/eval_problems/`` (``eval_set.py``): every (reference, candidate) pair of
the chosen kinds. Both ways start from empty compile caches (their own ``TORCH_EXTENSIONS_DIR``
and Triton cache) and time the reference of each problem once, so each compiles every candidate
once and does the same work:

(b) **KernelBench's own batch way** (``eval_kb.py``, written here after its published method):
    every candidate compiled in parallel on the CPU first (``--compile-workers`` processes at
    once, each importing one candidate: ``load_inline`` builds), then one evaluation at a time, each
    a fresh process with the GPU to itself (5 seeded correctness trials, 100 timed forwards with an
    event pair each), then the references timed one after the other in one process. Its wall time
    is all three.
(a) **KREX**: a node arbiter (``krex arbiter``) and a pool of ``--jobs`` warm context workers
    (started before, not counted: they are the node's long-lived service; their start-up time is
    reported beside), then ``krex eval --batch MANIFEST --jobs N``: compile, check and the
    reference's time per problem on warm workers at once, every timing inside a region, each
    evaluation admitted by GPU memory. Its wall time is that command's. ``--foreign N``: (a) runs
    beside N foreign GPU processes holding ``--foreign-gib`` each (``foreign.py``; idle, or looping
    matmuls with ``--foreign-busy``), started before the pool and stopped after (a).
    ``--overlap-pool-start``: the batch begins as soon as the pool answers, on its first worker
    ready, and the ratio with the pool's start uses that wall time.

Then (b') **alone**: (b)'s evaluation phase again for the pairs whose (b) runtime is over
``--long-ms``: the method's own run-to-run noise, against which (a)'s deviation is read. The order
is (a), (b), (b'): the arbiter and pool are stopped before (b) starts; (b') is skipped when the
run is past ``--budget-s``; a run stopped by a signal writes what it measured (the pairs of (b)
done so far among it).

Printed: both wall times and their ratio, per-pair runtime deviation of (a) from (b) for pairs
over ``--long-ms`` (median, p95 and max of |a/b - 1|) and the same for (b') against (b), verdicts
that differ, region counts and degraded regions (by reason), the pool's start (first worker and
all), verdicts and pairs run again for memory; the JSON's summary adds each evaluation's phases,
admission, memory footprint and ``timing_*`` figures. The JSON (machine, date, git revision, every
result) goes to ``benchmarks/out/eval_batch-<backend>-<date>.json`` (``--out``: elsewhere), and
after each phase a partial copy to ``$OUT`` where that is set.

On ``--backend fake`` the GPU is mocked: CPU torch, ``EVAL_PROBLEM_SIZE=small``, host-clock times,
torch candidates only (said in the output and the JSON); the script is tested that way.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# this family; benchmarks/: common; agent_world, of the agent study's family
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "agent")]

import eval_set  # noqa: E402
from agent_world import World  # noqa: E402
from common import REPO, machine, nvidia_smi, write_result  # noqa: E402
from eval_batch_summary import report, runtime_of, summarise  # noqa: E402
from foreign import foreign_processes  # noqa: E402

EVAL_KB = HERE / "eval_kb.py"
#: what the pool's workers must see of this run's environment: the size knob, one thread each on the
#: fake backend, the build target and the CUDA toolkit of load_inline (as the baseline's processes do)
WORKER_ENV = (eval_set.SIZE_ENV, "OMP_NUM_THREADS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME")
#: seconds one baseline process may take (KernelBench's own default is 180 s)
KB_TIMEOUT = 300.0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="fake", choices=["fake", "nvidia"])
    p.add_argument("--jobs", type=int, default=16, help="KREX: evaluations at once (and warm workers)")
    p.add_argument("--problems", default="", help="problem names or numbers, comma-separated (default: all)")
    p.add_argument("--kinds", default="", help="candidate kinds (default: cuda,triton,torch; fake: torch)")
    p.add_argument("--size", default="", choices=["", "full", "small"], help="default: full (nvidia), small (fake)")
    p.add_argument("--trials", type=int, default=5, help="correctness trials of the baseline (KREX: its default, 5)")
    p.add_argument("--perf-trials", type=int, default=100, help="timed forwards of the baseline (KREX: its default)")
    p.add_argument("--compile-workers", type=int, default=0, help="baseline compile processes (default: the CPUs)")
    p.add_argument("--long-ms", type=float, default=1.0, help="pairs over this runtime are compared")
    p.add_argument("--alone", action=argparse.BooleanOptionalAction, default=True, help="the (b') repeat")
    p.add_argument("--budget-s", type=float, default=0.0, help="skip (b') when the run is past this (0: never)")
    p.add_argument(
        "--give-back-workers",
        action="store_true",
        help="krex eval --memory-give-back-workers: the batch lets the pool keep fewer workers while memory is short",
    )
    p.add_argument("--pool-memory-slack-mb", type=int, default=None, help="the pool's Pool.memory_slack_mb")
    p.add_argument(
        "--pool-start-concurrency", type=int, default=0, help="the pool's Pool.start_concurrency (default: its own)"
    )
    p.add_argument(
        "--overlap-pool-start",
        action="store_true",
        help="(a) begins as soon as the pool answers, on its first worker ready; its wall counts the pool's start",
    )
    p.add_argument("--foreign", type=int, default=0, metavar="N", help="run (a) beside N foreign GPU processes")
    p.add_argument("--foreign-gib", type=float, default=1.0, metavar="X", help="GiB each foreign process holds")
    p.add_argument("--foreign-busy", action="store_true", help="the foreign processes loop matmuls (else idle)")
    p.add_argument("--memory-reserve-mb", type=int, default=None, help="krex eval --batch --memory-reserve-mb")
    p.add_argument("--out", default="", help="write the JSON here instead of benchmarks/out/")
    args = p.parse_args(argv)
    fake = args.backend == "fake"
    args.kinds = tuple(k for k in (args.kinds or ("torch" if fake else ",".join(eval_set.BATCH_KINDS))).split(",") if k)
    args.size = args.size or ("small" if fake else "full")
    args.problems = [x for x in args.problems.split(",") if x]
    return args


def git_rev() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return r.stdout.strip()
    except OSError:
        pass
    return os.environ.get("GIT_REV", "unknown")


def tree_digest() -> str:
    """sha256 of the code that ran (krex_lab, this benchmark, the problems): a tree copied without
    .git is still identified."""
    h = hashlib.sha256()
    files = sorted([*REPO.glob("krex_lab/**/*.py"), *HERE.glob("eval_*.py"), *eval_set.PROBLEMS.glob("*/*.py")])
    for f in files:
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cuda_arch() -> str:
    """The GPU's compute capability ("9.0"), so that every build targets it alone (and the same
    flags find the same build again); "" when nvidia-smi cannot say."""
    caps = nvidia_smi("compute_cap")
    return caps[0] if caps else ""


def cuda_home() -> str:
    """The CUDA toolkit's root for load_inline where CUDA_HOME is not set: torch guesses it as the
    folder above the ``nvcc`` on PATH, which is wrong when that ``nvcc`` is a wrapper script
    (``exec /usr/local/cuda-13.0/bin/nvcc "$@"``); "" when no toolkit is found."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return ""
    candidates = [Path(os.path.realpath(nvcc)).parent.parent]
    with contextlib.suppress(OSError, UnicodeDecodeError):
        head = Path(nvcc).read_bytes()[:4096]
        if not head.startswith(b"\x7fELF"):
            candidates += [Path(m).parent.parent for m in re.findall(r"(/\S+/bin/nvcc)\b", head.decode())]
    candidates.append(Path("/usr/local/cuda"))
    return next((str(c) for c in candidates if (c / "include" / "cuda_runtime.h").is_file()), "")


def base_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH")])
    )
    env["PYTHONUNBUFFERED"] = "1"
    if args.size == "small":
        env[eval_set.SIZE_ENV] = "small"
    else:
        env.pop(eval_set.SIZE_ENV, None)
    if args.backend == "fake":
        env["OMP_NUM_THREADS"] = "1"  # CPU torch in many processes at once: no thread oversubscription
    else:
        if arch := cuda_arch():
            env.setdefault("TORCH_CUDA_ARCH_LIST", arch)
        if "CUDA_HOME" not in env and (home := cuda_home()):
            env["CUDA_HOME"] = home
    return env


def kb_records(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("EVALKB ")]


def kb_run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[list[dict[str, Any]], str]:
    """Run one baseline process; (its records, the tail of its stderr)."""
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return kb_records(out), f"timed out after {timeout:.0f} s"
    return kb_records(r.stdout), r.stderr[-1500:] if r.returncode else ""


def pair_env(env: dict[str, str], work: Path, pair: eval_set.Pair) -> dict[str, str]:
    return {**env, "TORCH_EXTENSIONS_DIR": str(work / "ext" / pair.problem / pair.kind)}


def baseline_evals(
    pairs: list[eval_set.Pair],
    env: dict[str, str],
    work: Path,
    args: argparse.Namespace,
    out: dict[str, dict[str, Any]],
    label: str = "(b)",
    progress: Callable[[], None] = lambda: None,
) -> dict[str, dict[str, Any]]:
    """One fresh process per pair, one after the other; each result goes into ``out`` as it comes
    (``progress`` is called after each: a run cut short keeps the pairs it finished)."""
    device = "cuda" if args.backend == "nvidia" else "cpu"
    for pair in pairs:
        cmd = [sys.executable, str(EVAL_KB), "eval", str(pair.reference), str(pair.candidate), "--device", device]
        cmd += ["--trials", str(args.trials), "--perf-trials", str(args.perf_trials)]
        t0 = time.perf_counter()
        recs, err = kb_run(cmd, pair_env(env, work, pair), KB_TIMEOUT)
        rec = recs[0] if recs else {"compiled": False, "correctness": False, "runtime": -1.0, "error": err}
        rec["process_wall_s"] = time.perf_counter() - t0
        rec["results"] = len(recs)
        out[pair.id] = rec
        print(f"  {label} {pair.id:28s} {describe(rec)}", flush=True)
        progress()
    return out


def run_baseline(
    pairs: list[eval_set.Pair],
    env: dict[str, str],
    work: Path,
    args: argparse.Namespace,
    out: dict[str, Any],
    progress: Callable[[], None],
) -> dict[str, Any]:
    """(b) into ``out``, phase by phase; ``wall_s`` is set last (a run cut short has none)."""
    env = {**env, "TRITON_CACHE_DIR": str(work / "triton")}
    device = "cuda" if args.backend == "nvidia" else "cpu"
    workers = args.compile_workers or os.cpu_count() or 1
    t_start = time.perf_counter()

    def build(pair: eval_set.Pair) -> dict[str, Any]:
        recs, err = kb_run(
            [sys.executable, str(EVAL_KB), "compile", str(pair.candidate)], pair_env(env, work, pair), 900
        )
        return recs[0] if recs else {"compiled": False, "error": err}

    out["compile_workers"] = workers
    with ThreadPoolExecutor(max_workers=workers) as ex:
        out["compile"] = dict(zip([p.id for p in pairs], ex.map(build, pairs)))
    out["compile_s"] = time.perf_counter() - t_start
    print(f"(b) compile: {len(pairs)} candidates, {workers} at once, {out['compile_s']:.1f} s", flush=True)
    progress()
    t0 = time.perf_counter()
    baseline_evals(pairs, env, work, args, out.setdefault("evals", {}), progress=progress)
    out["evals_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    refs = sorted({str(p.reference) for p in pairs})
    cmd = [sys.executable, str(EVAL_KB), "time-refs", *refs, "--device", device, "--perf-trials", str(args.perf_trials)]
    recs, err = kb_run(cmd, env, KB_TIMEOUT * 2)
    out["ref_times"] = {Path(r["reference"]).parent.name: r for r in recs}
    out["refs_s"] = time.perf_counter() - t0
    print(f"(b) evaluations {out['evals_s']:.1f} s, references {out['refs_s']:.1f} s{': ' + err if err else ''}")
    out["wall_s"] = time.perf_counter() - t_start
    return out


def describe(rec: dict[str, Any]) -> str:
    if rec.get("verdict") not in (None, "correct") or not rec.get("correctness"):
        why = rec.get("verdict") or ", ".join(sorted(rec.get("metadata") or {})) or rec.get("error", "")
        return f"NOT CORRECT ({str(why)[:160]})"
    return f"{rec['runtime']:10.1f} us"


def krex_world(args: argparse.Namespace, work: Path, env: dict[str, str]) -> tuple[World, float]:
    """A private arbiter and a pool of ``--jobs`` warm workers, with their own empty caches."""
    world_args = argparse.Namespace(
        use_arbiter=False,
        backend=args.backend,
        gpus=1,
        pool_memory_slack_mb=args.pool_memory_slack_mb,
        pool_start_concurrency=args.pool_start_concurrency,
    )
    runtime = work / "runtime"
    runtime.mkdir(mode=0o700)
    world = World(world_args, runtime)
    world.env.update({k: v for k, v in env.items() if k in WORKER_ENV})
    world.env["KREX_EVAL_CACHE"] = str(work / "cache")
    world.env["TRITON_CACHE_DIR"] = str(work / "triton")
    world.start_arbiter()
    preload = ["torch"] + (["triton"] if "triton" in args.kinds else [])
    ready_s = world.start_pool(args.jobs, preload, wait_all=not args.overlap_pool_start)
    return world, ready_s


def krex_command(manifest: Path, args: argparse.Namespace) -> list[str]:
    """``krex eval --batch``, with the baseline's trial counts (its defaults are KernelBench's too)."""
    cmd = [sys.executable, "-m", "krex_lab.cli", "eval", "--batch", str(manifest), "--jobs", str(args.jobs)]
    if args.memory_reserve_mb is not None:
        cmd += ["--memory-reserve-mb", str(args.memory_reserve_mb)]
    if args.give_back_workers:
        cmd += ["--memory-give-back-workers"]
    return [*cmd, "--trials", str(args.trials), "--perf-trials", str(args.perf_trials)]


def run_krex(pairs: list[eval_set.Pair], env: dict[str, str], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    manifest = eval_set.write_manifest(work / "manifest.jsonl", pairs)
    foreign: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if args.foreign:  # before the pool: its workers start beside them, as a user's would
            foreign = stack.enter_context(
                foreign_processes(args.foreign, args.foreign_gib, backend=args.backend, busy=args.foreign_busy)
            )
            print(f"(a) beside {len(foreign)} foreign GPU processes: {foreign}", flush=True)
        t_pool = time.perf_counter()
        world, ready_s = krex_world(args, work, env)
        if args.overlap_pool_start:
            print(f"(a) the pool answered in {ready_s:.1f} s: the batch begins on its first worker ready", flush=True)
        else:
            print(
                f"(a) arbiter and {args.jobs} warm workers ready in {ready_s:.1f} s, the first in "
                f"{world.first_worker_s or 0:.1f} s (not counted)",
                flush=True,
            )
        by_path = {str(p.candidate.resolve()): p.id for p in pairs}
        try:
            t0 = time.perf_counter()
            with open(work / "krex.out", "w") as out, open(work / "krex.err", "w") as err:
                code = subprocess.run(krex_command(manifest, args), env=world.env, stdout=out, stderr=err).returncode
            wall_s = time.perf_counter() - t0
            wall_from_pool_start_s = time.perf_counter() - t_pool
            recycled = world.recycled()
            first_s, all_s = world.first_worker_s, world.all_ready_s
        finally:
            world.stop()
    results: dict[str, list[dict[str, Any]]] = {p.id: [] for p in pairs}
    strays = []
    for line in (work / "krex.out").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            strays.append(line)
            continue
        key = rec.get("id") or by_path.get(str(Path(str(rec.get("candidate", ""))).resolve()))
        if key in results:
            results[key].append(rec)
        else:
            strays.append(line[:300])
    for pid, recs in results.items():
        print(f"  (a) {pid:28s} {describe(recs[0]) if recs else 'NO RESULT'}", flush=True)
    print(f"(a) krex eval --batch --jobs {args.jobs}: {wall_s:.1f} s, exit {code}", flush=True)
    for why, n in recycled.items():  # a worker recycled is one restarted: (a)'s wall time pays for it
        print(f"    workers recycled {n}x: {why}" if why != "left_mib" else f"    MiB left: {n}", flush=True)
    return {
        "wall_s": wall_s,
        "pool_ready_s": ready_s,
        "pool_first_worker_s": first_s,
        "pool_all_ready_s": all_s,
        "overlap_pool_start": args.overlap_pool_start,
        "wall_from_pool_start_s": wall_from_pool_start_s,
        "foreign_processes": foreign,
        "exit_code": code,
        "command": " ".join(krex_command(manifest, args)[1:]),
        "stderr_tail": (work / "krex.err").read_text()[-3000:],
        "stray_lines": strays[:20],
        "workers_recycled": recycled,
        "results": results,
    }


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def cut_short(work: Path) -> dict[str, Any]:
    """What a batch stopped before its end left: the results it wrote, its stderr's tail (its
    progress lines: done so far, and how many wait for GPU memory, for how much)."""
    out = work / "krex.out"
    lines = out.read_text().splitlines() if out.exists() else []
    verdicts: dict[str, int] = {}
    #: each result not ``correct``: its id, summary and the metadata that says why (first 600 chars)
    failed: list[dict[str, str]] = []
    for line in lines:
        with contextlib.suppress(ValueError, AttributeError):
            record = json.loads(line)
            v = str(record.get("verdict"))
            verdicts[v] = verdicts.get(v, 0) + 1
            if v != "correct" and len(failed) < 40:
                meta = record.get("metadata") or {}
                why = {k: str(meta[k])[:600] for k in WHY_KEYS if meta.get(k)}
                failed.append({"id": str(record.get("id")), "summary": str(record.get("summary"))[:600], **why})
    err = work / "krex.err"
    tail = err.read_text(errors="replace")[-4000:] if err.exists() else ""
    for line in tail.splitlines()[-12:]:
        print(f"    (a) {line}", flush=True)
    for f in failed[:8]:
        print(f"    (a) {f['id']}: {f['summary'][:300]}", flush=True)
    return {"results": len(lines), "verdicts": verdicts, "not_correct": failed, "stderr_tail": tail}


#: the metadata that says why an evaluation was not ``correct`` (kept when a run is cut short)
WHY_KEYS = (
    "evaluation_error",
    "reference_error",
    "out_of_memory",
    "out_of_memory_elsewhere",
    "worker_output",
    "worker_died",
    "admission",
)


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    try:
        pairs = eval_set.pairs(args.kinds, args.problems or None)
    except ValueError as exc:
        raise SystemExit(f"eval_batch: {exc}") from None
    if not pairs:
        raise SystemExit("eval_batch: no pair matches --problems/--kinds")
    if args.backend == "fake":
        print("eval_batch: FAKE backend - the GPU is MOCKED: CPU torch, small sizes, host-clock times", flush=True)
    work = Path(tempfile.mkdtemp(prefix="krex-evalbatch-"))
    env = base_env(args)
    t_start = time.time()
    result: dict[str, Any] = {
        "benchmark": "eval_batch",
        "backend": args.backend,
        "simulated": args.backend == "fake",
        "machine": machine(),
        "git_rev": git_rev(),
        "tree_digest": tree_digest(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "parameters": {k: v for k, v in vars(args).items() if k != "out"},
        "torch_cuda_arch_list": env.get("TORCH_CUDA_ARCH_LIST", ""),
        "cuda_home": env.get("CUDA_HOME", ""),
        "pairs": [p.id for p in pairs],
    }

    def partial() -> None:
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"eval_batch-{args.backend}-partial.json").write_text(json.dumps(result))

    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` on the device: keep what was measured
    try:
        # (a) first: the shorter and the newer path; a run cut short during (b) keeps (b)'s pairs so far
        result["krex"] = run_krex(pairs, env, work / "krex", args)
        partial()
        print(f"(b) KernelBench's way: {len(pairs)} pairs", flush=True)
        run_baseline(pairs, env, work / "kb", args, result.setdefault("baseline", {}), partial)
        partial()
        long_pairs = [p for p in pairs if (runtime_of(result["baseline"]["evals"][p.id]) or 0) > args.long_ms * 1000]
        if not args.alone:
            result["alone_skipped"] = "--no-alone"
        elif args.budget_s and time.time() - t_start > args.budget_s:
            result["alone_skipped"] = f"past the budget ({time.time() - t_start:.0f} s > {args.budget_s:.0f} s)"
        elif long_pairs:
            print(f"(b') alone: the {len(long_pairs)} pairs over {args.long_ms} ms again", flush=True)
            t0 = time.perf_counter()
            kb_env = {**env, "TRITON_CACHE_DIR": str(work / "kb" / "triton")}  # (b)'s caches, warm
            result["alone"] = {"evals": {}}
            baseline_evals(long_pairs, kb_env, work / "kb", args, result["alone"]["evals"], "(b')", partial)
            result["alone"]["wall_s"] = time.perf_counter() - t0
    except KeyboardInterrupt:
        result["interrupted"] = "stopped by a signal; the phases before it are complete"
        print("eval_batch: INTERRUPTED; writing what was measured", flush=True)
    except Exception:  # on the device: keep what the phases before measured, and say what broke
        result["failed"] = traceback.format_exc()[-4000:]
        print(f"eval_batch: FAILED; writing what was measured\n{result['failed']}", flush=True)
    finally:
        if "krex" not in result:  # (a) cut short: what its batch said and finished so far
            result["krex_cut_short"] = cut_short(work / "krex")
        shutil.rmtree(work, ignore_errors=True)
    result["wall_s"] = time.time() - t_start
    if "wall_s" in result.get("baseline", {}) and "krex" in result:
        result["summary"] = summarise(result, args)
        report(result["summary"])
    if args.out:
        path = Path(args.out)
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")
    else:
        path = write_result(f"eval_batch-{args.backend}", result)
    if os.environ.get("OUT"):  # the whole result is written: the partial copy is not needed
        with contextlib.suppress(OSError):
            Path(os.environ["OUT"], f"eval_batch-{args.backend}-partial.json").unlink()
    if "failed" in result or "interrupted" in result:
        raise SystemExit(1)
    return path


if __name__ == "__main__":
    main()
