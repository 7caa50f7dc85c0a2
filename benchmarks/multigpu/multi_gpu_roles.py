"""The processes of ``multi_gpu.py`` that run on one GPU each: the timing victim and the region holder.

Started as ``multi_gpu.py --role victim|holder --gpu N``; commands come as JSON lines on stdin,
answers as ``MSG`` lines (``fidelity_roles._say``)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parents[1]), str(HERE.parent / "regions"), str(HERE)):  # krex_lab; fidelity_roles; this family
    if _p not in sys.path:
        sys.path.insert(0, _p)

from fidelity_roles import CLASSES, Victim, _say  # noqa: E402
from multi_gpu_report import TIMED  # noqa: E402


class SimVictim:
    """``--backend fake``: no CUDA. A "kernel" is a CPU spin of the class's length; orchestration only."""

    def calibrate(self, classes: list[tuple[str, float]]) -> dict[str, Any]:
        return {
            name: {"n": 0, "target_ms": t, "calibrated_ms": t, "graph_k": 1, "simulated": True} for name, t in classes
        }

    @staticmethod
    def _spin(ms: float) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < ms / 1e3:
            pass
        return (time.perf_counter() - t0) * 1e3

    def measure(self, quick: bool, classes: list[tuple[str, float]]) -> dict[str, Any]:
        res: dict[str, Any] = {}
        for name, t in classes:
            n = (100 if t < 0.5 else 30) // (2 if quick else 1)
            res[name] = {
                "launch": {"samples_ms": [self._spin(t) for _ in range(n)], "held": False, "redone_batches": 0},
                "graph": {
                    "samples_ms": [self._spin(t) for _ in range(n // 2)],
                    "k": 1,
                    "held": False,
                    "redone_batches": 0,
                },
            }
        return res


def victim_role(gpu: int, simulated: bool, quick: bool) -> None:
    """Timing process on one GPU; the commands come as JSON lines on stdin, answers as MSG lines."""
    try:
        victim: Any = SimVictim() if simulated else Victim()
    except Exception as exc:
        _say({"error": f"torch with CUDA is needed: {exc!r}"})
        return
    import krex_lab

    ready: dict[str, Any] = {
        "ready": True,
        "pid": os.getpid(),
        "gpu": gpu,
        "simulated": simulated,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if not simulated:
        torch = victim.torch
        ready.update(
            torch=torch.__version__,
            cuda=torch.version.cuda,
            device=torch.cuda.get_device_name(0),
            has_sleep=victim.timer.has_sleep,
            sleep_cycles_per_ms=victim.timer.cycles_per_ms,
        )
    _say(ready)
    region: Any = None
    t_release_sent = 0.0
    for line in sys.stdin:
        cmd = json.loads(line)
        classes = [c for c in CLASSES if c[0] in cmd.get("classes", [n for n, _ in TIMED])]
        try:
            if cmd["cmd"] == "attach":
                session = krex_lab.attach(gpu=gpu, name=f"multi-gpu-victim-{gpu}")
                _say({"session": session.id, "gpu": session.gpu})
            elif cmd["cmd"] == "calibrate":
                _say({"classes": victim.calibrate(classes)})
            elif cmd["cmd"] == "measure":
                t0 = time.time()
                results = victim.measure(quick, classes)
                _say({"results": results, "t0": t0, "t1": time.time(), "in_region": region is not None})
            elif cmd["cmd"] == "acquire":
                t_req = time.time()
                region = krex_lab.exclusive(gpu=gpu, max_hold=cmd.get("max_hold", 300.0))
                region.acquire()
                _say({"t_requested": t_req, "t_granted": time.time(), "report": dict(region.report)})
            elif cmd["cmd"] == "release":
                t_release_sent = time.time()
                report = region.release()
                region = None
                _say({"t_release_sent": t_release_sent, "t_released": time.time(), "report": dict(report)})
        except Exception as exc:
            _say({"error": repr(exc)})


def _cpus_of(pid: int) -> list[int]:
    """Union of the cores the threads of ``pid`` may run on."""
    from krex_lab.procutil import threads

    cpus: set[int] = set()
    for tid in threads([pid]):
        try:
            cpus |= os.sched_getaffinity(tid)
        except OSError:
            continue
    return sorted(cpus)


def holder_role(gpu: int) -> None:
    """Back-to-back regions on ``gpu`` until told to stop; samples the watched processes inside each."""
    import krex_lab
    from krex_lab.procutil import cpu_seconds, proc_state

    session = krex_lab.attach(gpu=gpu, name=f"multi-gpu-holder-{gpu}")
    _say({"ready": True, "pid": os.getpid(), "session": session.id})
    cmd = json.loads(sys.stdin.readline())
    watch: dict[str, int] = cmd["watch"]
    stop = threading.Event()

    def wait_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_stop, daemon=True).start()

    def cpu() -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in watch.items():
            try:
                out[name] = cpu_seconds(pid)
            except Exception:
                out[name] = float("nan")
        return out

    n = 0
    while not stop.is_set() and n < cmd.get("max_regions", 1000):
        region = krex_lab.exclusive(gpu=gpu, max_hold=cmd.get("max_hold", 60.0))
        region.acquire()
        t_granted = time.time()
        _say({"granted": t_granted, "region": region.id})
        before = cpu()
        time.sleep(cmd["hold_s"] / 2)
        cpus = {name: _cpus_of(pid) for name, pid in watch.items()}
        states = {name: proc_state(pid) for name, pid in watch.items()}
        time.sleep(cmd["hold_s"] / 2)
        after = cpu()
        t_release_sent = time.time()
        report = dict(region.release())
        _say(
            {
                "region": region.id,
                "t_granted": t_granted,
                "t_release_sent": t_release_sent,
                "report": report,
                "cpu_gain_s": {k: round(after[k] - before[k], 4) for k in watch},
                "cpus_of": cpus,
                "states": states,
                "sampled_s": round(t_release_sent - t_granted, 4),
            }
        )
        n += 1
        time.sleep(cmd.get("gap_s", 0.05))
    _say({"done": n})
