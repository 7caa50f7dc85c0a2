"""The judge's half of each format: inputs, the reference's answer, and what a right answer is.

* KernelBench: the reference defines ``Model``, ``get_inputs()``, ``get_init_inputs()``. The
  init inputs are drawn after ``torch.manual_seed(init_seed)`` (public: the candidate builds its
  ``ModelNew`` from them after the same seed, so the parameters match); every trial's inputs are
  drawn on the device after a seed the candidate never sees. One case (``None``).
* GPU MODE: ``generate_input(**case)``, ``ref_kernel(data)``, ``check_implementation(data,
  output)``. Each case's ``seed`` is mixed with the judge's secret before it reaches
  ``generate_input``, so no candidate can precompute the cases.

Everything here runs in the judge; no candidate object ever reaches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from ..cases import format_case
from ..options import Case, Job
from .tensors import arrays, clone, seed_torch

__all__ = ["GpuModeProblem", "KernelBenchProblem", "MissingDefinition", "Problem", "problem_for"]


class MissingDefinition(Exception):
    """A program lacks a name its format requires."""


def _need(module: ModuleType, name: str, what: str) -> Any:
    if not hasattr(module, name):
        raise MissingDefinition(f"the {what} defines no {name!r} (KernelBench: {what} needs it)")
    return getattr(module, name)


@contextlib.contextmanager
def _on(device: str) -> Iterator[None]:
    """Factory functions allocate on ``device`` (inputs made where they are used: no host copy)."""
    if device == "cpu":
        yield
        return
    import torch

    with torch.device(device):
        yield


class Problem:
    format = ""
    #: (kind, case) to check; the cases to time
    check_cases: list[tuple[str, Case | None]]
    time_cases: list[Case | None]

    def make(self, case: Case | None, seed: int) -> Any:
        raise NotImplementedError

    def args(self, data: Any) -> Any:
        """What the candidate is called with."""
        return data

    def reference(self, data: Any) -> Any:
        raise NotImplementedError

    #: None: compare with tolerances; else the format's own check (data, output) -> (ok, message)
    checker: Callable[[Any, Any], tuple[bool, str]] | None = None

    def case_name(self, case: Case | None) -> str | None:
        return None if case is None else format_case(case)

    def init_tree(self) -> Any:
        return []


class KernelBenchProblem(Problem):
    format = "kernelbench"

    def __init__(self, job: Job, reference: ModuleType, device: str) -> None:
        import torch

        self.job, self.device = job, device
        self.get_inputs = _need(reference, "get_inputs", "reference")
        init = _need(reference, "get_init_inputs", "reference")
        model_cls = _need(reference, "Model", "reference")
        self.init_seed = job.options.init_seed
        seed_torch(self.init_seed)
        self.init_inputs = list(init())
        seed_torch(self.init_seed)
        self.model = model_cls(*self.init_inputs)
        if isinstance(self.model, torch.nn.Module):
            self.model = self.model.to(device)
        self.check_cases = [("trial", None)] * max(1, job.options.trials)
        self.time_cases = [None]

    def make(self, case: Case | None, seed: int) -> Any:
        import torch

        seed_torch(seed)
        with _on(self.device):
            data = list(self.get_inputs())
        return [x.to(self.device) if isinstance(x, torch.Tensor) and str(x.device) != self.device else x for x in data]

    def reference(self, data: Any) -> Any:
        return self.model(*data)

    def init_tree(self) -> Any:
        return self.init_inputs


def _verdict(result: Any) -> tuple[bool, str]:
    """GPU MODE's check result read as GPU MODE's harnesses read it (``wrap_check_implementation``
    in reference-kernels' eval.py): a tuple is ``(good, message)``; anything else is the error
    itself, the check passed when it is falsy (``''``, an empty list of mismatches, None, False).
    So a bare ``True`` is a failure there, and here."""
    if isinstance(result, tuple) and len(result) == 2:
        return bool(result[0]), str(result[1] or "")
    if not result:
        return True, ""
    if isinstance(result, (list, tuple)):
        return False, " ".join(str(x) for x in result)
    if result is True:
        return False, "check_implementation returned True (GPU MODE reads an answer that is not a tuple as its error)"
    return False, str(result)


class GpuModeProblem(Problem):
    format = "gpumode"

    def __init__(self, job: Job, reference: ModuleType, device: str, salt: int) -> None:
        missing = [n for n in ("generate_input", "ref_kernel", "check_implementation") if not hasattr(reference, n)]
        if missing:
            raise MissingDefinition(f"the reference defines no {', '.join(missing)} (GPU MODE)")
        self.job, self.device, self.salt = job, device, salt
        self.generate: Callable[..., Any] = reference.generate_input
        self.ref_kernel: Callable[[Any], Any] = reference.ref_kernel
        self.check_impl = reference.check_implementation
        tests = list(job.tests) or [dict(c) for c in getattr(reference, "TESTS", [])]
        benchmarks = list(job.benchmarks) or [dict(c) for c in getattr(reference, "BENCHMARKS", [])]
        if not tests and not benchmarks:
            raise MissingDefinition(
                "no test or benchmark cases: pass tests=/benchmarks=, or define TESTS in the reference"
            )
        self.check_cases = [("test", c) for c in tests]
        if job.options.mode != "test":
            self.check_cases += [("benchmark", c) for c in benchmarks]
        self.time_cases = [] if job.options.mode == "test" else list(benchmarks)

    def make(self, case: Case | None, seed: int) -> Any:
        case = dict(case or {})
        if "seed" in case:
            case["seed"] = (int(case["seed"]) * 1_000_003 + seed) % (1 << 31)
        return self.generate(**case)

    def reference(self, data: Any) -> Any:
        return self.ref_kernel(data)

    def checker(self, data: Any, output: Any) -> tuple[bool, str]:
        return _verdict(self.check_impl(data, output))


def problem_for(job: Job, reference: ModuleType, device: str, salt: int) -> Problem:
    if job.format == "kernelbench":
        return KernelBenchProblem(job, reference, device)
    return GpuModeProblem(job, reference, device, salt)


def nbytes(data: Any) -> int:
    return sum(int(x.nbytes) if hasattr(x, "nbytes") else 0 for x in arrays(data))


def copy_of(data: Any) -> Any:
    return clone(data)
