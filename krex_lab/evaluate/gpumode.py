"""The GPU MODE format (worker side; its cases are read by :mod:`.cases`).

A reference defines ``generate_input(**args)`` (the args of one case, its ``seed`` included),
``ref_kernel(data)`` and ``check_implementation(data, output)``; a submission defines
``custom_kernel(data)``. Cases are ``key: value; key: value`` lines, one case a line: tests
(checked) and benchmarks (checked once, then timed). Modes: ``test`` (tests only), ``benchmark``
(and time the benchmarks), ``leaderboard`` (also check the output of every timed run).
Nothing here imports torch: a problem that does not use it runs without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import ModuleType
from typing import Any, Literal

from .cases import format_case
from .checking import Target, Trial, run_trial
from .options import Job
from .outcomes import CheckOutcome
from .result import CaseResult
from .tensors import clone, poison_all, refill

__all__ = ["GpuMode"]


def _verdict(result: Any) -> tuple[bool, str]:
    """check_implementation's answer, in any of GPU MODE's shapes: (ok, message), a bool, or a
    message that is empty when it passed."""
    if isinstance(result, tuple) and result:
        return bool(result[0]), str(result[1]) if len(result) > 1 and result[1] else ""
    if isinstance(result, str):
        return result == "", result
    if result is None:
        return True, ""
    return bool(result), ""


class GpuMode:
    format = "gpumode"

    def __init__(self, job: Job, reference: ModuleType, device: str, ref_files: set[str]) -> None:
        from .kernelbench import MissingDefinition

        self.job, self.ref_files = job, ref_files
        missing = [n for n in ("generate_input", "ref_kernel", "check_implementation") if not hasattr(reference, n)]
        if missing:
            raise MissingDefinition(f"the reference defines no {', '.join(missing)} (GPU MODE)")
        self.generate: Callable[..., Any] = reference.generate_input
        self.reference: Callable[[Any], Any] = reference.ref_kernel
        self.checker = reference.check_implementation
        self.tests = list(job.tests) or [dict(c) for c in getattr(reference, "TESTS", [])]
        self.benchmarks = list(job.benchmarks) or [dict(c) for c in getattr(reference, "BENCHMARKS", [])]
        if not self.tests and not self.benchmarks:
            raise MissingDefinition(
                "no test or benchmark cases: pass tests=/benchmarks=, or define TESTS in the reference"
            )

    def attach(self, candidate: ModuleType) -> None:
        from .kernelbench import MissingDefinition

        if not hasattr(candidate, "custom_kernel"):
            raise MissingDefinition("the candidate defines no 'custom_kernel' (GPU MODE: a submission needs it)")
        self.custom_kernel: Callable[[Any], Any] = candidate.custom_kernel

    def _check(self, data: Any, output: Any) -> tuple[bool, str]:
        return _verdict(self.checker(data, output))

    def _trial(self, data: Any, previous: Any = None) -> Trial:
        return run_trial(
            data,
            self.custom_kernel,
            self.reference,
            atol=self.job.options.atol,
            rtol=self.job.options.rtol,
            reference_files=self.ref_files,
            checker=self._check,
            previous=previous,
        )

    def check(self) -> CheckOutcome:
        """Every test case (and, unless in test mode, every benchmark case) once; then the last
        case's buffers refilled with another seed's values (a cache keyed on them is caught)."""
        mode = self.job.options.mode
        cases: list[tuple[Literal["test", "benchmark"], dict[str, Any]]] = [("test", c) for c in self.tests]
        if mode != "test":
            cases += [("benchmark", c) for c in self.benchmarks]
        results: list[CaseResult] = []
        out = CheckOutcome(correct=True, trials="")
        data: Any = None
        last: dict[str, Any] | None = None
        earlier: list[Any] = []  # every earlier output, alive: see run_trial's ``previous``
        for kind, case in cases:
            data = self.generate(**case)
            trial = self._trial(data, earlier)
            earlier.append(trial.output)
            results.append(CaseResult(spec=format_case(case), kind=kind, passed=trial.ok, message=trial.issue or None))
            if trial.rejected:
                out.rejected = trial.rejected
            if not trial.ok:
                out.correct = False
                if trial.issue:
                    out.issue = f"{kind} case {format_case(case)}: {trial.issue}"
                break
            last = case
        if out.correct and last is not None and "seed" in last:
            refill(data, self.generate(**{**last, "seed": int(last["seed"]) + 1000}))
            again = self._trial(data, earlier)
            if not again.ok:
                out.correct = False
                out.rejected = again.rejected or {
                    "cached_results": "the candidate returned a stale result when its input buffers were "
                    "refilled with new values (it caches results across calls)"
                }
                out.issue = again.issue
        if data is not None:
            poison_all(data)
        passed = sum(1 for r in results if r.passed)
        out.trials = f"({passed} / {len(cases)})"
        out.cases = results
        return out

    def targets(self) -> list[Target]:
        if self.job.options.mode == "test":
            return []
        out: list[Target] = []
        for case in self.benchmarks:
            data = self.generate(**case)
            pristine, ref_data = clone(data), clone(data)
            check: Callable[[Any], None] | None = None
            if self.job.options.mode == "leaderboard":

                def check(output: Any, pristine: Any = pristine, case: Mapping[str, Any] = case) -> None:
                    good, message = self._check(clone(pristine), output)
                    if not good:
                        raise AssertionError(f"leaderboard recheck failed on {format_case(case)}: {message}")

            out.append((format_case(case), partial(self.custom_kernel, data), partial(self.reference, ref_data), check))
        return out

    def close(self) -> None:
        pass
