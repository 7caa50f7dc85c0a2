"""KernelBench's own way of evaluating a candidate, as one process does it (``eval_batch.py``'s baseline).

    python eval_kb.py compile CANDIDATE                 # import it on the CPU: load_inline builds
    python eval_kb.py eval REFERENCE CANDIDATE [--device cuda|cpu] [--trials 5] [--perf-trials 100]
    python eval_kb.py time-refs REFERENCE ... [--device cuda|cpu] [--perf-trials 100]

Written here after KernelBench's published method, not copied: ``compile`` imports the candidate
with ``TORCH_EXTENSIONS_DIR`` set by the caller (``load_inline`` builds there; Triton compiles at
its first launch, in ``eval``); ``eval`` builds both models from ``get_init_inputs()``, checks the
candidate over ``--trials`` seeded trials (fresh ``get_inputs()`` each, moved to the device;
shapes equal and ``allclose`` within ``--tol``), then, if correct, times ``--perf-trials`` forwards
after 3 warm-up calls, one CUDA event pair around each forward and a synchronisation after each
(on the CPU: the host clock). ``time-refs`` times each reference the same way, one after the other
in this one process (as KernelBench's baseline timing does). Times are microseconds, as
``krex_lab.evaluate`` gives them. Each result is one ``EVALKB <json>`` line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common

#: what krex_lab.evaluate uses for float32 outputs, so that both ways judge alike
DEFAULT_TOL = 1e-4


def emit(record: dict[str, Any]) -> None:
    print("EVALKB " + json.dumps(record), flush=True)


def load_module(path: str, name: str) -> Any:
    """Import a problem file as a module of its own (Triton needs a real file for its kernels' source)."""
    from common import load_file

    return load_file(path, name)


def module_name(path: str, role: str) -> str:
    return f"evalkb_{role}_" + "".join(c if c.isalnum() else "_" for c in Path(path).parent.name)


def error_text(exc: BaseException, limit: int = 1500) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2 :]


def seed_all(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def to_device(values: list[Any], device: str) -> list[Any]:
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def time_forward(model: Any, inputs: list[Any], device: str, trials: int) -> list[float]:
    """Microseconds of each of ``trials`` forwards after 3 warm-up calls."""
    import torch

    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        times = []
        for _ in range(trials):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(*inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                model(*inputs)
                times.append((time.perf_counter() - t0) * 1e6)
    return times


def stats(times: list[float]) -> dict[str, Any]:
    return {
        "mean": statistics.fmean(times),
        "std": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min": min(times),
        "max": max(times),
        "num_trials": len(times),
    }


def compile_candidate(candidate: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        load_module(candidate, module_name(candidate, "cand"))
        out: dict[str, Any] = {"compiled": True}
    except Exception as exc:
        out = {"compiled": False, "error": error_text(exc)}
    out["compile_s"] = time.perf_counter() - t0
    return out


def evaluate(reference: str, candidate: str, device: str, trials: int, perf_trials: int, tol: float) -> dict[str, Any]:
    import torch

    rec: dict[str, Any] = {"compiled": False, "correctness": False, "metadata": {}, "runtime": -1.0}
    phases: dict[str, float] = {}
    rec["phases"] = phases
    t0 = time.perf_counter()
    ref = load_module(reference, module_name(reference, "ref"))
    seed_all(42)
    init = to_device(list(ref.get_init_inputs()), device)
    with torch.no_grad():
        seed_all(42)
        model = ref.Model(*init).to(device)
    try:
        cand = load_module(candidate, module_name(candidate, "cand"))
        seed_all(42)
        with torch.no_grad():
            new = cand.ModelNew(*init).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:
        rec["metadata"]["compilation_error"] = error_text(exc)
        phases["load"] = time.perf_counter() - t0
        return rec
    rec["compiled"] = True
    phases["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.manual_seed(42)
    seeds = [int(torch.randint(0, 2**31 - 1, (1,)).item()) for _ in range(trials)]
    passed = 0
    try:
        with torch.no_grad():
            for s in seeds:
                seed_all(s)
                inputs = to_device(list(ref.get_inputs()), device)
                want = model(*inputs)
                got = new(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
                if got.shape != want.shape:
                    rec["metadata"]["correctness_issue"] = (
                        f"output shape {tuple(got.shape)}, expected {tuple(want.shape)}"
                    )
                    break
                if not torch.allclose(got, want, atol=tol, rtol=tol):
                    rec["metadata"]["correctness_issue"] = "output mismatch"
                    rec["metadata"].setdefault("max_difference", []).append(float((got - want).abs().max()))
                    continue
                passed += 1
    except Exception as exc:
        rec["metadata"]["runtime_error"] = error_text(exc)
    phases["check"] = time.perf_counter() - t0
    rec["metadata"]["correctness_trials"] = f"({passed} / {trials})"
    rec["correctness"] = passed == trials
    if rec["correctness"] and perf_trials > 0:
        t0 = time.perf_counter()
        seed_all(42)
        inputs = to_device(list(ref.get_inputs()), device)
        times = time_forward(new, inputs, device, perf_trials)
        rec["runtime_stats"] = stats(times)
        rec["runtime"] = rec["runtime_stats"]["mean"]
        phases["time"] = time.perf_counter() - t0
    return rec


def time_reference(reference: str, device: str, perf_trials: int) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    try:
        ref = load_module(reference, module_name(reference, "ref"))
        seed_all(42)
        init = to_device(list(ref.get_init_inputs()), device)
        with torch.no_grad():
            model = ref.Model(*init).to(device)
        inputs = to_device(list(ref.get_inputs()), device)
        times = time_forward(model, inputs, device, perf_trials)
        out: dict[str, Any] = {"ref_runtime_stats": stats(times)}
        out["ref_runtime"] = out["ref_runtime_stats"]["mean"]
        del model, inputs
    except Exception as exc:
        out = {"ref_runtime": -1.0, "error": error_text(exc)}
    if device == "cuda":
        torch.cuda.empty_cache()
    out["wall_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["compile", "eval", "time-refs"])
    p.add_argument("files", nargs="+")
    p.add_argument("--device", default="cuda")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--perf-trials", type=int, default=100)
    p.add_argument("--tol", type=float, default=DEFAULT_TOL)
    args = p.parse_args(argv)
    started = time.time()
    if args.mode == "compile":
        emit({"candidate": args.files[0], **compile_candidate(args.files[0])})
    elif args.mode == "eval":
        if len(args.files) != 2:
            raise SystemExit("eval takes REFERENCE CANDIDATE")
        ref, cand = args.files
        try:
            rec = evaluate(ref, cand, args.device, args.trials, args.perf_trials, args.tol)
        except Exception as exc:  # the reference or the harness failed, not the candidate
            rec = {"compiled": False, "correctness": False, "runtime": -1.0, "error": error_text(exc)}
            rec["traceback"] = traceback.format_exc()[-2000:]
        emit({"reference": ref, "candidate": cand, "pid": os.getpid(), "started": started, **rec})
    else:
        for ref in args.files:
            emit({"reference": ref, **time_reference(ref, args.device, args.perf_trials)})


if __name__ == "__main__":
    main()
