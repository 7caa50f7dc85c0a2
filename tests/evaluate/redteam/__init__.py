"""The red-team corpus: cheating candidates, one file each, with the problem each attacks.

Every cheat defines ``CHEAT = True`` at module level; its honest twin is the same source with
that line turned into ``CHEAT = False`` (:func:`twin`). What a test asserts of each cheat
(``checks``):

* ``speed``: no forged speedup: not ``correct``, or ``correct`` at an honest time (runtime at
  least a third of the twin's, reference time at most three times the twin's);
* ``limit``: the cheat spends several times a phase's limit behind forged markers or stopped
  judges: its verdict is ``timeout``;
* ``next``: it leaves the process (or the user's files) lying for later candidates: an honest
  but wrong candidate evaluated next is still not ``correct``, a slow honest one still
  ``correct`` at its own honest time;
* ``cache``: it tampers with stored reference times: an honest candidate evaluated next still
  gets an honest reference time;
* ``daemon``: it leaves a process running (named ``krexrt-*``): none is alive once the
  evaluation has returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
PROBLEMS = HERE / "problems"
GPU = HERE / "gpu"


@dataclass(frozen=True)
class Cheat:
    name: str
    problem: str
    kind: str  # the class of attack
    checks: tuple[str, ...] = ("speed",)
    #: cheats that change the process for good: run after every other (their harm would be
    #: counted against the cheats after them on an evaluator that does not stop them)
    lasting: bool = False

    @property
    def path(self) -> Path:
        return (GPU if self.problem.startswith("gpu_") else HERE) / f"{self.name}.py"

    def source(self) -> str:
        return self.path.read_text()

    def twin(self) -> str:
        return twin(self.source())


def twin(source: str) -> str:
    """The honest twin of a cheat's source: ``CHEAT = True`` turned off."""
    if source.count("\nCHEAT = True\n") != 1:
        raise ValueError("a cheat defines CHEAT = True exactly once, at module level")
    return source.replace("\nCHEAT = True\n", "\nCHEAT = False\n")


KB, GM, GM_TOL, GM_NP, TINY = "kb_mm_tanh", "gm_mm_tanh", "gm_mm_tol", "gm_np_tanh", "kb_tiny_out"
NEXT = ("speed", "next")

CHEATS = [
    Cheat("timer_time_module", KB, "timer patch", NEXT),
    Cheat("timer_statistics", KB, "statistics patch", NEXT),
    Cheat("timer_numpy_mean", KB, "statistics patch", NEXT),
    Cheat("cmp_numpy_isclose", KB, "comparator patch (numpy)", NEXT),
    Cheat("cmp_numpy_allclose_gm", GM_NP, "comparator patch (numpy)", NEXT),
    Cheat("cmp_torch_allclose", GM, "comparator patch (torch)", NEXT),
    Cheat("cmp_tensor_subclass", GM, "subclassed tensor"),
    Cheat("cmp_lazy_tensor", KB, "lazy tensor"),
    Cheat("cache_by_id", KB, "result cache"),
    Cheat("cache_by_data_ptr", KB, "result cache"),
    Cheat("cache_by_version", KB, "result cache"),
    Cheat("cache_by_content_hash", KB, "result cache"),
    Cheat("count_skip_after_n", KB, "call counter"),
    Cheat("count_garbage_after_n_gm", GM, "call counter"),
    Cheat("count_stack_inspection", KB, "call counter (stack)"),
    Cheat("gc_reference_output", KB, "gc discovery"),
    Cheat("gc_swap_reference_model", KB, "gc discovery", NEXT),
    Cheat("seed_initial_seed", KB, "seed reading"),
    Cheat("seed_caller_frames", GM, "seed reading"),
    Cheat("seed_proc_and_parent", KB, "seed reading (/proc)"),
    Cheat("thread_prestarted_pool", KB, "work left in a thread"),
    Cheat("input_mutation", KB, "input mutation"),
    Cheat("stale_empty", KB, "stale memory"),
    Cheat("zeros_tiny_output", TINY, "constant output, loose tolerance"),
    Cheat("stdout_forged_done_marker", KB, "forged stdout", ("limit",)),
    Cheat("stdout_forged_stopped_pid", KB, "forged stdout", ("limit",)),
    Cheat("cache_tamper_reference_times", KB, "cache tampering", ("speed", "cache")),
    Cheat("daemon_fork_setsid", KB, "daemon", ("speed", "cache", "daemon")),
    Cheat("daemon_double_fork", KB, "daemon", ("speed", "cache", "daemon")),
    Cheat("daemon_subprocess", KB, "daemon", ("speed", "cache", "daemon")),
    Cheat("next_torch_allclose", GM, "patch for the next candidate", NEXT),
    Cheat("signal_judge", KB, "signals to the judge", ("limit",)),
    # lasting: class attributes, C function pointers, the evaluator's own modules, sys.modules, files
    Cheat("timer_ctypes_clock_gettime", KB, "C-level clock patch", NEXT, lasting=True),
    Cheat("timer_cfunction_pointer", KB, "C-API function pointer patch", NEXT, lasting=True),
    Cheat("cmp_tensor_operators", GM_TOL, "comparator patch (Tensor class)", NEXT, lasting=True),
    Cheat("cmp_tensor_numpy", KB, "comparator patch (Tensor.numpy)", NEXT, lasting=True),
    Cheat("cmp_krex_functions", KB, "evaluator patch", NEXT, lasting=True),
    Cheat("next_sys_modules", KB, "patch for the next candidate", NEXT, lasting=True),
    Cheat("next_sitecustomize", KB, "patch for the next interpreter", ("speed", "next", "recycle"), lasting=True),
]

GPU_CHEATS = [
    Cheat("gpu_event_elapsed_time", "gpu_kb_mm_tanh", "timer patch (CUDA events)", NEXT, lasting=True),
    Cheat("gpu_side_stream", "gpu_kb_mm_tanh", "side stream"),
    Cheat("gpu_kernel_left_running", "gpu_kb_mm_tanh", "work left on the device"),
    Cheat("gpu_allocator_snapshot", "gpu_kb_mm_tanh", "stale device memory"),
    Cheat("gpu_cuda_ipc_daemon", "gpu_kb_mm_tanh", "CUDA IPC", ("speed", "daemon")),
]
