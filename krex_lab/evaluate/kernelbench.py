"""The KernelBench format (worker side).

A reference defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``; a
candidate defines ``class ModelNew``, usually with kernels built by
``torch.utils.cpp_extension.load_inline`` or Triton. As KernelBench does: both models are built
from the same init inputs after the same seed (so their parameters match), inputs are drawn after
``torch.manual_seed(trial seed)`` on the host and moved to the device, everything runs under
``torch.no_grad()``; a trial passes when every output is within the tolerances of the reference's.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .checking import Target, Trial, run_trial
from .options import Job
from .outcomes import CheckOutcome
from .tensors import move, poison_all, refill

__all__ = ["KernelBench", "MissingDefinition"]


class MissingDefinition(Exception):
    """A program lacks a name its format requires."""


def _need(module: ModuleType, name: str, what: str) -> Any:
    if not hasattr(module, name):
        raise MissingDefinition(f"the {what} defines no {name!r} (KernelBench: {what} needs it)")
    return getattr(module, name)


class KernelBench:
    format = "kernelbench"

    def __init__(self, job: Job, reference: ModuleType, device: str, ref_files: set[str]) -> None:
        import torch

        self.job, self.device, self.ref_files = job, device, ref_files
        self.get_inputs = _need(reference, "get_inputs", "reference")
        init = _need(reference, "get_init_inputs", "reference")
        model_cls = _need(reference, "Model", "reference")
        seed = job.options.seed
        torch.manual_seed(seed)
        self.init_inputs = list(init())
        torch.manual_seed(seed)
        self.model = model_cls(*self.init_inputs)
        if isinstance(self.model, torch.nn.Module):
            self.model = self.model.to(device)
        self.model_new: Any = None

    def attach(self, candidate: ModuleType) -> None:
        """``ModelNew(*init inputs)`` after the reference's seed (a build here is the candidate's)."""
        import torch

        model_new_cls = _need(candidate, "ModelNew", "candidate")
        torch.manual_seed(self.job.options.seed)
        model = model_new_cls(*self.init_inputs)
        self.model_new = model.to(self.device) if isinstance(model, torch.nn.Module) else model

    def inputs(self, seed: int) -> list[Any]:
        import torch

        torch.manual_seed(seed)
        return list(move(list(self.get_inputs()), self.device))

    def check(self) -> CheckOutcome:
        """KernelBench's correctness: ``trials`` seeded trials, then the same buffers refilled."""
        import torch

        opts = self.job.options
        n = max(1, opts.trials)
        passed = 0
        trial: Trial | None = None
        data: list[Any] = []
        earlier: list[Any] = []  # every earlier output, alive: see run_trial's ``previous``
        with torch.no_grad():
            for k in range(n):
                data = self.inputs(opts.seed + k)
                trial = self._trial(data, earlier)
                earlier.append(trial.output)
                if not trial.ok:
                    break
                passed += 1
            out = self._outcome(trial, passed, n)
            if out.correct:
                # A candidate that keys a cache on its inputs' addresses passes fresh trials and
                # times its cache: the same buffers with new values must give the new answer.
                refill(data, self.inputs(opts.seed + 1000))
                again = self._trial(data, earlier)
                if not again.ok:
                    out = self._outcome(again, passed, n)
                    out.rejected = out.rejected or {
                        "cached_results": "the candidate returned a stale result when its input buffers were "
                        "refilled with new values (it caches results across calls)"
                    }
            poison_all(data)
        return out

    def _trial(self, data: list[Any], previous: Any) -> Trial:
        return run_trial(
            data,
            lambda d: self.model_new(*d),
            lambda d: self.model(*d),
            atol=self.job.options.atol,
            rtol=self.job.options.rtol,
            reference_files=self.ref_files,
            previous=previous,
        )

    @staticmethod
    def _outcome(trial: Trial | None, passed: int, n: int) -> CheckOutcome:
        out = CheckOutcome(correct=bool(trial and trial.ok and passed == n), trials=f"({passed} / {n})")
        if trial is not None:
            out.max_difference, out.avg_difference = trial.max_difference, trial.avg_difference
            out.issue, out.rejected = trial.issue, trial.rejected
        return out

    def targets(self) -> list[Target]:
        """What to time: (case, candidate call, reference call, per-run check) with fixed inputs."""
        inputs = self.inputs(self.job.options.seed)
        cand_inputs, ref_inputs = inputs, [x.clone() if hasattr(x, "clone") else x for x in inputs]
        return [(None, lambda: self.model_new(*cand_inputs), lambda: self.model(*ref_inputs), None)]

    def close(self) -> None:
        self.model = self.model_new = None
