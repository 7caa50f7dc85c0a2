"""The red-team corpus: cheating candidates, one file each, with the problem each attacks.

Every cheat defines ``CHEAT = True`` at module level; its honest twin is the same source with
that line turned into ``CHEAT = False`` (:func:`twin`). What a test asserts of each cheat
(``checks``):

* ``speed``: no forged speedup: not ``correct``, or ``correct`` at an honest time (runtime at
  least a third of the twin's, reference time at most three times the twin's);
* ``wrong``: its timed calls are wrong now and then: judged four times, it is never ``correct``;
* ``limit``: the cheat spends several times a phase's limit behind forged markers or stopped
  judges: its verdict is ``timeout``;
* ``next``: it leaves the process (or the user's files) lying for later candidates: an honest
  but wrong candidate evaluated next is still not ``correct``, a slow honest one still
  ``correct`` at its own honest time;
* ``cache``: it tampers with stored reference times: an honest candidate evaluated next still
  gets an honest reference time;
* ``daemon``: it leaves a process running (named ``krexrt-*``): none is alive once the
  evaluation has returned;
* ``recycle``: it changes the judge's worker for good (start-up code, scheduling): the pool's
  workers are replaced after it.

``defence`` names what is expected to stop the cheat: ``time`` (the time from outside the
candidate's process), ``data`` (outputs in the judge's buffers, exact types, secret seeds, checks
in every phase, tolerances that follow the reference), ``sandbox`` (what the candidate's process
may reach), ``process`` (one process per candidate, the judge apart: already in place).
``retime``: the cheat's own evaluation times the reference again (a cheat that slows the judge
shows only in a reference timed beside it).
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
    defence: str = "process"
    retime: bool = False
    #: the file's name when it is not the cheat's (copies of one file judged side by side)
    file: str = ""

    @property
    def path(self) -> Path:
        return (GPU if self.problem.startswith("gpu_") else HERE) / f"{self.file or self.name}.py"

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
GM_LOOSE = "gm_softmax_loose"
NEXT = ("speed", "next")
JUDGE = ("speed", "cache", "recycle")  # slows the judge's own process
TIME, DATA, SANDBOX, PROCESS = "time", "data", "sandbox", "process"

CHEATS = [
    Cheat("timer_time_module", KB, "timer patch", NEXT, defence=TIME),
    Cheat("timer_statistics", KB, "statistics patch", NEXT, defence=TIME),
    Cheat("timer_numpy_mean", KB, "statistics patch", NEXT, defence=TIME),
    Cheat("timer_cpu_clocks", KB, "CPU clock patch", NEXT, defence=TIME),
    Cheat("cmp_numpy_isclose", KB, "comparator patch (numpy)", NEXT),
    Cheat("cmp_numpy_allclose_gm", GM_NP, "comparator patch (numpy)", NEXT),
    Cheat("cmp_torch_allclose", GM, "comparator patch (torch)", NEXT),
    Cheat("cmp_tensor_subclass", GM, "subclassed tensor", defence=DATA),
    Cheat("cmp_lazy_tensor", KB, "lazy tensor", defence=DATA),
    Cheat("cache_by_id", KB, "result cache", defence=DATA),
    Cheat("cache_by_data_ptr", KB, "result cache", defence=DATA),
    Cheat("cache_by_version", KB, "result cache", defence=DATA),
    Cheat("cache_by_content_hash", KB, "result cache", defence=DATA),
    Cheat("cache_in_build_dir", KB, "result cache", defence=DATA),
    Cheat("count_skip_after_n", KB, "call counter", defence=DATA),
    Cheat("count_garbage_after_n_gm", GM, "call counter", defence=DATA),
    Cheat("count_garbage_every_other", KB, "call counter (half the timed calls)", ("speed", "wrong"), defence=DATA),
    Cheat("count_stack_inspection", KB, "call counter (stack)", defence=DATA),
    Cheat("gc_reference_output", KB, "gc discovery"),
    Cheat("gc_swap_reference_model", KB, "gc discovery", NEXT),
    Cheat("seed_initial_seed", KB, "seed reading", defence=DATA),
    Cheat("seed_caller_frames", GM, "seed reading", defence=DATA),
    Cheat("seed_proc_and_parent", KB, "seed reading (/proc)", defence=SANDBOX),
    Cheat("thread_prestarted_pool", KB, "work left in a thread", defence=DATA),
    Cheat("input_mutation", KB, "input mutation", defence=DATA),
    Cheat("stale_empty", KB, "stale memory", defence=DATA),
    Cheat("zeros_tiny_output", TINY, "constant output, loose tolerance", defence=DATA),
    Cheat("stdout_forged_done_marker", KB, "forged stdout", ("limit",)),
    Cheat("stdout_forged_stopped_pid", KB, "forged stdout", ("limit",)),
    Cheat("cache_tamper_reference_times", KB, "cache tampering", ("speed", "cache")),
    Cheat("daemon_fork_setsid", KB, "daemon", ("speed", "cache", "daemon"), defence=SANDBOX),
    Cheat("daemon_double_fork", KB, "daemon", ("speed", "cache", "daemon"), defence=SANDBOX),
    Cheat("daemon_subprocess", KB, "daemon", ("speed", "cache", "daemon"), defence=SANDBOX),
    Cheat("next_torch_allclose", GM, "patch for the next candidate", NEXT),
    Cheat("signal_judge", KB, "signals to the judge", ("limit",), defence=SANDBOX),
    # lazy outputs: the work runs when the reply path reads them, after the call's clock
    Cheat("lazy_tensor_clone_proxy", KB, "lazy output (tensor subclass)", defence=DATA),
    Cheat("lazy_ndarray_subclass", GM_NP, "lazy output (ndarray subclass)", defence=DATA),
    Cheat("lazy_tuple_subclass", KB, "lazy output (tuple subclass)", defence=DATA),
    Cheat("lazy_dict_values", KB, "lazy output (dict of lazy values)", defence=DATA),
    # the candidate's own reply path rewritten
    Cheat("reply_patch_harness", KB, "reply path patched (harness)", defence=DATA),
    Cheat("reply_patch_encoder", KB, "reply path patched (encoder)", defence=DATA),
    Cheat("reply_scale_samples", KB, "statistics patched on the way out", defence=TIME),
    Cheat("reply_fd_relay", KB, "result-fd forgery", defence=TIME),
    # the judge's memory and scheduling
    Cheat("seed_judge_proc_mem", KB, "seeds read from the judge's memory", defence=SANDBOX),
    Cheat("seed_judge_vm_readv", KB, "seeds read from the judge's memory", defence=SANDBOX),
    Cheat("seed_regenerate", KB, "regenerated seeds", defence=DATA),
    # work moved outside the timed window
    Cheat("finalizer_next_round", KB, "work in a finalizer", defence=TIME),
    Cheat("thread_refill_watch", KB, "work in a thread during the refill", defence=DATA),
    Cheat("thread_fills_buffer", KB, "the output buffer filled by a thread", defence=TIME),
    Cheat("harness_cost_skipped", KB, "less harness paid than subtracted", defence=TIME),
    Cheat("batch_round_storage", KB, "a round answered from its first call", defence=DATA),
    Cheat("round_proc_self_fd", KB, "a round answered from its first call (/proc/self/fd)", defence=TIME),
    Cheat("child_fork_slow_clock", KB, "work in a child, clock slowed", defence=TIME),
    Cheat("thread_exit_slow_clock", KB, "work in an exited thread, clock slowed", defence=TIME),
    Cheat("cgroup_escape", KB, "out of its cgroup, work in an exited thread", defence=SANDBOX),
    Cheat("child_unwaited_exit", KB, "work in a child the kernel reaps unwaited", defence=TIME),
    Cheat("child_zombie_kept", KB, "work in a child left a zombie, never waited for", defence=TIME),
    Cheat("stray_reaped_unwaited_child", KB, "a reaped child as a stray, work in an unwaited child", defence=TIME),
    Cheat("slow_calibration", KB, "its harness slowed when calibrated", defence=TIME),
    Cheat("finalizer_gc_sets", KB, "work in a finalizer, sets found by the collector", defence=DATA),
    # outputs and inputs
    Cheat("input_write_timed", KB, "answer written into the input (timed calls)", defence=DATA),
    Cheat("zeroed_inputs_timed", KB, "zeroed inputs", defence=DATA),
    Cheat("near_constant_tiny", TINY, "near-constant output, tiny outputs", defence=DATA),
    Cheat("constant_loose_atol", GM_LOOSE, "constant output, loose atol", defence=DATA),
    Cheat("hardcoded_public_seed", GM, "hard-coded shapes and seeds", defence=DATA),
    Cheat("fallback_reference", KB, "try/except fallback to the reference"),
    # lasting: class attributes, C function pointers, the evaluator's own modules, sys.modules, files
    Cheat("timer_ctypes_clock_gettime", KB, "C-level clock patch", NEXT, lasting=True, defence=TIME),
    Cheat("timer_cfunction_pointer", KB, "C-API function pointer patch", NEXT, lasting=True, defence=TIME),
    Cheat("cmp_tensor_operators", GM_TOL, "comparator patch (Tensor class)", NEXT, lasting=True),
    Cheat("cmp_tensor_numpy", KB, "comparator patch (Tensor.numpy)", NEXT, lasting=True),
    Cheat("cmp_krex_functions", KB, "evaluator patch", NEXT, lasting=True),
    Cheat("next_sys_modules", KB, "patch for the next candidate", NEXT, lasting=True),
    Cheat("next_sitecustomize", KB, "patch for the next interpreter", ("speed", "next", "recycle"), lasting=True),
    # the judge's own process slowed: its workers are replaced after each
    Cheat("judge_renice_spin", KB, "judge reniced, spinning threads", JUDGE, True, TIME, retime=True),
    Cheat("judge_affinity_spin", KB, "judge pinned, spinning threads", JUDGE, True, TIME, retime=True),
]

#: cheats that take more than one evaluation at once: judged in a batch only
APART = [
    Cheat("collude_dev_shm", "kb_outer_tanh", "two candidates colluding through shared memory", defence=TIME),
]

GPU_KB = "gpu_kb_mm_tanh"
GPU_CHEATS = [
    Cheat("gpu_event_elapsed_time", GPU_KB, "timer patch (CUDA events)", NEXT, lasting=True, defence=TIME),
    Cheat("gpu_side_stream", GPU_KB, "side stream", defence=TIME),
    Cheat("gpu_kernel_left_running", GPU_KB, "work left on the device", defence=TIME),
    Cheat("gpu_allocator_snapshot", GPU_KB, "stale device memory", defence=DATA),
    Cheat("gpu_cuda_ipc_daemon", GPU_KB, "CUDA IPC", ("speed", "daemon"), defence=SANDBOX),
    Cheat("gpu_lazy_tensor_clone_proxy", GPU_KB, "lazy output (tensor subclass)", defence=DATA),
    Cheat("gpu_reply_patch_harness", GPU_KB, "reply path patched (harness)", defence=DATA),
    Cheat("gpu_thread_after_return", GPU_KB, "background thread, own stream", defence=TIME),
    Cheat("gpu_finalizer_next_round", GPU_KB, "work in a finalizer", defence=TIME),
    Cheat("gpu_cuda_graph_replay", GPU_KB, "CUDA-graph replay", defence=DATA),
    Cheat("gpu_torch_compile_replay", GPU_KB, "torch.compile replay", defence=DATA),
    Cheat("gpu_l2_persisting_window", GPU_KB, "persisting-L2 access window", defence=DATA),
    Cheat("gpu_empty_reference_output", GPU_KB, "empty() holding a freed output", defence=DATA),
    Cheat("gpu_zeroed_inputs_timed", GPU_KB, "zeroed inputs", defence=DATA),
    Cheat("gpu_driver_stream", GPU_KB, "side stream made through the driver API", defence=TIME),
    Cheat("gpu_round_prefetch", GPU_KB, "a round answered from its first call, side stream", defence=TIME),
    Cheat("gpu_work_under_l2_flush", GPU_KB, "work hidden under the harness's L2 flush", defence=TIME),
    Cheat("gpu_ipc_kept_storage", GPU_KB, "inputs watched in memory kept past its round", defence=DATA),
]
