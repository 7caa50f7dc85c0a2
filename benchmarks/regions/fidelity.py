"""Timing fidelity: how much do kernel timings move under contention, with and without KREX?

Run from the repository root on a machine with an NVIDIA GPU and torch::

    python benchmarks/regions/fidelity.py [--quick]

Victim kernels: fp32 torch matmuls, sizes calibrated at start to land near 0.05, 0.1, 1 and
10 ms. Conditions, in order: ``alone``; ``contended`` (3 processes looping 4096^2 matmuls on
the same GPU + one busy loop per CPU core that is *not* a KREX session, so no region freezes
it: only the shield keeps it off the reserved core; ``--cpu-hogs-attach`` makes them
sessions); ``krex`` (the same contention, the victim inside
``krex_lab.exclusive(gpu=0)``); ``alone_after`` (hogs gone, to see drift). The script starts
its own arbiter (``python -m krex_lab.cli arbiter``) on a private endpoint; every GPU hog calls
``krex_lab.attach(gpu=0)`` so that it is a registered session the arbiter can freeze.

Timing method (shared/FACTS.md: event pairs around single launches move 5-10% for 0.07 ms
kernels because host launch latency sits inside the interval). ``launch`` and ``graph`` keep the
host out with ``krex_lab.bench``'s own ``HeldSampler`` (no L2 flush): before each batch a spin
kernel (``torch.cuda._sleep``) holds the stream, and a batch counts only if the GPU had reached
none of its start events when that sample's end event was enqueued (an event query per sample;
otherwise the hold grows and the batch is redone):

* ``launch``: one event pair per kernel launch, so every sample is one kernel;
* ``plain``: as a user times a kernel -- an event pair around one launch, synchronised, no held
  stream and no graph, so host launch latency and CPU time stolen from the launching thread
  count (what the shield of a region's reserved cores protects);
* ``graph``: a CUDA graph of K launches (K so that one replay runs >= 2 ms), one event pair
  per replay, per-kernel time = replay time / K.

Output: per class, condition and method ``median_ms``, ``p95_ms``, ``p95_inflation_pct``
(vs ``alone``) and ``median_inflation_pct``, with machine info, in
``benchmarks/out/fidelity-<date>[-quick].json`` and ``$OUT/`` when OUT is set.
The processes (victim, GPU hog, CPU hog) live in fidelity_roles.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for _p in (str(REPO), str(HERE)):  # krex_lab, and the roles module beside this file
    if _p not in sys.path:
        sys.path.insert(0, _p)

from fidelity_roles import CLASSES, MSG  # noqa: E402

CONDITIONS = ("alone", "contended", "krex", "alone_after")


# ---------------------------------------------------------------------------------------------
# orchestrator (no CUDA context of its own, so the arbiter never has to drain it)
# ---------------------------------------------------------------------------------------------


class Child:
    """A role process with a line reader, so that reads can time out."""

    def __init__(self, role: str, env: dict[str, str], quick: bool = False, argv: list[str] | None = None) -> None:
        if argv is None:
            argv = [sys.executable, str(HERE / "fidelity_roles.py"), role] + (["--quick"] if quick else [])
        self.role = role
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, timeout: float, prefix: str = "") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.role}: no answer in {timeout:.0f} s") from None
            if line is None:
                raise RuntimeError(f"{self.role} exited (rc {self.proc.wait()})")
            if line.startswith(prefix):
                try:
                    return dict(json.loads(line[len(prefix) :]))
                except ValueError:
                    continue

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def call(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(cmd)
        return self.read(timeout, MSG)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a frozen process must run to die
            self.proc.kill()
        self.proc.wait()


def gpu_info(index: int = 0) -> dict[str, Any] | None:
    """NVML's view of GPU ``index``, or None without a usable NVIDIA GPU (or without that one)."""
    try:
        from krex_lab.gpu.nvml import PynvmlApi, decode_throttle_reasons

        nvml = PynvmlApi()
    except Exception as exc:
        print(f"fidelity: NVML: {exc}", file=sys.stderr)
        return None
    try:
        if nvml.device_count() <= index:
            return None
        sm, mem = nvml.clocks(index)
        mask = nvml.clock_event_reasons(index)
        return {
            "name": nvml.name(index),
            "uuid": nvml.uuid(index),
            "driver": nvml.driver_version(),
            "gpus": nvml.device_count(),
            "sm_clock_mhz": sm,
            "mem_clock_mhz": mem,
            "utilization": nvml.utilization(index),
            "memory_used": nvml.memory(index)[1],
            "throttle_reasons": decode_throttle_reasons(mask) if mask is not None else [],
        }
    except Exception as exc:
        print(f"fidelity: NVML: {exc}", file=sys.stderr)
        return None
    finally:
        nvml.shutdown()


def stats(samples: list[float]) -> dict[str, Any]:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]  # nearest-rank percentile
    return {"median_ms": s[len(s) // 2], "p95_ms": p95, "min_ms": s[0], "max_ms": s[-1], "samples": len(s)}


def start_arbiter(
    env: dict[str, str], backend: str, log_path: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], Any]:
    from krex_lab import client

    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", backend, *extra],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            return proc, client.hello(env["KREX_ENDPOINT"], timeout=1.0)
        except Exception as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_arbiter(proc)
                raise RuntimeError(f"the arbiter did not come up ({exc!r}); see {log_path}") from exc
            time.sleep(0.25)


def stop_arbiter(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # Helpers it started (its guardian) share the session we created: end that group by id.
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


def _condition(victim: Child, cond: str) -> dict[str, Any]:
    print(f"measuring: {cond} ...", flush=True)
    entry: dict[str, Any] = {"gpu_before": gpu_info()}
    reply = victim.call({"cmd": "measure", "region": cond == "krex"}, 1200)
    entry["gpu_after"] = gpu_info()
    if "error" in reply:
        print(f"  {cond} failed: {reply['error']}", file=sys.stderr)
        return {**entry, "error": reply["error"]}
    entry.update({k: v for k, v in reply.items() if k != "results"})
    entry["results"] = {
        cls: {
            m: {**stats(r["samples_ms"]), **{k: v for k, v in r.items() if k != "samples_ms"}} for m, r in per.items()
        }
        for cls, per in reply["results"].items()
    }
    entry["_samples"] = {c: {m: r["samples_ms"] for m, r in p.items()} for c, p in reply["results"].items()}
    return entry


def run(args: argparse.Namespace) -> int:
    gpu = gpu_info()
    if gpu is None:
        print("fidelity.py needs an NVIDIA GPU (NVML found none here); nothing measured.", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="krex-fidelity-"))
    env = dict(
        os.environ,
        KREX_RUNTIME_DIR=str(tmp),
        KREX_ENDPOINT=f"ipc://{tmp}/arbiter.sock",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        PYTHONUNBUFFERED="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("KREX_GPU", None)
    if args.skip_krex:
        env.pop("KREX_ENDPOINT")
    started = dt.datetime.now(dt.timezone.utc)
    doc: dict[str, Any] = {
        "benchmark": "fidelity",
        "quick": args.quick,
        "date": started.isoformat(timespec="seconds"),
        "machine": {
            "hostname": socket.gethostname(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "gpu": gpu,
        },
        "method": {
            "launch": "one CUDA event pair per kernel launch, krex_lab.bench's HeldSampler (no L2 flush): "
            "a spin kernel (torch.cuda._sleep) holds the stream while the batch is enqueued, and the "
            "batch is redone if the GPU reached a start event before its end event was enqueued, so "
            "host launch latency is outside every interval",
            "plain": "one CUDA event pair around one launch, synchronised; nothing held (host time counts)",
            "graph": "CUDA graph of K launches (replay >= 2 ms), one event pair per replay, held stream as "
            "above; per-kernel time = replay time / K",
            "statistics": "median and nearest-rank p95 over samples; inflation = condition / alone - 1",
        },
        "conditions": {},
    }
    arbiter: subprocess.Popen[bytes] | None = None
    victim: Child | None = None
    hogs: list[Child] = []
    try:
        if not args.skip_krex:
            arbiter, hello = start_arbiter(env, args.arbiter_backend, tmp / "arbiter.log")
            doc["arbiter"] = {"backend": args.arbiter_backend, "hello": hello}
        victim = Child("victim", env, args.quick)
        ready = victim.read(180, MSG)
        if "error" in ready:
            print(f"fidelity: {ready['error']}", file=sys.stderr)
            return 2
        doc["machine"].update(
            {k: ready.get(k) for k in ("torch", "cuda", "device", "has_sleep", "sleep_cycles_per_ms")}
        )
        print(f"victim ready on {ready['device']} (torch {ready['torch']}); calibrating sizes ...", flush=True)
        doc["classes"] = victim.call({"cmd": "calibrate"}, 600)["classes"]
        for cond in CONDITIONS:
            if cond == "krex" and args.skip_krex:
                continue
            if cond == "contended":
                hogs = [Child("gpu-hog", env) for _ in range(3)]
                cpu_env = {**env, "KREX_CPU_HOG_ATTACH": "1" if args.cpu_hogs_attach else "0"}
                hogs += [Child("cpu-hog", cpu_env) for _ in range(os.cpu_count() or 1)]
                hog_ready = [h.read(180) for h in hogs]
                doc["contention"] = {
                    "gpu_hogs": 3,
                    "cpu_hogs": len(hogs) - 3,
                    "attached": sum(1 for r in hog_ready if r.get("session")),
                    "cpu_hogs_attached": bool(args.cpu_hogs_attach),
                }
                time.sleep(2.0)  # let time-slicing and clocks settle
            if cond == "alone_after":
                for h in hogs:
                    h.kill()
                hogs = []
                time.sleep(3.0)
            doc["conditions"][cond] = _condition(victim, cond)
    except Exception as exc:  # keep what was measured: device time is scarce
        doc["error"] = repr(exc)
        print(f"fidelity: stopped early: {exc!r}", file=sys.stderr)
    finally:
        for h in hogs:
            h.kill()
        if victim is not None:
            victim.kill()
        if arbiter is not None:
            stop_arbiter(arbiter)
            doc.setdefault("arbiter", {})["log_tail"] = (tmp / "arbiter.log").read_text(errors="replace")[-4000:]
        shutil.rmtree(tmp, ignore_errors=True)
    samples = {c: e.pop("_samples", None) for c, e in doc["conditions"].items()}
    if args.keep_samples:
        doc["samples_ms"] = samples
    doc["summary"] = summarize(doc)
    write(doc, args.quick, started)
    print_table(doc)
    failed = "error" in doc or any("error" in c for c in doc["conditions"].values())
    return 1 if failed else 0


def summarize(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (class, condition, method) with inflation vs ``alone``; also set in place."""
    rows: list[dict[str, Any]] = []
    base = doc["conditions"].get("alone", {}).get("results", {})
    for cond, entry in doc["conditions"].items():
        for cls, per in entry.get("results", {}).items():
            for method, st in per.items():
                row = {
                    "class": cls,
                    "condition": cond,
                    "method": method,
                    "median_ms": round(st["median_ms"], 6),
                    "p95_ms": round(st["p95_ms"], 6),
                    "samples": st["samples"],
                }
                ref = base.get(cls, {}).get(method)
                if ref:
                    row["p95_inflation_pct"] = st["p95_inflation_pct"] = round(
                        (st["p95_ms"] / ref["p95_ms"] - 1) * 100, 3
                    )
                    row["median_inflation_pct"] = st["median_inflation_pct"] = round(
                        (st["median_ms"] / ref["median_ms"] - 1) * 100, 3
                    )
                rows.append(row)
    return rows


def write(doc: dict[str, Any], quick: bool, started: dt.datetime) -> None:
    name = f"fidelity-{started.strftime('%Y-%m-%d')}{'-quick' if quick else ''}.json"
    text = json.dumps(doc, indent=1, default=str)
    targets = [REPO / "benchmarks" / "results" / name]
    if os.environ.get("OUT"):
        targets.append(Path(os.environ["OUT"]) / name)
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")


def print_table(doc: dict[str, Any]) -> None:
    conds = [c for c in CONDITIONS if c in doc["conditions"]]
    rows = {(r["class"], r["method"], r["condition"]): r for r in doc["summary"]}
    head = f"{'class':>7} {'n':>5} {'method':>6} | " + " | ".join(f"{c:^28}" for c in conds)
    print("\nmedian / p95 per kernel, ms (p95 inflation vs alone)")
    print(head)
    print("-" * len(head))
    for cls, _ in CLASSES:
        n = doc.get("classes", {}).get(cls, {}).get("n", "")
        for method in ("plain", "launch", "graph"):
            cells = []
            for c in conds:
                r = rows.get((cls, method, c))
                if r is None:
                    cells.append(f"{'-':^28}")
                    continue
                infl = f"({r['p95_inflation_pct']:+.2f}%)" if c != "alone" and "p95_inflation_pct" in r else ""
                cells.append(f"{r['median_ms']:.4f}/{r['p95_ms']:.4f} {infl:>10}".rjust(28))
            print(f"{cls:>7} {n!s:>5} {method:>6} | " + " | ".join(cells))
    krex = doc["conditions"].get("krex", {})
    rep = krex.get("grant_report")
    if rep:
        print(
            f"\nKREX region: granted {krex.get('acquire_wall_s', 0) * 1e3:.1f} ms after the request "
            f"(arbiter acquire {rep.get('acquire_s', 0) * 1e3:.1f} ms); locked {len(rep.get('locked', []))}, "
            f"drained {len(rep.get('drained', []))}, frozen {len(rep.get('frozen', []))}, "
            f"cores {rep.get('cores')}, not drained: {rep.get('not_drained') or 'none'}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="KREX timing-fidelity benchmark (needs an NVIDIA GPU and torch)")
    p.add_argument("--quick", action="store_true", help="about a fifth of the samples")
    p.add_argument("--skip-krex", action="store_true", help="no arbiter, no region: the other conditions only")
    p.add_argument("--arbiter-backend", default="nvidia", choices=("auto", "nvidia", "amd", "fake"))
    p.add_argument("--keep-samples", action="store_true", help="store every sample in the JSON")
    p.add_argument(
        "--cpu-hogs-attach",
        action="store_true",
        help="the CPU busy loops register as KREX sessions (frozen in regions)",
    )
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
