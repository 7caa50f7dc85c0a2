"""The processes of the fidelity benchmark (benchmarks/regions/fidelity.py): victim, GPU hog, CPU hog.

Run as ``python benchmarks/regions/fidelity_roles.py ROLE [--quick]``; the orchestrator does that. The
victim holds the timing method (:class:`HeldTimer`), see fidelity.py's docstring for why.
The victim speaks JSON lines prefixed with :data:`MSG` on stdout (torch may print other
things); hogs print one JSON line when ready, then load the GPU or a CPU core forever.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CLASSES: list[tuple[str, float]] = [("0.05ms", 0.05), ("0.1ms", 0.1), ("1ms", 1.0), ("10ms", 10.0)]
# samples per class (launch, graph): full run / --quick
SAMPLES = {
    False: {"0.05ms": (2000, 500), "0.1ms": (2000, 500), "1ms": (500, 300), "10ms": (150, 100)},
    True: {"0.05ms": (400, 100), "0.1ms": (400, 100), "1ms": (100, 60), "10ms": (40, 25)},
}
GRAPH_MIN_MS = 2.0  # one graph replay runs at least this long
BATCH_MS = 20.0  # GPU time enqueued behind one hold
MSG = "@@ "  # victim protocol lines on stdout start with this; anything else is noise

# ---------------------------------------------------------------------------------------------
# victim (runs with torch)
# ---------------------------------------------------------------------------------------------


class HeldTimer:
    """Event timing with the stream held by a spin kernel while a batch is enqueued: the
    ``HeldSampler`` of ``krex_lab.bench`` itself (no L2 flush), so that these figures are those
    of the method the product times with. One sampler per callable keeps its hold and spin rate."""

    def __init__(self, torch: Any) -> None:
        from krex_lab.bench.frameworks import TorchAdapter

        self.adapter = TorchAdapter(lambda: None, ())
        self.has_sleep = True  # TorchAdapter refuses a torch without torch.cuda._sleep
        self._samplers: dict[Any, Any] = {}
        self.cycles_per_ms = self._sampler(self.adapter.call).units_per_ms

    def _sampler(self, fn: Any) -> Any:
        from krex_lab.bench.timing import HeldSampler

        if fn not in self._samplers:
            self._samplers[fn] = HeldSampler(self.adapter, call=fn, l2_flush=False)
        return self._samplers[fn]

    def samples(self, fn: Any, count: int, batch: int) -> tuple[list[float], dict[str, Any]]:
        sampler = self._sampler(fn)
        redone, spun = sampler.redone, sampler.spin_ms
        out: list[float] = []
        while len(out) < count:
            out.extend(sampler.batch(max(1, min(batch, count - len(out)))))
        info = {"redone_batches": sampler.redone - redone, "spin_ms": round(sampler.spin_ms - spun, 3)}
        return out, {**info, "held": True}


class Victim:
    def __init__(self) -> None:
        import torch

        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 proper, as in FACTS.md
        torch.set_float32_matmul_precision("highest")
        torch.cuda.init()
        self.timer = HeldTimer(torch)
        self.kernels: dict[str, dict[str, Any]] = {}

    def _mm(self, n: int) -> Any:
        torch = self.torch
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        c = torch.empty(n, n, device="cuda")

        def run() -> None:
            torch.mm(a, b, out=c)  # out=: no allocation, so it captures into a graph as is

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        return run

    def _graph(self, fn: Any, k: int) -> Any:
        torch = self.torch
        side = torch.cuda.Stream()  # warm-up before capture on a side stream, as torch asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(k):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph

    def _time_one(self, n: int) -> float:
        fn = self._mm(n)
        k = 8
        graph = self._graph(fn, k)
        times, _ = self.timer.samples(graph.replay, 12, 12)
        return sorted(times)[len(times) // 2] / k

    def calibrate(self, classes: list[tuple[str, float]] | None = None) -> dict[str, Any]:
        """Square sizes (multiples of 64) whose matmul lands near each class's target.

        ``classes``: a subset of :data:`CLASSES` (default: all of them, in order).
        """
        out: dict[str, Any] = {}
        n = 2048
        for name, target in CLASSES if classes is None else classes:
            tried: list[tuple[int, float]] = []
            for _ in range(6):
                t = self._time_one(n)
                tried.append((n, round(t, 5)))
                if abs(t / target - 1) < 0.05:
                    break
                # Work grows as n^3; small kernels are latency-bound and move less, so always
                # step at least one multiple of 64 towards the target.
                nxt = round(n * (target / t) ** (1 / 3) / 64) * 64
                n = max(64, nxt if nxt != n else n + (64 if t < target else -64))
            n_best, t_best = min(tried, key=lambda p: abs(p[1] / target - 1))
            fn = self._mm(n_best)
            k = max(1, math.ceil(GRAPH_MIN_MS / t_best))
            self.kernels[name] = {
                "fn": fn,
                "graph": self._graph(fn, k),
                "k": k,
                "n": n_best,
                "launch_batch": max(1, min(100, math.ceil(BATCH_MS / t_best))),
                "graph_batch": max(1, min(50, math.ceil(BATCH_MS / (t_best * k)))),
            }
            out[name] = {"n": n_best, "target_ms": target, "calibrated_ms": t_best, "graph_k": k, "tried": tried}
            n = n_best
        return out

    def plain(self, fn: Any, count: int) -> list[float]:
        """As a user times a kernel: an event pair around one launch, synchronised, nothing held
        (host launch latency and any CPU stolen from the launching thread land inside)."""
        torch = self.torch
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out: list[float] = []
        for _ in range(count):
            s.record()
            fn()
            e.record()
            e.synchronize()
            out.append(float(s.elapsed_time(e)))
        return out

    def measure(self, quick: bool, classes: list[tuple[str, float]] | None = None) -> dict[str, Any]:
        """Samples of every calibrated class (or of ``classes``), both methods."""
        res: dict[str, Any] = {}
        for name, _ in CLASSES if classes is None else classes:
            kern = self.kernels[name]
            n_launch, n_graph = SAMPLES[quick][name]
            # the same warm-up in every condition: one untimed batch
            self.timer.samples(kern["fn"], kern["launch_batch"], kern["launch_batch"])
            launch, info_l = self.timer.samples(kern["fn"], n_launch, kern["launch_batch"])
            replays, info_g = self.timer.samples(kern["graph"].replay, n_graph, kern["graph_batch"])
            plain = self.plain(kern["fn"], n_launch)
            res[name] = {
                "plain": {"samples_ms": plain},
                "launch": {"samples_ms": launch, **info_l},
                "graph": {"samples_ms": [t / kern["k"] for t in replays], "k": kern["k"], **info_g},
            }
        return res


def _say(obj: Any) -> None:
    sys.stdout.write(MSG + json.dumps(obj) + "\n")
    sys.stdout.flush()


def victim_main(quick: bool) -> None:
    try:
        victim = Victim()
    except Exception as exc:
        _say({"error": f"torch with CUDA is needed: {exc!r}"})
        return
    torch = victim.torch
    session = None
    if os.environ.get("KREX_ENDPOINT"):
        import krex_lab

        session = krex_lab.attach(gpu=0, name="fidelity-victim")
    _say(
        {
            "ready": True,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0),
            "pid": os.getpid(),
            "has_sleep": victim.timer.has_sleep,
            "sleep_cycles_per_ms": victim.timer.cycles_per_ms,
            "session": getattr(session, "id", None),
        }
    )
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "calibrate":
                _say({"classes": victim.calibrate()})
            elif cmd["cmd"] == "measure" and not cmd.get("region"):
                t = time.perf_counter()
                _say({"results": victim.measure(quick), "wall_s": time.perf_counter() - t})
            elif cmd["cmd"] == "measure":
                import krex_lab

                t = time.perf_counter()
                with krex_lab.exclusive(gpu=0, max_hold=cmd.get("max_hold", 600.0)) as region:
                    granted = dict(region.report)
                    t_in = time.perf_counter()
                    results = victim.measure(quick)
                    wall = time.perf_counter() - t_in
                _say(
                    {
                        "results": results,
                        "wall_s": wall,
                        "acquire_wall_s": t_in - t,
                        "grant_report": granted,
                        "release_report": dict(region.report),
                    }
                )
        except Exception as exc:
            _say({"error": repr(exc)})


# ---------------------------------------------------------------------------------------------
# contention roles
# ---------------------------------------------------------------------------------------------


def _attach(name: str) -> str | None:
    """Register on GPU ``$KREX_GPU`` (0 when unset: fidelity.py clears it; multi_gpu.py sets it)."""
    if not os.environ.get("KREX_ENDPOINT"):
        return None
    try:
        import krex_lab

        return str(krex_lab.attach(gpu=int(os.environ.get("KREX_GPU") or 0), name=name).id)
    except Exception as exc:  # contention still matters without a session: say so, go on
        print(f"{name}: attach failed: {exc!r}", file=sys.stderr, flush=True)
        return None


def gpu_hog_main() -> None:
    session = _attach("fidelity-gpu-hog")
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    (a @ b).sum().item()
    print(json.dumps({"ready": True, "session": session}), flush=True)
    while True:
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()


def cpu_hog_main() -> None:
    # A foreign busy loop (no KREX session: nothing freezes it) unless asked to attach.
    session = _attach("fidelity-cpu-hog") if os.environ.get("KREX_CPU_HOG_ATTACH") == "1" else None
    print(json.dumps({"ready": True, "session": session}), flush=True)
    while True:
        pass


def main(argv: list[str]) -> None:
    role, quick = argv[0], "--quick" in argv[1:]
    if role == "victim":
        victim_main(quick)
    elif role == "gpu-hog":
        gpu_hog_main()
    elif role == "cpu-hog":
        cpu_hog_main()
    else:
        raise SystemExit(f"unknown role {role!r}: victim, gpu-hog or cpu-hog")


if __name__ == "__main__":
    main(sys.argv[1:])
