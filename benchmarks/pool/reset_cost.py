"""What putting back a job's changes to loaded modules costs a warm worker, against recycling it.

A worker's reset (``krex_lab.workers.context.reset``) puts back the public names of every module
it had loaded (``ModuleBindings``) and draws fresh seeds for ``random`` and NumPy. This measures,
in a fresh interpreter that imports what a pool preloads (those of ``--preload`` that import
here) the way a worker does:

- ``take``: the snapshot, once per worker after its preload;
- ``restore`` after a job that changed nothing (every job's cost), and after one that rebound
  ``json.dumps`` and seeded ``random`` (what a leaking job costs);
- against the alternative of recycling a worker that a job touched: a fresh interpreter's import
  of the same modules (a lower bound: a real worker also registers and creates its contexts).

    python benchmarks/pool/reset_cost.py [--preload numba.cuda numpy torch cupy] [--reps 300]

Prints the figures and writes ``benchmarks/out/reset_cost-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, percentile, write_result

MEASURE = r"""
import importlib, json, os, sys, time
t0 = time.perf_counter()
loaded = []
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
        loaded.append(name)
    except Exception:
        pass
import_s = time.perf_counter() - t0
from krex_lab.workers.context.reset import ModuleBindings, reseed
reps = int(sys.argv[1])
t0 = time.perf_counter()
bindings = ModuleBindings()
bindings.take(set(sys.modules))
take_s = time.perf_counter() - t0
names = sum(len(saved) for _, saved in bindings.saved.values())
def timed(change):
    out = []
    for _ in range(reps):
        change()
        t = time.perf_counter()
        put_back = bindings.restore()
        reseed()
        out.append(time.perf_counter() - t)
    return out, put_back
def leak():
    import json, random
    json.dumps = None
    random.seed(0)
clean, _ = timed(lambda: None)
dirty, put_back = timed(leak)
print(json.dumps({"loaded": loaded, "import_s": import_s, "modules": len(bindings.saved), "names": names,
                  "take_s": take_s, "clean_s": clean, "dirty_s": dirty, "put_back": put_back}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preload", nargs="*", default=["numba.cuda", "cupy", "torch", "numpy"])
    p.add_argument("--reps", type=int, default=300)
    args = p.parse_args()
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": os.environ.get("NUMBA_ENABLE_CUDASIM", "1")}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(args.reps), *args.preload],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"the measuring interpreter failed:\n{out.stderr}")
    wall = time.perf_counter() - t0
    r = json.loads(out.stdout.strip().splitlines()[-1])
    ms = {
        k: {q: round(percentile(r[k], v) * 1e3, 3) for q, v in (("p50", 0.5), ("p95", 0.95))}
        for k in ("clean_s", "dirty_s")
    }
    result = {
        "machine": machine(),
        "command": " ".join(["python", "benchmarks/pool/reset_cost.py", *sys.argv[1:]]),
        "preloaded": r["loaded"],
        "modules": r["modules"],
        "public_and_private_names": r["names"],
        "take_ms": round(r["take_s"] * 1e3, 3),
        "restore_unchanged_ms": ms["clean_s"],
        "restore_after_a_leak_ms": ms["dirty_s"],
        "put_back": r["put_back"],
        "recycle_import_lower_bound_ms": round(r["import_s"] * 1e3, 1),
        "reps": args.reps,
        "wall_s": round(wall, 1),
    }
    print(
        f"preloaded {', '.join(r['loaded']) or 'nothing'}: {r['modules']} modules, {r['names']} names; "
        f"snapshot {result['take_ms']} ms once per worker; restore p50 {ms['clean_s']['p50']} ms "
        f"(p95 {ms['clean_s']['p95']}) after an ordinary job, {ms['dirty_s']['p50']} ms after one that "
        f"rebinds json.dumps and seeds random ({', '.join(r['put_back'])}); recycling instead: "
        f"at least {result['recycle_import_lower_bound_ms']} ms of imports in a fresh worker"
    )
    write_result("reset_cost", result)


if __name__ == "__main__":
    main()
