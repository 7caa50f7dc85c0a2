"""``krex_lab.bench`` against ``triton.testing.do_bench`` on one GPU, alone; every krex_lab.kernels preset timed.

    python benchmarks/regions/bench_vs_do_bench.py [--budget 170] [--repeats 5]

Starts its own arbiter (nvidia backend, private KREX_RUNTIME_DIR / KREX_ENDPOINT) and registers
this process on GPU 0; nothing else runs on the GPU. Three parts, in this order, stopping what
is left when ``--budget`` seconds have passed (recorded as skipped):

A. torch fp32 matmuls (TF32 off) at the fidelity benchmark's sizes for 0.05, 0.1, 1 and 10 ms:
   ``--repeats`` (5) ``krex_lab.bench`` runs with default options (each in its own region) and
   three ``do_bench`` runs (``return_mode="all"``, L2 cleared by do_bench itself); reports the
   medians, the spread of the bench medians ((max - min) / median) and the agreement of the
   median of bench medians with the median of do_bench medians (target: within 2 % from 0.1 ms).
B. krex_lab.kernels on the real GPU: every candidate checked against its reference (``krex_lab.check``)
   at the ``0.05ms`` preset (block sizes differ from the simulator's).
C. krex_lab.kernels presets: every candidate at every preset timed once by ``bench`` (timeout 6 s); the
   optimised ones at 0.1 ms and more also by ``do_bench`` (agreement). Measured ms vs the
   roofline estimate behind the preset.

Prints a table, writes benchmarks/out/bench_vs_do_bench-<date>.json. Without a CUDA GPU it
says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, write_result
from fidelity import start_arbiter, stop_arbiter

from krex_lab.bench.stats import summarize

MATMUL_N = {"0.05ms": 960, "0.1ms": 1216, "1ms": 2880, "10ms": 6208}  # fidelity-2026-11-29.json, H200
TARGET = {"0.05ms": 0.05, "0.1ms": 0.1, "1ms": 1.0, "10ms": 10.0}
AGREEMENT = 0.02


def do_bench_times(fn: Any, est_ms: float) -> list[float]:
    """All of one do_bench run's samples (ms); about 60 samples (at least do_bench's default 100 ms)."""
    from triton.testing import do_bench

    rep = max(100.0, 60 * est_ms)
    try:
        times = do_bench(fn, warmup=25, rep=rep, return_mode="all")
        if isinstance(times, (list, tuple)) and len(times) > 1:
            return [float(t) for t in times]
    except (TypeError, ValueError, AssertionError):
        pass
    return [float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))]


def pct(a: float, b: float) -> float:
    return round(100.0 * (a / b - 1.0), 3)


class Run:
    def __init__(self, budget: float) -> None:
        self.t0 = time.monotonic()
        self.budget = budget
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def ok(self, what: str, need: float = 5.0) -> bool:
        if self.left() < need:
            self.skipped.append(what)
            return False
        return True


def part_a(run: Run, repeats: int, have_triton: bool) -> dict[str, Any]:
    import torch

    import krex_lab

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    out: dict[str, Any] = {}
    for cls, n in MATMUL_N.items():
        if not run.ok(f"A matmul {cls}", 15 + 2 * TARGET[cls]):
            continue
        a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
        c = torch.empty(n, n, device="cuda")
        fn = functools.partial(torch.mm, a, b, out=c)
        fn()
        torch.cuda.synchronize()
        ms = [krex_lab.bench(fn, name=f"torch.mm {n}") for _ in range(repeats)]
        medians = [m.median for m in ms]
        of_medians = summarize(medians)
        entry: dict[str, Any] = {
            "n": n,
            "bench_medians_ms": medians,
            "bench_p95_ms": [m.p95 for m in ms],
            "bench_noise": [m.rel_stdev for m in ms],
            "bench_samples": [m.n for m in ms],
            "bench_discarded": [m.discarded for m in ms],
            "bench_converged": [m.stop_reason for m in ms],
            "bench_redone_batches": [m.redone_batches for m in ms],
            "bench_batch": ms[0].batch,
            "bench_median_ms": of_medians.median,
            "spread_of_medians_pct": round(100 * (of_medians.max - of_medians.min) / of_medians.median, 3),
            "clocks": ms[-1].clocks,
            "region": {k: ms[-1].region.get(k) for k in ("gpu", "frozen", "cores")} if ms[-1].region else None,
            "warnings": sorted({w for m in ms for w in m.warnings}),
        }
        if have_triton:
            runs = [do_bench_times(fn, of_medians.median) for _ in range(3)]
            db = [summarize(r).median for r in runs]
            entry.update(
                do_bench_medians_ms=db, do_bench_samples=[len(r) for r in runs], do_bench_median_ms=summarize(db).median
            )
            entry["agreement_pct"] = pct(entry["bench_median_ms"], entry["do_bench_median_ms"])
            entry["within_2pct"] = abs(entry["agreement_pct"]) <= 100 * AGREEMENT
        out[cls] = entry
        del a, b, c, fn
        torch.cuda.empty_cache()
    return out


def free_numba() -> None:
    gc.collect()
    try:
        from numba import cuda

        from krex_lab.devsync import numba_free_pending

        numba_free_pending(cuda.current_context())
    except Exception:
        pass


def part_b(run: Run) -> dict[str, Any]:
    from krex_lab import kernels

    out: dict[str, Any] = {}
    for name, spec in kernels.REGISTRY.items():
        for cand in spec.candidates:
            if not run.ok(f"B check {name}/{cand}", 10):
                continue
            entry: dict[str, Any] = {}
            for label, size in (("tiny", spec.test_sizes[0]), ("0.05ms", "0.05ms")):
                try:
                    r = spec.check(cand, size)
                    entry[label] = {
                        "ok": r.ok,
                        "max_abs_error": r.outputs[0].max_abs_error,
                        "max_rel_error": r.outputs[0].max_rel_error,
                    }
                except Exception as exc:  # CheckFailed, or the candidate itself failed
                    entry[label] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            out[f"{name}/{cand}"] = entry
            free_numba()
    return out


def part_c(run: Run, have_triton: bool) -> dict[str, Any]:
    import krex_lab
    from krex_lab import kernels

    out: dict[str, Any] = {}
    for name, spec in kernels.REGISTRY.items():
        for preset in kernels.PRESETS:
            if not run.ok(f"C {name} {preset}", 20 + 3 * TARGET[preset]):
                continue
            ins, outs = spec.device_inputs(preset)
            row: dict[str, Any] = {"size": spec.size(preset), "estimate_ms": round(spec.estimate_ms(preset), 5)}
            for cand, fn in spec.candidates.items():
                try:
                    m = krex_lab.bench(fn, *ins, *outs, name=f"{name}/{cand} {preset}", timeout=6.0)
                except Exception as exc:
                    row[cand] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                    print(f"C {name}/{cand} {preset}: {row[cand]['error']}", flush=True)
                    continue
                r: dict[str, Any] = {
                    **m.row(),
                    "stop_reason": m.stop_reason,
                    "batch": m.batch,
                    "vs_estimate": round(m.median / row["estimate_ms"], 3),
                    "bandwidth_gbs": round(spec.work(**spec.size(preset)).bytes / (m.median * 1e6), 1),
                }
                if have_triton and cand == "optimised" and TARGET[preset] >= 0.1:
                    db = summarize(do_bench_times(functools.partial(fn, *ins, *outs), m.median)).median
                    r.update(
                        do_bench_median_ms=db,
                        agreement_pct=pct(m.median, db),
                        within_2pct=abs(pct(m.median, db)) <= 100 * AGREEMENT,
                    )
                row[cand] = r
            out.setdefault(name, {})[preset] = row
            del ins, outs
            free_numba()
    return out


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"A. torch fp32 matmul, alone: krex_lab.bench (x{doc['repeats']}) vs triton do_bench (x3), medians in ms",
        f"{'class':7s} {'n':>5s} {'bench':>10s} {'spread':>8s} {'do_bench':>10s} {'agree':>8s}  noise  kept/disc",
    ]
    for cls, e in doc["torch_matmul"].items():
        lines.append(
            f"{cls:7s} {e['n']:5d} {e['bench_median_ms']:10.5f} {e['spread_of_medians_pct']:7.3f}% "
            f"{e.get('do_bench_median_ms', float('nan')):10.5f} {e.get('agreement_pct', float('nan')):7.3f}%  "
            f"{summarize(e['bench_noise']).median:.2%}  {sum(e['bench_samples'])}/{sum(e['bench_discarded'])}"
        )
    bad = [k for k, v in doc["checks"].items() if not all(x.get("ok") for x in v.values())]
    lines.append(f"B. checks on the GPU: {len(doc['checks'])} candidates, failing: {bad or 'none'}")
    lines.append("C. krex_lab.kernels presets: median ms (estimate) naive | optimised [do_bench agreement]")
    for name, presets in doc["kernels"].items():
        for preset, row in presets.items():
            opt, nai = row.get("optimised", {}), row.get("naive", {})
            if "error" in opt or "error" in nai:
                lines.append(f"  {name:10s} {preset:6s} ERROR {opt.get('error') or nai.get('error')}"[:200])
                continue
            agree = f" [{opt['agreement_pct']:+.2f}%]" if "agreement_pct" in opt else ""
            lines.append(
                f"  {name:10s} {preset:6s} ({row['estimate_ms']:.4f})  {nai.get('median_ms', 0):10.4f} | "
                f"{opt.get('median_ms', 0):10.4f}{agree}  {opt.get('bandwidth_gbs', 0):.0f} GB/s"
            )
    if doc.get("errors"):
        lines.append(f"parts that failed: {sorted(doc['errors'])}")
    if doc["skipped"]:
        lines.append(f"skipped (budget): {doc['skipped']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, default=170.0, help="seconds for all measurements (default 170)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        print(
            "bench_vs_do_bench: no CUDA GPU here (torch with CUDA is needed); nothing measured. "
            "Run it on the GPU machine: bash benchmarks/device_run.sh bench",
            file=sys.stderr,
        )
        return 2
    try:
        import triton.testing  # do_bench itself is imported where it is used

        have_triton = True
    except ImportError:
        have_triton = False
    tmp = Path(tempfile.mkdtemp(prefix="krex-bench-"))
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(tmp),
        "KREX_ENDPOINT": f"ipc://{tmp}/arbiter.sock",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    os.environ.update({k: env[k] for k in ("KREX_RUNTIME_DIR", "KREX_ENDPOINT")})
    os.environ.pop("KREX_GPU", None)
    arbiter, hello = start_arbiter(env, "nvidia", tmp / "arbiter.log")
    run = Run(args.budget)
    doc: dict[str, Any] = {
        "benchmark": "bench_vs_do_bench",
        "machine": machine(),
        "backend": hello.get("backend"),
        "repeats": args.repeats,
        "triton": have_triton,
        "target_agreement_pct": 100 * AGREEMENT,
    }
    try:
        import krex_lab

        session = krex_lab.attach(gpu=0, name="bench-vs-do-bench")
        doc["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda}
        if have_triton:
            import triton

            doc["versions"]["triton"] = triton.__version__
        import numba

        doc["versions"]["numba"] = numba.__version__
        doc["device"] = torch.cuda.get_device_name(0)
        doc["session"] = session.id
        for key, part in (
            ("torch_matmul", lambda: part_a(run, args.repeats, have_triton)),
            ("checks", lambda: part_b(run)),
            ("kernels", lambda: part_c(run, have_triton)),
        ):
            try:
                doc[key] = part()
            except Exception:  # keep what the other parts measure
                doc[key] = {}
                doc.setdefault("errors", {})[key] = traceback.format_exc()[-4000:]
                print(f"part {key} failed:\n{doc['errors'][key]}", flush=True)
    finally:
        stop_arbiter(arbiter)
    doc["skipped"] = run.skipped
    doc["wall_s"] = round(time.monotonic() - run.t0, 1)
    agreements = [
        e["agreement_pct"] for cls, e in doc["torch_matmul"].items() if TARGET[cls] >= 0.1 and "agreement_pct" in e
    ]
    agreements += [
        r["optimised"]["agreement_pct"]
        for presets in doc["kernels"].values()
        for r in presets.values()
        if "agreement_pct" in r.get("optimised", {})
    ]
    doc["summary"] = {
        "agreement_pct_range": [min(agreements), max(agreements)] if agreements else None,
        "all_within_2pct": all(abs(a) <= 100 * AGREEMENT for a in agreements) if agreements else None,
        "spread_of_medians_pct": {c: e["spread_of_medians_pct"] for c, e in doc["torch_matmul"].items()},
        "checks_failing": [k for k, v in doc["checks"].items() if not all(x.get("ok") for x in v.values())],
    }
    print(table(doc))
    print("summary:", doc["summary"])
    write_result("bench_vs_do_bench", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
