"""The judge: one evaluation's phases, deciding everything from outside the candidate's process.

``run(job)`` is the evaluation job on a pool worker. It never executes candidate code: the
candidate runs in a one-shot process (:mod:`.spares`) reached through :mod:`..channel`.

1. **load**: the reference imported here (once per problem and worker), the problem's first
   inputs and answer made, a spare taken and placed in a cgroup of its own (before any candidate
   code is in it), then the candidate compiled and imported *there*.
2. **check** (:mod:`.checks`): per trial, fresh inputs drawn on the device under a secret seed,
   shared with the candidate with output buffers the judge owns (:mod:`.buffers`), into which the
   candidate's side copies its value before the call is over; the judge reads only those buffers
   and compares here on the device (:mod:`.compare`); its inputs compared with a private pristine
   copy (written into: rejected). Then the same buffers refilled with new values must give the
   new answer.
3. **time**: per case, in a region: rounds over K distinct input sets, refilled between rounds
   (:mod:`.rounds`); the reference timed here, in this clean process.

What the candidate's process raised, or how it ended, becomes a verdict in :mod:`.failures`.
Phase markers carry the job's nonce; the candidate's output is its file's, never this stdout.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import cuda_ipc
from ..cache import make_output_file, output_file
from ..channel import ChannelError, Shared, encode_tree
from ..messages import Body, Failed, Load, Loaded, Ok, Release
from ..numerics import applied, settings_for
from ..options import Job, ProgramSource
from ..outcomes import LoadResult, PhaseResult, PhaseResults
from .account import CandidateGroup, place
from .buffers import CallSet, out_spec, share_set
from .builddir import BuildDir
from .checks import check, trial_data
from .clock import Scheduling
from .disk_watch import DiskWatch
from .failures import died, raised
from .footprint import figures, judge_peak, reference_peak
from .problems import MissingDefinition, Problem, nbytes, problem_for
from .seeds import Seeds
from .spares import CandidateProc, proc_alive, sandbox_summary, spares_for
from .startup import planted_startup_code
from .tensors import synchronize
from .values import CandidateFailed

__all__ = ["CandidateFailed", "Judge", "run"]

#: reference modules by source hash: imported once per problem in this judge
_REFERENCES: dict[str, types.ModuleType] = {}
#: files a compiler of the load phase may write (RLIMIT_FSIZE bounds every file)
LOAD_FILE_LIMIT = 1 << 30
_PR_SET_DUMPABLE = 4


def _nondumpable() -> None:
    """No process of this user may ptrace the judge or read its memory (``/proc/PID/mem``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def mark(phase: str, nonce: str, candidate: int | None = None) -> None:
    """Say on the job's stdout that ``phase`` begins (the client's clock for its limit starts),
    and which process runs the candidate (the client counts its time while the judge is stopped)."""
    from ..options import MARKER

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    tail = f" {candidate}" if candidate else ""
    os.write(1, f"{MARKER} {phase} {os.getpid()} {nonce}{tail}\n".encode())


def _filename(src: ProgramSource, what: str) -> str:
    return src.path or f"<krex-{what}-{src.sha256[:12]}>"


def _module(src: ProgramSource, what: str) -> types.ModuleType:
    name = f"krex_{what}_{src.sha256[:12]}"
    module = types.ModuleType(name)
    module.__file__ = _filename(src, what)
    code = compile(src.text, module.__file__, "exec")
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _device() -> tuple[str, str]:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name()
    model = "cpu"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = f"cpu: {line.split(':', 1)[1].strip()}"
                break
    return "cpu", model


#: the answer :meth:`Judge.ask` expects
A = TypeVar("A", bound=Body)


class Judge:
    """One evaluation, judged here; the candidate reached only through ``self.proc``."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.opts = job.options
        self.device, self.device_name = _device()
        #: every input set's seed, each from the CSPRNG (:mod:`.seeds`)
        self.seeds = Seeds(self.opts.seed)
        #: GPU memory torch had allocated in this judge when the evaluation's reference was loaded
        self.allocated_before = 0
        self.salt = self.opts.seed if self.opts.seed is not None else 0
        #: its build directory: its own for this evaluation, the compilers' cache of its source kept
        self.build = BuildDir(job.build_root, job.candidate.sha256[:32])
        self.build_dir = self.build.stable
        self.output_path = output_file(job.build_root, job.id)
        self.proc: CandidateProc | None = None
        #: the candidate's processes as a cgroup (or /proc accounting), made before its code loads
        self.group: CandidateGroup | None = None
        #: the candidate's disk use, watched while its process lives
        self.disk: DiskWatch | None = None
        #: the judge's nice value and, in a region, affinities: put back before anything is timed
        self.scheduling = Scheduling()
        #: changes to the judge's scheduling found (the candidate's doing)
        self.rescheduled: list[str] = []
        self.problem: Problem | None = None
        self.failed_here: CandidateFailed | None = None
        #: the first trial's (data, pristine copy, answer, arrays the reference writes), made at load
        self.first: tuple[Any, Any, Any, set[int]] | None = None
        #: when the reference's time this judge reuses was measured (None: measured now)
        self.reference_timed_at: str | None = None
        from ..task import files_digest

        #: a published GPU MODE problem's files (task.yml's ``files:``), laid out for each side
        self.files_digest = files_digest(job.files) if job.files else ""
        self.candidate_layout = ""
        #: seconds the sandbox's file part took (landlock on the build directory)
        self.confine_s = 0.0

    def seed(self, secret: bool = False) -> int:
        return self.seeds.next(secret)

    # -- talking to the candidate ----------------------------------------------------------------

    def ask(
        self,
        body: Body,
        answer: type[A],
        shared: Shared | None = None,
        inputs: list[Any] | None = None,
        proc: CandidateProc | None = None,
        on_answer: Callable[[], object] | None = None,
    ) -> A:
        """Send, and read the answer, which must be ``answer``'s operation with a body of its shape
        (anything else is a ``rejected`` verdict that says what came). Outputs never come with an
        answer: a call's value is in the output buffers the judge handed with it (:mod:`.buffers`),
        and any array the candidate's process sends is closed unread. ``proc``: another process
        than the candidate's (the calibration twin); ``on_answer``: run as soon as the answer has
        arrived, before anything of it is read (the round's end, as the judge's clock sees it)."""
        proc = proc or self.proc
        assert proc is not None
        try:
            proc.chan.send(body, shared)
            env, fds = proc.chan.recv()
        except (ChannelError, OSError) as exc:
            raise self._died(f"{type(exc).__name__}: {exc}") from None
        finally:
            if shared is not None:
                shared.close()
        del inputs
        for fd in fds:
            os.close(fd)
        if on_answer is not None and env.op != Failed.op:
            on_answer()
        try:
            if env.op == Failed.op:
                raise self._raised(env.read(Failed))
            return env.read(answer)
        except ChannelError as exc:
            raise CandidateFailed(
                "rejected", "rejected", "", {"protocol": f"the candidate's process answered {body.op!r} so: {exc}"}
            ) from None

    def _died(self, why: str) -> CandidateFailed:
        assert self.proc is not None
        return died(self.proc.status(timeout=2.0), self.phase, why)

    def _raised(self, body: Failed) -> CandidateFailed:
        return raised(body, self.phase, self.device)

    phase = "load"

    # -- load --------------------------------------------------------------------------------------

    def load(self) -> LoadResult:
        job = self.job
        result = LoadResult(device=self.device_name, gpu_timed=self.device == "cuda")
        try:
            t_build = time.perf_counter()
            self.build_dir = self.build.open()
            make_output_file(self.output_path)
            result.metadata["build_dir_s"] = f"{time.perf_counter() - t_build:.4f}"
        except OSError as exc:
            result.fail("error", "evaluation_error", f"no build directory could be made: {exc}")
            return result
        if job.files:
            from ..task import lay_out

            self.candidate_layout = os.path.join(self.build_dir, f"task-{self.files_digest[:16]}")
            lay_out(job.files, self.candidate_layout)  # the candidate's copy: its to import (or spoil)
        ref_key = f"{job.reference.sha256}:{self.files_digest}"
        reference = _REFERENCES.get(ref_key)
        try:
            if reference is None:
                for d in (job.reference.path,):
                    if d and os.path.dirname(d) not in sys.path:
                        sys.path.insert(0, os.path.dirname(d))
                reference = _REFERENCES[ref_key] = _module(job.reference, "reference")
            with reference_peak(self.device) as peak:  # the batch admits the next ones by it
                self.problem = problem_for(job, reference, self.device, self.salt)
                self.first = trial_data(self, self.problem.check_cases[0][1])
        except Exception as exc:
            result.fail("error", "reference_error", f"the reference fails: {type(exc).__name__}: {exc}")
            return result
        from .rounds import MAX_SETS

        data, _, answer, _ = self.first
        per_set = 2 * nbytes(data) + nbytes(answer)  # as a timed round counts a set
        result.metadata["memory"] = figures(self.device, peak[0], per_set, MAX_SETS)
        self.allocated_before = peak[1]
        t0 = time.perf_counter()
        try:
            try:
                self._ready_spare()
            except (CandidateFailed, ChannelError, OSError):  # a spare killed while it waited: once more
                if self.proc is not None:
                    self.proc.end()
                self._ready_spare()
            result.metadata["spare_wait_s"] = str(round(time.perf_counter() - t0, 4))
            assert self.proc is not None
            result.metadata["sandbox"] = sandbox_summary(self.proc.sandbox)
            result.metadata["confine_s"] = f"{self.confine_s:.4f}"
            # its own cgroup before any candidate code is in it: its CPU time (threads and
            # children included) and its freeze are the judge's from here on
            t_group = time.perf_counter()
            self.group = place(self.proc.pid, self.proc.strays, memory_limit=self.opts.memory_limit_mb << 20)
            result.metadata["candidate_cgroup_s"] = f"{time.perf_counter() - t_group:.4f}"
            result.metadata["candidate_tasks"] = self.group.tasks
            result.metadata["candidate_memory"] = self.group.memory
            self.disk = DiskWatch(self.build_dir, self.group.pids, self.opts.disk_limit_mb << 20).start()
        except (CandidateFailed, ChannelError, OSError, TimeoutError) as exc:
            # before any candidate code ran: the evaluation's failure, not the candidate's
            message = exc.message if isinstance(exc, CandidateFailed) else f"{type(exc).__name__}: {exc}"
            result.fail("error", "evaluation_error", f"no candidate process could be made ready: {message}")
            return result
        init_shared = Shared()
        init = encode_tree(self.problem.init_tree(), init_shared)
        body = Load(
            format=job.format,
            source=job.candidate.text,
            filename=_filename(job.candidate, "candidate"),
            module=f"krex_candidate_{job.candidate.sha256[:12]}",
            build_dir=self.build_dir,
            path=self._import_dirs(),
            init=init,
            init_seed=self.opts.init_seed,
            output_path=self.output_path,
            load_file_limit=max(LOAD_FILE_LIMIT, self.opts.output_limit_mb << 20),
            memory_limit_mb=self.opts.memory_limit_mb,
            numerics=settings_for(job.format),
        )
        try:
            t_load = time.perf_counter()
            self.ask(body, Loaded, init_shared)
            result.compiled = True
            result.seconds = round(time.perf_counter() - t_load, 6)
            t_keep = time.perf_counter()
            self.build.keep()  # what its compilers made, before it has seen any input
            result.metadata["build_keep_s"] = f"{time.perf_counter() - t_keep:.4f}"
        except CandidateFailed as exc:
            exc.record(result)
            result.compiled = exc.key != "compilation_error"
        return result

    def _import_dirs(self) -> list[str]:
        """Where the candidate imports from besides the environment: the problem's files."""
        job = self.job
        return ([self.candidate_layout] if self.candidate_layout else []) + [
            os.path.dirname(p) for p in (job.candidate.path, job.reference.path) if p
        ]

    def _ready_spare(self) -> None:
        """A spare taken and its sandbox closed on this evaluation's build directory, before any
        candidate code is in it (its harness is calibrated on a clean twin, in the region:
        :mod:`.clock`)."""
        self.proc = spares_for(self.device).take()
        mark("load", self.job.nonce, self.proc.pid)
        t0 = time.perf_counter()
        self.proc.confine(self.build_dir, self._import_dirs(), [self.output_path])
        self.confine_s = time.perf_counter() - t0

    def _calibration_sets(self, calls: int, sample: Any = None) -> tuple[list[CallSet], Shared]:
        """``calls`` input sets as a timed round sends them (each in memory of its own, with its
        output buffers), of ``sample`` (a set of the case being timed and its output layout; None:
        the first trial's data): the harness's cost then counts taking a round's sets over,
        touching their pages and copying each value into the judge's buffers, as a real round of
        that case does. They go to the calibration twin, in which no candidate code runs."""
        assert self.problem is not None and self.first is not None
        data, spec = sample if sample is not None else (self.first[1], out_spec(self.first[2]))
        shared = Shared()
        sets = [share_set(self.problem, data, spec, shared) for _ in range(calls)]
        synchronize()
        return sets, shared

    # -- check -------------------------------------------------------------------------------------

    # -- the end -----------------------------------------------------------------------------------

    def end(self, last: PhaseResult | None) -> None:
        """Whatever the candidate left running is a verdict (on the last phase that ran); then it
        is killed, whole."""
        if self.proc is None:
            return
        left = self.proc.left_behind()
        if self.device == "cuda" and proc_alive(self.proc.pid):
            # its mappings of the judge's inputs released first, or torch keeps their memory for
            # good (a receiver that dies never releases it) and the worker's reset finds it grown
            with contextlib.suppress(Exception):
                self.proc.chan.sock.settimeout(2.0)
                self.ask(Release(), Ok)
        if self.disk is not None:
            self.disk.stop()
            if self.disk.breached and last is not None:  # killed for it: whatever it died of after
                last.fail("rejected", "disk_limit", self.disk.breached)
                last.metadata.pop("worker_died", None)
            self.disk = None
        if left and last is not None and last.verdict is None:
            last.fail("rejected", "rejected", "")
            last.metadata["rejected"] = {
                "processes_left": f"the candidate left process(es) running: {', '.join(left[:5])}"
            }
        self.proc.end()
        self.proc = None
        if self.group is not None:
            self.group.remove()
            self.group = None
        with contextlib.suppress(Exception):  # nothing the candidate changed outlives it
            self.rescheduled += self.scheduling.reset((spares_for(self.device).pid,))
        self.first = None
        import gc

        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            # what the dead candidate still held of the judge's sets is let go (torch would keep
            # it for the judge's life), and the candidate's memory this judge mapped goes with it
            cuda_ipc.take_back()
            cuda_ipc.collect()


def run(job: Job, reference_cache: str | None = None) -> PhaseResults:
    """Every phase of ``job``, as far as the candidate gets."""
    _nondumpable()
    del reference_cache  # reference times live in the judge's memory (see .rounds)
    with _judge_layout(job), applied(settings_for(job.format)):  # the reference and its check too
        return _run(job)


@contextlib.contextmanager
def _judge_layout(job: Job) -> Iterator[None]:
    """The problem's files for the judge's own imports, laid out again for every job (an earlier
    candidate may have written over them: they are the user's files) and first on sys.path."""
    if not job.files:
        yield
        return
    from ..task import files_digest, lay_out, layout_on_path

    where = os.path.join(
        os.path.dirname(job.build_root), "judge-layouts", f"{os.getpid()}-{files_digest(job.files)[:16]}"
    )
    lay_out(job.files, where, skip=[job.task.submission] if job.task else [])
    with layout_on_path(where, job.files):
        yield


def _run(job: Job) -> PhaseResults:
    nonce = job.nonce
    mark("load", nonce)
    planted = planted_startup_code()
    if planted is not None:  # the judge's own code may be patched: it decides nothing
        loaded = LoadResult(device=_device()[1], gpu_timed=False)
        loaded.fail(
            "error",
            "evaluation_error",
            f"this worker ran {planted} at start, which any process of your user can write: the judge "
            "refuses to decide (remove it and restart the pool; a shared node installs KREX root-owned)",
        )
        mark("done", nonce)
        return PhaseResults(load=loaded)
    from .rounds import ADMITTED

    # every job sets its own (0: none), so that no job's admission outlives it on this worker
    ADMITTED.set(job.options.memory_budget_mb << 20)  # input sets sized to the memory free at admission
    judge = Judge(job)
    try:
        return _phases(judge, job)
    finally:
        judge.build.close()  # nothing it wrote is there for the next evaluation


def _phases(judge: Judge, job: Job) -> PhaseResults:
    nonce = job.nonce
    last: PhaseResult
    loaded = judge.load()
    _static_flags(job, loaded)
    out = PhaseResults(load=loaded)
    with contextlib.suppress(Exception):  # the record never costs a verdict
        from .record import collect

        out.reproducibility = collect(job, seed=job.options.seed, device=judge.device_name)
    last = loaded
    try:
        if loaded.verdict is None:
            mark("check", nonce, judge.proc.pid if judge.proc else None)
            out.check = last = check(judge)
            if out.check.verdict is None and job.options.measure:
                mark("time", nonce, judge.proc.pid if judge.proc else None)
                from .rounds import timing

                out.time = last = timing(judge)
    finally:
        judge.end(last)
        _collect_output(judge, last)
        memory = loaded.metadata.get("memory")
        if isinstance(memory, dict):  # the judge's side as it was, for the batch's next pairs of it
            with contextlib.suppress(Exception):
                took = judge_peak(judge.device, judge.allocated_before)
                if took is not None:
                    memory["judge_peak"] = str(took)
    if out.reproducibility is not None:  # the seeds, said once the candidate's process is gone
        out.reproducibility.seeds = list(judge.seeds.drawn)
    mark("done", nonce)
    return out


def _static_flags(job: Job, loaded: LoadResult) -> None:
    """The static pre-check's advisory flags (a second layer: they never decide a verdict)."""
    from .static_rules import scan

    flags = scan(job.candidate.text, filename=_filename(job.candidate, "candidate"))
    if flags:
        loaded.metadata["static_flags"] = {
            f"{f.rule}" + (f"@{f.line}" if f.line else ""): f"{f.origin}: {f.message}" for f in flags[:20]
        }


def _collect_output(judge: Judge, last: PhaseResult) -> None:
    """How much the candidate printed (its file, read by the client afterwards), and whether it
    went past its limit."""
    try:
        size = os.lstat(judge.output_path).st_size
    except OSError:
        return
    last.output_bytes = size
    if size > judge.opts.output_limit_mb << 20 and last.verdict in (None, "runtime_error", "incorrect"):
        last.fail(
            "rejected",
            "output_limit",
            f"the candidate wrote {size} bytes to stdout/stderr: its limit is {judge.opts.output_limit_mb} MiB",
        )


__all__ += ["MissingDefinition", "mark"]
