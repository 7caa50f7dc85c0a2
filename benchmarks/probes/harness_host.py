"""Where a timed call's host time goes, by what was done to the process that makes it.

    python benchmarks/probes/harness_host.py [--rounds 5] [--calls 100] [--variants plain,seccomp,...]

The judge's outside figure is a round's wall time less a calibration twin's, and it can only
resolve a small kernel when a call's host cost is the same in the candidate's process and in the
twin. On the GPU it was not: the same harness code (the L2 flush and the start event) took 3-4
times longer a call in a ``load_inline`` candidate's process. This probe runs the harness's own
timed loop (:meth:`krex_lab.evaluate.candidate.process` ``_round``'s body: flush, event pair,
the call, the output copied into a buffer, synchronise) in fresh processes, each with one more of
what a candidate's process gets than the last, and prints each part's host time a call with the
thread's CPU time and its involuntary switches:

* ``plain``: torch and CUDA only;
* ``seccomp``: :func:`~krex_lab.evaluate.candidate.sandbox.lock_process` first (no capabilities,
  the process filter), as every spare;
* ``cgroup``: in a cgroup of its own with a host-memory cap
  (:func:`~krex_lab.evaluate.judge.account.place`), as a candidate;
* ``landlock``: :func:`~krex_lab.evaluate.candidate.sandbox.confine_files` on a build directory
  (the prebuilt extension copied into it first: ``load_inline`` takes a lock file beside it);
* ``rlimit``: the candidate's resource limits (``RLIMIT_DATA`` its data plus 16 GiB, as
  ``memory_limit_mb``'s default; ``RLIMIT_FSIZE``) and its output going to a file;
* ``ext``: the call is a ``load_inline`` extension's (built once, before; else a no-op that
  returns its input, as the twin's);
* ``build``: the extension built in this process, as a candidate builds it (implies ``ext``);
* ``onecore``: pinned to one core;
* ``held``: before each timed round the parent holds it as the judge holds a candidate while its
  twin is calibrated (the driver's checkpoint lock, SIGSTOP, half a second, then SIGCONT and the
  unlock), and locks and unlocks it once more as a round's end is drained.

Variants join with ``+``. Needs an NVIDIA GPU (CUDA torch, a compiler for ``load_inline``); writes
``benchmarks/out/harness_host-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, write_result

#: the tests' load_inline candidate (tests/gpu/test_evaluate_gpu.py), whose harness was slow
KERNEL = ("krex_probe_scaled_add", "if (i < n) out[i] = alpha * a[i] + b[i];")
DEFAULT = (
    "plain+ext,build,rlimit+ext,landlock+ext,seccomp+cgroup+landlock+ext,"
    "seccomp+cgroup+landlock+rlimit+build,seccomp+cgroup+landlock+rlimit,held+ext,held"
)


def load(ext_dir: str) -> Any:
    """The tests' load_inline candidate's model, its extension built in (or found in) ``ext_dir``."""
    sys.path.insert(0, str(REPO))  # tests/
    from tests.gpu.test_evaluate_gpu import cuda_candidate

    os.environ["TORCH_EXTENSIONS_DIR"] = ext_dir
    namespace: dict[str, Any] = {}
    exec(compile(cuda_candidate(*KERNEL), "candidate.py", "exec"), namespace)
    return namespace["ModelNew"](0.5)


def child(variant: str, ext_dir: str, rounds: int, calls: int) -> dict[str, Any]:
    steps = set(variant.split("+"))
    sys.stdin.readline()  # placed in its cgroup by the parent first, where asked
    if "onecore" in steps:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    if "seccomp" in steps:
        from krex_lab.evaluate.candidate.sandbox import lock_process

        lock_process()
    import resource
    import time

    import torch

    from krex_lab.evaluate.candidate.process import L2_FLUSH_SHAPE

    torch.zeros(1, device="cuda")
    build_dir = tempfile.mkdtemp(prefix="krex-probe-build-")
    if "build" in steps:  # a fresh directory: the build runs here
        ext_dir = os.path.join(build_dir, "torch_extensions")
    elif "landlock" in steps:  # a copy of the prebuilt one where the process may write its lock
        import shutil

        ext_dir = shutil.copytree(ext_dir, os.path.join(build_dir, "torch_extensions"))
    if "rlimit" in steps:
        fd = os.open(os.path.join(build_dir, "output"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))
        with open("/proc/self/status") as f:
            data = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmData:")), 0)
        resource.setrlimit(resource.RLIMIT_DATA, (data + (16 << 30), data + (16 << 30)))
    if "landlock" in steps:
        from krex_lab.evaluate.candidate.sandbox import confine_files

        confine_files(build_dir, os.path.join(build_dir, "tmp"), [str(REPO)])
    if "ext" in steps or "build" in steps:
        model = load(ext_dir)

        def fn(a: Any, b: Any) -> Any:
            return model(a, b)
    else:

        def fn(a: Any, b: Any) -> Any:
            return a

    sets = [(torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")) for _ in range(calls)]
    outs = [torch.empty(4096, device="cuda") for _ in range(calls)]
    per_round = []
    for r in range(rounds + 1):  # the first round warms up
        if "held" in steps and r > 0:
            print("HOLD", flush=True)
            sys.stdin.readline()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush = torch.empty(L2_FLUSH_SHAPE, dtype=torch.int64, device="cuda")
        parts = dict.fromkeys(("launch", "call", "deliver", "sync"), 0.0)
        events = 0.0
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        w0 = time.perf_counter()
        for k in range(calls):
            t0 = time.perf_counter()
            flush.fill_(42)
            start.record()
            t1 = time.perf_counter()
            out = fn(*sets[k])
            t2 = time.perf_counter()
            end.record()
            outs[k].copy_(out)
            del out
            t3 = time.perf_counter()
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            for part, took in (("launch", t1 - t0), ("call", t2 - t1), ("deliver", t3 - t2), ("sync", t4 - t3)):
                parts[part] += took * 1e6
            events += start.elapsed_time(end) * 1e3
        wall = time.perf_counter() - w0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        del flush
        per_round.append(
            {
                **{k: round(v / calls, 2) for k, v in parts.items()},
                "wall": round(wall / calls * 1e6, 2),
                "events": round(events / calls, 2),
                "thread_cpu": round((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / calls * 1e6, 2),
                "involuntary": round((r1.ru_nivcsw - r0.ru_nivcsw) / calls, 3),
                "voluntary": round((r1.ru_nvcsw - r0.ru_nvcsw) / calls, 3),
            }
        )
    rest = per_round[1:]
    best = min(rest, key=lambda r: r["wall"])
    return {"variant": variant, "best": best, "rounds": rest, "cpus": sorted(os.sched_getaffinity(0))}


def hold(pid: int) -> None:
    """The judge's hold of a candidate: its device work drained and locked, the process stopped,
    half a second, then let go in the reverse order; then a round end's lock and unlock."""
    import signal
    import time

    from krex_lab.gpu.cuda_driver import CtypesCudaDriver

    driver = CtypesCudaDriver()
    driver.checkpoint_lock(pid, 5000)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)
    os.kill(pid, signal.SIGCONT)
    driver.checkpoint_unlock(pid)
    driver.checkpoint_lock(pid, 5000)
    driver.checkpoint_unlock(pid)


def run_variant(variant: str, ext_dir: str, rounds: int, calls: int) -> dict[str, Any]:
    code = (
        f"import sys, json; sys.path.insert(0, {str(REPO / 'benchmarks' / 'probes')!r}); import harness_host as h; "
        f"print('RESULT', json.dumps(h.child({variant!r}, {ext_dir!r}, {rounds}, {calls})))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    group = None
    if "cgroup" in variant.split("+"):
        from krex_lab.evaluate.judge.account import place

        group = place(proc.pid, lambda: [proc.pid], memory_limit=4 << 30)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    lines = []
    for line in proc.stdout:  # a round's HOLD: held as the judge holds a candidate, then let go
        lines.append(line)
        if line.strip() == "HOLD":
            hold(proc.pid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
    proc.wait(timeout=600)
    out = "".join(lines)
    if group is not None:
        group.remove()
    found = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if found is None:
        return {"variant": variant, "error": f"exit {proc.returncode}: {out[-500:]}"}
    got: dict[str, Any] = json.loads(found[7:])
    if group is not None:
        got["cgroup"] = f"{group.accounting}; memory {group.memory}"
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--variants", default=DEFAULT)
    args = p.parse_args()
    ext_dir = tempfile.mkdtemp(prefix="krex-probe-ext-")
    load(ext_dir)  # built once, here
    results = []
    for variant in args.variants.split(","):
        got = run_variant(variant, ext_dir, args.rounds, args.calls)
        results.append(got)
        if "error" in got:
            print(f"{variant:40} {got['error']}")
            continue
        b = got["best"]
        print(
            f"{variant:40} wall {b['wall']:7.1f}  launch {b['launch']:6.1f} call {b['call']:6.1f} "
            f"deliver {b['deliver']:6.1f} sync {b['sync']:6.1f}  events {b['events']:5.2f}  "
            f"cpu {b['thread_cpu']:6.1f}  invol {b['involuntary']:.2f} vol {b['voluntary']:.2f}  (us a call)",
            flush=True,
        )
    write_result("harness_host", {"benchmark": "harness_host", "machine": machine(), "results": results})


if __name__ == "__main__":
    main()
