"""Client side: one evaluation, phase after phase, on one leased warm worker.

Each phase is one pool job on the same lease with its own time limit (the pool interrupts a job
past its limit, then kills its worker: an infinite loop on the CPU or the GPU ends either way),
so the reference compiled in ``load`` and the models it built are there for ``check`` and
``timing``. A job that dies (segfault, abort, sticky CUDA error) or runs out of time becomes the
verdict; the pool has already replaced or recycled its worker. Whatever happens, the lease is
released, so the worker resets (memory checked) before it serves anyone else.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from . import cache
from .entry import run_on_worker
from .options import MARKER, Job, Options, ProgramSource
from .outcomes import PhaseResult, PhaseResults, TimeResult, decode
from .result import CaseResult, Evaluation, TimedPart, TimingChecks, TimingStats
from .source import Source

__all__ = ["build_job", "run_job"]

from .job import build_job

#: what a phase's pool output may keep (the candidate's own output is captured on the worker)
_STRAY_OUTPUT = 16384


def _program(src: Source) -> ProgramSource:
    return ProgramSource(text=src.text, path=src.path, label=src.label, sha256=src.sha256)


class _Watch:
    """The phases of the running job, from its marker lines, against their time limits.

    Time a phase spends stopped (frozen by another evaluation's region on the same GPU) does not
    count: its worker's state is read from /proc (the pool is this user's, on this node)."""

    GRACE = 2.0  # seconds after the interrupt before the worker is killed

    def __init__(self, options: Options, nonce: str) -> None:
        self.marker = MARKER
        self.nonce = nonce
        self.options = options
        self.phase: str | None = None
        self.pid: int | None = None
        self.used = 0.0
        self.last = time.monotonic()
        self.expired: str | None = None
        self.interrupted_at = 0.0
        self.stray: list[str] = []
        self.size = 0
        self.seen: list[str] = []
        self.partial = ""
        self.killed = False
        self.candidate: int | None = None

    def output(self, stream: str, text: str) -> None:
        if stream == "stdout":  # a marker line may come in two pieces
            text, self.partial = self.partial + text, ""
            if not text.endswith("\n"):
                text, _, self.partial = text.rpartition("\n")
        for line in text.split("\n"):  # not splitlines(): it splits on control characters too
            parts = line.split(" ")
            if stream == "stdout" and len(parts) in (4, 5) and parts[0] == self.marker and parts[3] == self.nonce:
                phase, pid = parts[1], int(parts[2])
                self._tick()
                if phase != self.phase:
                    self.used = 0.0
                    self.seen.append(phase)
                    if phase != "done":  # evaluate() says "done" itself, once the verdict is made
                        from .progress import phase_started

                        phase_started(phase, f"worker {pid}")
                self.phase, self.pid = phase, pid
                if len(parts) == 5:  # the candidate's process, once the judge has one
                    self.candidate = int(parts[4])
            elif self.size < _STRAY_OUTPUT:
                self.stray.append(line[: _STRAY_OUTPUT - self.size])
                self.size += len(line)

    @staticmethod
    def _state(pid: int | None) -> str | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None

    def _stopped(self) -> bool:
        """The judge is stopped, and so is its candidate: a region's freeze stops the whole tree. A
        candidate that runs on while its judge is stopped (it stopped the judge itself) is timed."""
        if self._state(self.pid) not in ("T", "t"):
            return False
        return self.candidate is None or self._state(self.candidate) in ("T", "t", None)

    def _tick(self) -> None:
        now = time.monotonic()
        if self.pid is not None and not self._stopped():
            self.used += now - self.last
        self.last = now

    def __call__(self) -> int:
        """0: carry on; 1: interrupt; 2: kill (see PoolClient._run)."""
        self._tick()
        if self.phase not in ("load", "check", "time"):
            return 0
        if self.expired is None and self.used > self.options.limit(self.phase):
            self.expired, self.interrupted_at = self.phase, time.monotonic()
            return 1
        if self.expired is not None:
            self.killed = self.killed or time.monotonic() - self.interrupted_at > self.GRACE
            return 2 if self.killed else 1
        return 0


def _failure(ev: Evaluation, phase: str, limit: float, result: Any) -> None:
    """A phase job that did not return: the verdict its end stands for."""
    from ..cuda_errors import sticky_cuda_line

    error = result.error or "the job failed"
    tail = (result.traceback or "").strip()[-3000:]
    sticky = sticky_cuda_line(f"{error}\n{tail}")
    if result.status == "timeout":
        ev.verdict = "timeout"
        ev.metadata["timeout"] = f"the {phase} phase ran past its limit of {limit:g} s ({error})"
    elif result.status == "died":
        ev.verdict = "crashed"
        ev.metadata["worker_died"] = f"{error} in the {phase} phase" + (f"\n{tail}" if tail else "")
    elif sticky:
        ev.verdict = "crashed"
        ev.metadata["cuda_error"] = f"{sticky} in the {phase} phase (a sticky CUDA error: the worker was recycled)"
    else:
        ev.verdict = "error"
        ev.metadata["evaluation_error"] = f"{phase}: {error}" + (f"\n{tail}" if tail else "")


def _summary(ev: Evaluation) -> str:
    if ev.verdict != "correct":
        why = next(iter(ev.metadata.get("rejected", {}).values()), None) if ev.verdict == "rejected" else None
        from .compact import REASONS

        for key in REASONS:
            if why is None and key in ev.metadata:
                why = str(ev.metadata[key])
        first = (why or "").strip().splitlines()[0][:300] if why else ""
        return f"{ev.verdict}: {first}" if first else ev.verdict
    if ev.runtime < 0:
        trials = ev.metadata.get("correctness_trials")
        return f"correct ({trials} trials; not timed)" if trials else "correct (not timed)"
    # the method's name says "host-clock" where no GPU was timed: the clock is not said twice
    clock = "GPU" if ev.gpu_timed else "no GPU timed"
    if not ev.gpu_timed and "host-clock" not in (ev.timing_method or ""):
        clock = "host clock, no GPU timed"
    line = f"correct: {ev.runtime:.2f} us"
    if ev.ref_runtime > 0 and ev.speedup is not None:
        line += f" vs reference {ev.ref_runtime:.2f} us ({ev.speedup:.2f}x)"
    unprotected = any(p.notice for p in ev.regions if p.program == "candidate")
    # said in the first line: a time without a region is not a KREX time, whatever follows it
    return (
        line + f" [{ev.timing_method}, {clock}, {ev.device}" + (", UNPROTECTED: no region" if unprotected else "") + "]"
    )


def _flags(ev: Evaluation) -> list[str]:
    meta = ev.metadata
    out = [f"static:{k.split('@')[0]}" for k in meta.get("static_flags", {})]
    if "timing_bound" in meta:
        out.append("timing_bound")
    if any(p.notice for p in ev.regions if p.program == "candidate"):
        out.append("unprotected")
    if "correctness_rule" in meta:
        out.append(f"correctness_rule:{meta['correctness_rule']}")
    out += [f"rejected:{k}" for k in meta.get("rejected", {})]
    return sorted(set(out))


def _geomean(values: list[float]) -> float:
    good = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else -1.0


def _stats(st: TimingStats) -> TimingStats:
    """KernelBench's ``runtime_stats`` of a case's statistics (GPU MODE's ``err`` left out)."""
    return TimingStats(mean=st.mean, std=st.std, min=st.min, max=st.max, num_trials=st.num_trials)


def run_job(job: Job, *, gpu: int | None = None, pool: Any = None) -> Evaluation:
    """Run ``job`` on a warm worker of ``pool`` (default: this user's) and judge it."""
    import cloudpickle

    from ..workers.wire import JobSpec

    t0 = time.perf_counter()
    if pool is None:
        from ..workers.client import default_client

        pool = default_client()
    opts = job.options
    ev = Evaluation(
        format=job.format,
        verdict="error",
        summary="",
        reference=job.reference.label,
        candidate=job.candidate.label,
        timing=opts.timing,
        reference_hash=job.reference.sha256,
        candidate_hash=job.candidate.sha256,
        simulated=bool(getattr(pool.info, "simulated", False)),
        metadata={},
    )
    watch = _Watch(opts, job.nonce)
    backstop = sum(opts.limit(p) for p in ("load", "check", "time")) + 60.0  # the pool's own limit, should ours fail
    spec = JobSpec(
        kind="call",
        payload=cloudpickle.dumps((run_on_worker, (job, str(cache.cache_dir())), {})),
        gpu=gpu,
        timeout=backstop,
    )
    try:
        result = pool._run(spec, watch.output, watch)
        ev.gpu, ev.worker_pid = result.gpu, result.worker_pid
        if result.submitted_at and result.dispatched_at and result.finished_at:
            # the pool's view: waiting for a worker, and the job on it (the phases and their set-up)
            ev.phases["queued"] = round(result.dispatched_at - result.submitted_at, 6)
            ev.phases["job"] = round(result.finished_at - result.dispatched_at, 6)
        if watch.expired is not None:
            phase = watch.expired
            ev.verdict = "timeout"
            ev.metadata["timeout"] = f"the {phase} phase ran past its limit of {opts.limit(phase):g} s" + (
                " (it did not stop when interrupted: its worker was killed)" if watch.killed else ""
            )
            ev.compiled = phase != "load"
        elif not result.ok:
            phase = watch.phase if watch.phase in ("load", "check", "time") else "load"
            _failure(ev, watch.phase or "load", opts.limit(phase), result)
            ev.compiled = watch.phase not in (None, "load")
        else:
            _judge(ev, job, decode(cloudpickle.loads(result.value)))
    finally:
        ev.correctness = ev.verdict == "correct"
        if ev.gpu is not None:
            ev.metadata.setdefault("device", str(ev.gpu))
        ev.output = _candidate_output(job, ev)
        if watch.stray and "".join(watch.stray).strip():
            # printed outside the candidate's calls (the reference, a framework's warning)
            ev.metadata["worker_output"] = "\n".join(watch.stray)[-4096:]
        ev.wall_s = round(time.perf_counter() - t0, 6)
        ev.phases["total"] = round(sum(ev.phases.get(k, 0.0) for k in ("load", "check", "time")), 6)
        ev.flags = _flags(ev)
        ev.summary = _summary(ev)
    return ev


def _judge(ev: Evaluation, job: Job, out: PhaseResults) -> None:
    """The verdict from the phases' results (see :func:`krex_lab.evaluate.judge.session.run`)."""
    loaded = out.load
    ev.reproducibility = out.reproducibility
    ev.phases["load"] = loaded.seconds
    ev.device, ev.gpu_timed = loaded.device, loaded.gpu_timed
    ev.metadata["hardware"] = ev.device
    ev.compiled = loaded.compiled
    _absorb(ev, loaded)
    if loaded.verdict is not None:
        ev.verdict = loaded.verdict
        return
    checked = out.check
    if checked is None:  # the worker stops after a load that passes only when it fails itself
        raise RuntimeError("the worker returned no check phase after a load that passed")
    ev.phases["check"] = checked.seconds
    _absorb(ev, checked)
    ev.tests = [c for c in checked.cases if c.kind == "test"]
    bench_checked = {c.spec: c for c in checked.cases if c.kind == "benchmark"}
    if checked.verdict is not None:
        ev.verdict = checked.verdict
        return
    ev.verdict = "correct"
    if out.time is not None:
        _time(ev, job, out.time, bench_checked)


def _absorb(ev: Evaluation, phase: PhaseResult) -> None:
    ev.metadata.update(phase.metadata)
    if phase.output_bytes:
        ev.metadata["output_bytes"] = ev.metadata.get("output_bytes", 0) + phase.output_bytes


def _candidate_output(job: Job, ev: Evaluation) -> str | None:
    """What the candidate printed (head and tail), read where its phases wrote it; then removed."""
    from .cache import output_file
    from .output import read_output

    path = output_file(job.build_root, job.id)
    if not os.path.lexists(path):
        return None
    text = read_output(path)
    try:
        os.unlink(path)
    except OSError:
        pass
    return text or None


def _time(ev: Evaluation, job: Job, timed: TimeResult, bench_checked: dict[str, CaseResult]) -> None:
    ev.phases["time"] = timed.seconds
    _absorb(ev, timed)
    if timed.verdict is not None:
        ev.verdict = timed.verdict
        return
    parts = timed.parts
    cached, timed_at = timed.reference_cached, timed.reference_timed_at
    disagree: list[str] = []
    cand_means: list[float] = []
    ref_means: list[float] = []
    for p in parts:
        st = p.stats
        mean = st.mean
        check = p.timing_check
        if check is not None and not check.agrees:
            disagree.append(f"{p.case or 'forward'}: {p.method} {mean:.2f} us, device-wide {check.mean:.2f} us")
            mean = check.mean
        ev.timing_method = p.method if not disagree else f"device-sync (the {p.method} figure disagreed)"
        ev.regions.append(
            TimedPart(program="candidate", case=p.case, method=p.method, region=p.region, notice=p.notice)
        )
        ref = p.reference
        if ref is not None:
            ev.regions.append(
                TimedPart(
                    program="reference",
                    case=p.case,
                    method=ref.method,
                    region=ref.region,
                    cached=cached,
                    timed_at=timed_at,
                )
            )
        cand_means.append(mean)
        ref_means.append(ref.stats.mean if ref else -1.0)
        if job.format == "gpumode":
            checked = bench_checked.get(p.case or "")
            ev.benchmarks.append(
                CaseResult(
                    spec=p.case or "",
                    kind="benchmark",
                    passed=checked.passed if checked is not None else None,
                    runs=st.num_trials,
                    mean=mean,
                    std=st.std,
                    err=st.err,
                    best=st.min,
                    worst=st.max,
                    ref_mean=ref.stats.mean if ref else None,
                )
            )
        else:
            ev.runtime_stats = _stats(st)
            ev.ref_runtime_stats = _stats(ref.stats) if ref else None
    if job.format == "gpumode":
        ev.runtime = _geomean(cand_means)
        ev.ref_runtime = _geomean(ref_means) if ref_means and all(m > 0 for m in ref_means) else -1.0
    elif cand_means:
        ev.runtime, ev.ref_runtime = cand_means[0], ref_means[0]
    if ev.runtime > 0 and ev.ref_runtime > 0:
        ev.speedup = round(ev.ref_runtime / ev.runtime, 4)
    if cached:
        ev.metadata["ref_runtime_cached"] = f"measured {timed_at} (retime_reference=True measures it again)"
    if disagree:
        ev.metadata["timing_disagreement"] = disagree
        ev.warnings.append(
            "the event pair and a device-wide synchronisation disagree (work on another stream or thread?): "
            "runtime is the device-wide figure; " + "; ".join(disagree)
        )
    checks = [p.timing_check for p in parts if p.timing_check is not None]
    ev.timing_check = TimingChecks(method="device-sync", cases=checks) if checks else None
    if not ev.gpu_timed:
        ev.warnings.append("no GPU was timed: times are CPU times the judge accounted (CPU or fake backend)")
    notices = [p.notice for p in parts if p.notice]
    if notices:
        ev.warnings.append(notices[0])
