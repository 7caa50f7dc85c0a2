"""One agent of ``agent_study.py``: a real process, registered with the arbiter, that loops
think -> write a candidate -> evaluate it (cold: a new ``python agent_kernels.py eval`` process;
warm: ``krex_lab.submit`` to a context worker; KernelBench mode: ``krex_lab.evaluate``, see
``agent_kb.py``) until the window closes.

    python agent_loop.py CONFIG.json      (written by agent_study.py)

It writes one JSON line per event to ``config["log"]``: ``{"event": "start", "seq": n}`` when an
evaluation is sent and ``{"event": "done", "seq": n, ...record}`` when it came back, so the
study can check that every evaluation returned exactly once. No evaluation starts after
``until``; one in flight then is awaited (its record says ``late``).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import agent_kb  # noqa: E402
import agent_kernels as ak  # noqa: E402


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A draw with the given *mean* (not median): mu = ln(mean) - sigma^2 / 2."""
    if mean <= 0:
        return 0.0
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if sigma > 0 else mean


def cold(job: dict[str, Any], gpu: int, max_hold: float) -> dict[str, Any]:
    """``python agent_kernels.py eval`` as a new process; in command mode inside this agent's region
    (the child registers as part of it through KREX_REGION, as under ``krex exclusive``)."""
    cmd = [sys.executable, str(HERE / "agent_kernels.py"), "eval"]

    def run(env: dict[str, str]) -> dict[str, Any]:
        r = subprocess.run(cmd, input=json.dumps(job), capture_output=True, text=True, env=env, timeout=600)
        for line in r.stdout.splitlines():
            if line.startswith("AGENT-RESULT "):
                out: dict[str, Any] = json.loads(line[len("AGENT-RESULT ") :])
                return out
        return {"status": "error", "error": f"eval process exited {r.returncode}: {r.stderr.strip()[-400:]}"}

    if job["mode"] != "command":
        return run(dict(os.environ))
    held = ak.Held(gpu, max_hold, bool(job.get("freeze", True)))
    with held:
        rec = run(dict(os.environ, KREX_REGION=held.region.id or ""))
    rec["region"] = held.info
    return rec


def main() -> None:
    import krex_lab

    cfg = json.loads(Path(sys.argv[1]).read_text())
    gpu, mode, launch = int(cfg["gpu"]), cfg["mode"], cfg["launch"]
    rng = random.Random(cfg["seed"])
    krex_lab.attach(gpu=gpu, name=f"agent{cfg['agent']}")
    cands = [ak.Candidate(**c) for c in cfg["candidates"]]
    kb = agent_kb if cfg.get("kernelbench") else None
    right = [c for c in cands if not c.wrong]
    wrong = [c for c in cands if c.wrong]
    work = Path(cfg["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    log = open(cfg["log"], "a", buffering=1)  # noqa: SIM115 - one line per event, flushed
    if launch == "warm":
        from krex_lab.workers.client.pool_client import default_client

        default_client()  # connect before the start line
    time.sleep(max(0.0, cfg["start_at"] - time.time()))  # a common start line for every agent
    seq = 0
    while True:
        think = lognormal(rng, cfg["think_mean"], cfg["think_sigma"])
        if time.time() + think >= cfg["until"]:
            break
        time.sleep(think)  # the model's latency: a remote call, it elapses even while frozen
        c = rng.choice(wrong) if wrong and rng.random() < cfg["p_wrong"] else rng.choice(right)
        path = (kb or ak).write_source(c, work, f"agent{cfg['agent']}_{seq:04d}")
        job = {
            "candidate": ak.candidate_dict(c),
            "path": str(path),
            "mode": mode,
            "gpu": gpu,
            "check_size": cfg["check_size"],
            "time_size": cfg["time_size"],
            "bench": cfg["bench"],
            "sim_compile_s": lognormal(rng, cfg["sim_compile_mean"], cfg["sim_compile_sigma"]),
            "max_hold": cfg["max_hold"],
            "outer": mode == "command" and launch == "cold",
            "freeze": cfg.get("freeze", True),
        }
        if kb:
            job.update(reference=str(kb.pair_of(c).reference), trials=cfg["trials"], perf_trials=cfg["perf_trials"])
        sent = time.time()
        log.write(json.dumps({"event": "start", "seq": seq, "sent": sent}) + "\n")
        try:
            if kb:
                rec = kb.evaluate(job)
            elif launch == "warm":
                rec = krex_lab.submit(ak.evaluate, job, gpu=gpu).result()
            else:
                rec = cold(job, gpu, cfg["max_hold"])
        except Exception as exc:  # the pool or the child failed, not the candidate
            rec = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:400]}
        done = time.time()
        rec.update(
            event="done",
            seq=seq,
            agent=cfg["agent"],
            gpu=gpu,
            candidate=c.id,
            kernel=c.kernel,
            wrong_on_purpose=c.wrong,
            think_s=think,
            sim_compile_s=job["sim_compile_s"] if rec.get("simulated") else None,
            sent=sent,
            done=done,
            latency_s=done - sent,
            late=done > cfg["until"],
        )
        log.write(json.dumps(rec) + "\n")
        seq += 1
    log.close()


if __name__ == "__main__":
    main()
