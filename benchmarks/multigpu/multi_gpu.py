"""Two GPUs of one node: kernel placement, per-GPU regions, two regions at once.

Run from the repository root on a node with two NVIDIA GPUs (torch; the jupyter stack for part A)::

    python benchmarks/multigpu/multi_gpu.py [--quick] [--parts A,B,C]
    python benchmarks/multigpu/multi_gpu.py --backend fake  # dry run of the orchestration: 2 simulated GPUs, no CUDA

It starts its own arbiter (``python -m krex_lab.cli arbiter --backend nvidia``) on a private runtime
dir, like fidelity.py, and then:

A. Placement. Four ``krex`` kernels (jupyter_client ``AsyncKernelManager(kernel_name="krex")``, the
   kernelspec found through ``JUPYTER_PATH`` = the repo's ``extension/share/jupyter``, no ``KREX_GPU``)
   must land two on each GPU. Read from the arbiter's sessions (role ``kernel``) and from ``KREX_GPU``
   and ``CUDA_VISIBLE_DEVICES`` inside each kernel (the latter must name that GPU's UUID). Where
   krex_lab is not pip-installed (the GPU machine), the provisioner's entry point is registered from a
   temporary dist-info. If the kernels cannot start, four ``krex_lab.attach()`` processes stand in and
   the JSON says ``"method": "attach"``.
B. A region on GPU 0 touches only GPU 0. GPU 0 runs a GPU hog and CPU busy loops (sessions of GPU 0)
   plus the idle GPU-0 victim; GPU 1 runs the GPU-1 victim and a CPU busy loop (sessions of GPU 1). A
   holder process takes back-to-back regions on GPU 0 (``--hold`` s each, 50 ms apart) while the GPU-1
   victim times its kernels. Every GPU-0 region's report (locked, frozen, moved, cores) must have GPU 0's
   processes locked/frozen and GPU 1's in ``moved`` only; the holder samples, inside each region, the CPU
   time every process gains and the cores its threads may use. The GPU-1 victim's figures during the
   regions are compared with its figures alone.
C. Two regions at once. A GPU hog on GPU 1 too and one CPU busy loop per core in all (half of them
   sessions of each GPU). Both victims time their kernels contended (no region), then each inside
   ``exclusive(gpu=i)``: both acquire, both measure, both release, so the hold intervals overlap and
   both measurements lie inside the overlap (checked with timestamps). p95 inflation against alone must
   meet the fidelity targets (<= 1.58% at 1 ms, <= 3.90% at 0.1 ms).
Finally both victims are timed alone again (drift reference).

Timing: the victim of fidelity_roles.py (``Victim``/``HeldTimer``, imported, not copied): fp32 matmuls
sized for ~0.1 and ~1 ms, ``launch`` (one event pair per launch) and ``graph`` (CUDA graph of K launches),
each batch enqueued behind a spin kernel that holds the stream, so host launch latency is outside every
interval. Statistics as fidelity.py: median and nearest-rank p95; inflation = condition / alone - 1.

Output: a table, and JSON via ``common.write_result("multi_gpu", ...)`` (benchmarks/out/ and $OUT).
Exit status: 0 every check passed, 1 a check failed or the run stopped early, 2 not runnable here (fewer
than two GPUs, no torch). Expected runtime on 2 H200s: about 1.5-2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: fidelity's harness and roles, which this benchmark runs on each GPU
REGIONS = HERE.parent / "regions"
# krex_lab; benchmarks/: common; the regions family; this family
for _p in (str(REPO), str(HERE.parent), str(REGIONS), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from common import machine, write_result  # noqa: E402
from fidelity import Child, gpu_info, start_arbiter, stop_arbiter  # noqa: E402
from fidelity_roles import MSG, SAMPLES  # noqa: E402
from multi_gpu_parts import part_b, part_c  # noqa: E402
from multi_gpu_placement import Placement  # noqa: E402
from multi_gpu_report import (  # noqa: E402
    T_START,
    TARGETS,
    TIMED,
    _on_sigterm,
    add_inflation,
    measured,
    print_table,
    say,
)
from multi_gpu_roles import holder_role, victim_role  # noqa: E402


def nvml_gpus() -> tuple[list[dict[str, Any]], str]:
    """NVML's view of every GPU, and why there is none when so."""
    try:
        from krex_lab.gpu.nvml import PynvmlApi

        nvml = PynvmlApi()
    except Exception as exc:
        return [], f"NVML: {exc}"
    try:
        n = nvml.device_count()
    except Exception as exc:
        return [], f"NVML: {exc}"
    finally:
        nvml.shutdown()
    gpus = [g for g in (gpu_info(i) for i in range(n)) if g is not None]
    return [{"index": i, **g} for i, g in enumerate(gpus)], ""


class MultiGpu:
    def __init__(self, args: argparse.Namespace, gpus: list[dict[str, Any]]) -> None:
        self.args = args
        self.simulated = args.backend == "fake"
        self.gpus = gpus
        self.parts = {p.strip().upper() for p in args.parts.split(",") if p.strip()}
        self.tmp = Path(tempfile.mkdtemp(prefix="krex-multigpu-"))
        self.cpus = len(os.sched_getaffinity(0))
        total = args.cpu_hogs if args.cpu_hogs is not None else self.cpus
        self.cpu_hogs = {0: total // 2, 1: total - total // 2}
        self.env = self._env()
        self.children: list[Child] = []
        self.victims: dict[int, Child] = {}
        self.pids: dict[str, int] = {}  # name -> pid of every process that plays a part
        self.hogs: dict[int, list[str]] = {0: [], 1: []}  # names per GPU
        self.arbiter: Any = None
        self.checks: dict[str, bool] = {}
        self.doc: dict[str, Any] = {
            "benchmark": "multi_gpu",
            "simulated": self.simulated,
            "quick": args.quick,
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": {**machine(), "nvml_gpus": gpus},
            "method": {
                "timing": "fidelity_roles.Victim (imported): fp32 torch matmuls sized for ~0.1 and ~1 ms; 'launch' = "
                "one CUDA event pair per launch, 'graph' = CUDA graph of K launches, per-kernel time = "
                "replay / K; every batch is enqueued behind a spin kernel holding the stream, so host launch "
                "latency is outside every interval",
                "statistics": "median and nearest-rank p95 (fidelity.stats); inflation = condition / alone - 1",
                "targets_p95_inflation_pct": TARGETS,
                "samples": {cls: SAMPLES[args.quick][cls] for cls, _ in TIMED},
                "cpu_hogs": self.cpu_hogs,
            },
            "victims": {},
            "alone": {},
            "alone_after": {},
        }
        if self.simulated:
            self.doc["method"]["timing"] = "SIMULATED (fake backend, no CUDA): CPU spins stand in for kernels"

    # -- processes ------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        tmp = self.tmp
        env = dict(
            os.environ,
            KREX_RUNTIME_DIR=str(tmp),
            KREX_ENDPOINT=f"ipc://{tmp}/arbiter.sock",
            PYTHONUNBUFFERED="1",
            JUPYTER_RUNTIME_DIR=str(tmp / "jupyter"),
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
        )
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        share = REPO / "extension" / "share" / "jupyter"
        env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(share), os.environ.get("JUPYTER_PATH", "")) if p)
        for k in ("KREX_GPU", "CUDA_VISIBLE_DEVICES", "KREX_POOL_ENDPOINT", "KREX_EXIT_WITH", "KREX_KERNEL_ID"):
            env.pop(k, None)
        (tmp / "jupyter").mkdir()
        return env

    def gpu_env(self, gpu: int) -> dict[str, str]:
        env = {**self.env, "KREX_GPU": str(gpu)}
        if not self.simulated:
            uuid = str(self.gpus[gpu].get("uuid") or "")
            env["CUDA_VISIBLE_DEVICES"] = uuid if uuid.startswith("GPU-") else str(gpu)
        return env

    def spawn(self, name: str, gpu: int, role: str) -> Child:
        if role in ("victim", "holder"):
            argv = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--role",
                role,
                "--gpu",
                str(gpu),
                "--backend",
                self.args.backend,
            ] + (["--quick"] if self.args.quick else [])
        else:  # fidelity_roles.py's gpu-hog / cpu-hog, registered on $KREX_GPU
            argv = [sys.executable, str(REGIONS / "fidelity_roles.py"), role]
        # Every hog here is a session of its GPU (what part B checks: a region freezes its own
        # GPU's sessions only); fidelity.py's CPU hogs are foreign unless asked to attach.
        child = Child(name, {**self.gpu_env(gpu), "KREX_CPU_HOG_ATTACH": "1"}, argv=argv)
        self.children.append(child)
        self.pids[name] = child.proc.pid
        return child

    def start_hogs(self, gpu: int, gpu_hog: bool, cpu_hogs: int) -> None:
        """A GPU hog (a CPU loop when simulated) and ``cpu_hogs`` busy loops, all sessions of ``gpu``."""
        started: list[Child] = []
        if gpu_hog:
            started.append(self.spawn(f"gpu{gpu}-hog", gpu, "cpu-hog" if self.simulated else "gpu-hog"))
        first = sum(1 for n in self.hogs[gpu] if "cpu-hog" in n)
        started += [self.spawn(f"gpu{gpu}-cpu-hog-{first + k}", gpu, "cpu-hog") for k in range(cpu_hogs)]
        for child in started:
            reply = child.read(180)
            if not reply.get("session"):
                raise RuntimeError(f"{child.role} did not register with the arbiter: {reply}")
            self.hogs[gpu].append(child.role)
        say(
            f"GPU {gpu}: {'a GPU hog and ' if gpu_hog else ''}{cpu_hogs} CPU busy loop(s) running, all sessions "
            f"of GPU {gpu}"
        )

    def stop_hogs(self) -> None:
        names = {n for names in self.hogs.values() for n in names}
        for child in self.children:
            if child.role in names:
                child.kill()
        self.children = [c for c in self.children if c.role not in names]
        self.hogs = {0: [], 1: []}

    def pids_of(self, gpu: int, *, holder: bool = True) -> dict[str, int]:
        names = [*self.hogs[gpu], *([f"victim{gpu}"] if holder and f"victim{gpu}" in self.pids else [])]
        return {n: self.pids[n] for n in names}

    def both(self, cmd: dict[str, Any], timeout: float = 600) -> dict[int, dict[str, Any]]:
        """Send ``cmd`` to both victims at once, then read both answers."""
        for v in self.victims.values():
            v.send(cmd)
        replies = {g: v.read(timeout, MSG) for g, v in self.victims.items()}
        for g, r in replies.items():
            if "error" in r:
                raise RuntimeError(f"victim on GPU {g}: {r['error']}")
        return replies

    def snapshot(self, label: str) -> None:
        """NVML's view of both GPUs (clocks, throttle reasons, memory) at this point of the run."""
        if not self.simulated:
            self.doc.setdefault("nvml", {})[label] = [gpu_info(g) for g in (0, 1)]

    def one(self, gpu: int, cmd: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
        reply = self.victims[gpu].call(cmd, timeout)
        if "error" in reply:
            raise RuntimeError(f"victim on GPU {gpu}: {reply['error']}")
        return reply

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        doc = self.doc
        try:
            extra = ("--fake-gpus", "2") if self.simulated else ()
            self.arbiter, hello = start_arbiter(self.env, self.args.backend, self.tmp / "arbiter.log", extra)
            doc["arbiter"] = {"backend": self.args.backend, "hello": hello}
            say(
                f"arbiter up: backend {hello.get('backend')}, {hello.get('gpus')} GPUs, "
                f"driver lock {'yes' if hello.get('capabilities', {}).get('lock') else 'no'}"
            )
            if hello.get("gpus", 0) < 2:
                raise RuntimeError(f"the arbiter sees {hello.get('gpus')} GPU(s), not 2")
            timing = bool(self.parts & {"B", "C"})
            if timing:  # torch import and CUDA init overlap with part A; they attach only later
                for g in (0, 1):
                    self.victims[g] = self.spawn(f"victim{g}", g, "victim")
            if "A" in self.parts:
                os.environ.update(self.env)  # the provisioner runs in this process
                for k in ("KREX_GPU", "CUDA_VISIBLE_DEVICES"):
                    os.environ.pop(k, None)
                doc["A"] = self.part_a()
            if timing:
                self.prepare_victims()
            if "B" in self.parts:
                doc["B"] = self.part_b()
            if "C" in self.parts:
                doc["C"] = self.part_c()
            if timing:
                self.snapshot("end_of_contention")
                self.stop_hogs()
                time.sleep(2.0)
                for g in (0, 1):
                    say(f"GPU {g} victim: alone again (drift reference) ...")
                    entry = measured(self.one(g, {"cmd": "measure"}))
                    add_inflation(entry, doc["alone"][f"gpu{g}"])
                    doc["alone_after"][f"gpu{g}"] = entry
                self.snapshot("end")
        except Exception as exc:  # keep what was measured: device time is scarce
            doc["error"] = repr(exc)
            print(f"multi_gpu: stopped early: {exc!r}", file=sys.stderr, flush=True)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # cleanup must not be cut short
            for child in reversed(self.children):
                child.kill()
            if self.arbiter is not None:
                stop_arbiter(self.arbiter)
                log = (self.tmp / "arbiter.log").read_text(errors="replace")
                doc.setdefault("arbiter", {})["log_tail"] = log[-4000:]
            shutil.rmtree(self.tmp, ignore_errors=True)
        doc["wall_s"] = round(time.monotonic() - T_START, 1)
        self.finish()
        return 0 if "error" not in doc and all(self.checks.values()) else 1

    # -- A --------------------------------------------------------------------------------
    def part_a(self) -> dict[str, Any]:
        return Placement(self.env, self.tmp, self.gpus, self.simulated).run(self.checks)

    def prepare_victims(self) -> None:
        for g, v in self.victims.items():
            ready = v.read(240, MSG)
            if "error" in ready:
                raise RuntimeError(f"victim on GPU {g}: {ready['error']}")
            self.doc["victims"][f"gpu{g}"] = {**ready, "pid": v.proc.pid}
        for g, r in self.both({"cmd": "attach"}, 60).items():
            self.doc["victims"][f"gpu{g}"]["session"] = r["session"]
            if r["gpu"] != g:
                raise RuntimeError(f"victim {g} registered on GPU {r['gpu']}")
        say(f"victims ready ({self.doc['victims']['gpu0'].get('device', 'simulated')}); calibrating on both GPUs ...")
        for g, r in self.both({"cmd": "calibrate"}, 600).items():
            self.doc["victims"][f"gpu{g}"]["classes"] = r["classes"]
        self.snapshot("before_alone")
        for g in (0, 1):
            say(f"GPU {g} victim: alone ...")
            self.doc["alone"][f"gpu{g}"] = measured(self.one(g, {"cmd": "measure"}))

    # -- B and C (multi_gpu_parts.py) ----------------------------------------------------------
    def part_b(self) -> dict[str, Any]:
        return part_b(self)

    def part_c(self) -> dict[str, Any]:
        return part_c(self)

    # -- output ---------------------------------------------------------------------------
    def finish(self) -> None:
        doc = self.doc
        doc["checks"] = self.checks
        doc["passed"] = "error" not in doc and bool(self.checks) and all(self.checks.values())
        samples: dict[str, Any] = {}

        def strip(node: Any, path: str) -> None:
            if isinstance(node, dict):
                if "_samples" in node:
                    samples[path] = node.pop("_samples")
                for k, v in node.items():
                    strip(v, f"{path}/{k}" if path else k)

        strip(doc, "")
        if self.args.keep_samples:
            doc["samples_ms"] = samples
        if self.simulated:
            print("\n(simulated run: fake backend, CPU spins instead of kernels; results not written)")
            if self.args.json:
                Path(self.args.json).write_text(json.dumps(doc, indent=1, default=str))
                print(f"wrote {self.args.json}")
        else:
            write_result("multi_gpu", doc)
        print_table(doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--backend",
        default="nvidia",
        choices=("nvidia", "fake"),
        help="fake: dry run on 2 simulated GPUs, CPU spins instead of kernels (nothing written)",
    )
    p.add_argument("--parts", default="A,B,C", help="which parts to run, e.g. A or B,C (default A,B,C)")
    p.add_argument("--quick", action="store_true", help="fewer samples per condition")
    p.add_argument("--hold", type=float, default=1.0, help="length of each GPU-0 region in part B, s")
    p.add_argument("--cpu-hogs", type=int, default=None, help="CPU busy loops in all (default: one per core)")
    p.add_argument("--keep-samples", action="store_true", help="store every sample in the JSON")
    p.add_argument("--json", default=None, help="with --backend fake: write the JSON here")
    p.add_argument("--role", choices=("victim", "holder"), help=argparse.SUPPRESS)
    p.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "victim":
        victim_role(args.gpu, args.backend == "fake", args.quick)
        return 0
    if args.role == "holder":
        holder_role(args.gpu)
        return 0
    if args.backend == "fake":
        gpus: list[dict[str, Any]] = [{"index": i, "name": "simulated", "uuid": ""} for i in (0, 1)]
    else:
        gpus, why = nvml_gpus()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and len([d for d in visible.split(",") if d.strip()]) < 2:
            print(
                f"multi_gpu.py needs two GPUs, but CUDA_VISIBLE_DEVICES={visible!r} shows fewer. Unset it (each "
                "process of the benchmark gets its own). Nothing measured.",
                file=sys.stderr,
            )
            return 2
        if len(gpus) < 2:
            print(
                f"multi_gpu.py needs two NVIDIA GPUs of one node; NVML sees {len(gpus)} here"
                f"{f' ({why})' if why else ''}. Nothing measured. For a dry run of the orchestration on two "
                "simulated GPUs: --backend fake.",
                file=sys.stderr,
            )
            return 2
    say(
        f"{len(gpus)} GPUs: {', '.join(str(g.get('name')) for g in gpus)}; parts {args.parts}; "
        f"{len(os.sched_getaffinity(0))} cores"
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    return MultiGpu(args, gpus).run()


if __name__ == "__main__":
    sys.exit(main())
