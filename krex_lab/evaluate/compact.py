"""The verdict in under a kilobyte: :func:`compact` of an :class:`~.result.Evaluation`.

An agent that evaluates all day reads this after every call: the verdict, the speedup and times,
why it failed (the first lines of the reason), the first case or element that did not match, and
flags (cheats found, warnings, a timing that disagreed or did not converge). The whole result is
there on request (``krex mcp``'s ``detail: "full"``). Every text is cut to fit; :data:`LIMIT` is
the bound on the JSON, checked by the tests.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from .result import VERDICTS, Evaluation

__all__ = ["LIMIT", "Compact", "compact"]

#: bytes the compact result's JSON never exceeds
LIMIT = 1024

#: the metadata keys that say why a candidate failed, most telling first
REASONS = (
    "compilation_error",
    "runtime_error",
    "correctness_issue",
    "timeout",
    "worker_died",
    "cuda_error",
    "out_of_memory",
    "output_limit",
    "reference_error",
    "evaluation_error",
    "manifest_error",
)


def _doc(text: str, **schema: Any) -> msgspec.Meta:
    """A field's description (and any more of its JSON schema): what an agent reading the
    output schema is told."""
    return msgspec.Meta(description=text, extra_json_schema=schema or None)


class Compact(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The verdict and what explains it (times in microseconds; -1: not timed)."""

    verdict: Annotated[
        str,
        _doc(
            "correct: matched the reference on every trial; incorrect: ran, output differs; compile_error, "
            "runtime_error, crashed (its process died), timeout, out_of_memory; rejected: did what an honest "
            "kernel does not (see reason_key); error: the evaluation itself could not run",
            enum=list(VERDICTS),
        ),
    ]
    summary: Annotated[str, _doc("the verdict in one line, as `krex eval` prints it first")]
    format: Annotated[
        str, _doc("the programs' format: kernelbench or gpumode (as asked, auto, where the evaluation failed first)")
    ]
    speedup: Annotated[
        float | None, _doc("ref_runtime / runtime; absent where either was not timed (the candidate failed)")
    ] = None
    runtime: Annotated[float, _doc("the candidate's time per call, microseconds; -1: not timed")] = -1.0
    ref_runtime: Annotated[float, _doc("the reference's time per call, microseconds; -1: not timed")] = -1.0
    gpu_timed: Annotated[bool, _doc("true: times are the GPU's own; false: host-clock times (no GPU was timed)")] = (
        False
    )
    timing_method: Annotated[str | None, _doc("how the times were taken (the format's, bench, converge)")] = None
    reason_key: Annotated[
        str | None,
        _doc(
            "why it is not correct: the result's metadata key (compilation_error, runtime_error, "
            "correctness_issue, timeout, worker_died, cuda_error, out_of_memory, output_limit, "
            "reference_error, evaluation_error) or rejected:WHAT"
        ),
    ] = None
    reason: Annotated[str | None, _doc("the first lines of that reason, in words")] = None
    first_mismatch: Annotated[str | None, _doc("the first case or element that did not match the reference")] = None
    trials: Annotated[
        str | None,
        _doc('correctness trials passed of run (KernelBench) or tests passed of checked (GPU MODE): "(5 / 5)"'),
    ] = None
    flags: Annotated[
        list[str],
        _doc(
            "short names of what else was found: rejected:WHAT (a cheat), static:RULE, timing_disagreement, "
            "timing_bound, not_converged, no_gpu_timed, ref_runtime_cached, output_limit, warnings:N"
        ),
    ] = []
    evaluation: Annotated[dict[str, Any] | None, _doc('the whole result, with detail "full"; absent otherwise')] = None


def _cut(text: Any, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reason(ev: Evaluation) -> tuple[str | None, str | None]:
    rejected = ev.metadata.get("rejected")
    if ev.verdict == "rejected" and isinstance(rejected, dict) and rejected:
        key, why = next(iter(rejected.items()))
        return f"rejected:{key}", str(why)
    for key in REASONS:
        if key in ev.metadata and ev.verdict != "correct":
            return key, str(ev.metadata[key])
    return None, None


def _first_mismatch(ev: Evaluation) -> str | None:
    for case in [*ev.tests, *ev.benchmarks]:
        if case.passed is False:
            return f"{case.kind} [{case.spec}]: {case.message or 'failed'}"
    issue = ev.metadata.get("correctness_issue")
    return str(issue) if issue and ev.verdict == "incorrect" else None


def _flags(ev: Evaluation) -> list[str]:
    flags: list[str] = []
    rejected = ev.metadata.get("rejected")
    if isinstance(rejected, dict):
        flags += [f"rejected:{k}" for k in rejected]
    for key in ("timing_disagreement", "timing_bound", "ref_runtime_cached", "output_limit"):
        if key in ev.metadata:
            flags.append(key)
    static = ev.metadata.get("static_flags") or ev.metadata.get("flags")
    if isinstance(static, dict):
        flags += [f"static:{k}" for k in static]
    elif isinstance(static, list):
        flags += [f"static:{k}" for k in static if isinstance(k, str)]
    stats = [ev.runtime_stats] if ev.runtime_stats is not None else []
    if any(s.converged is False for s in stats) or any(c.converged is False for c in ev.benchmarks):
        flags.append("not_converged")
    if ev.runtime > 0 and not ev.gpu_timed:
        flags.append("no_gpu_timed")
    if ev.warnings:
        flags.append(f"warnings:{len(ev.warnings)}")
    return flags


def compact(ev: Evaluation, *, full: bool = False) -> Compact:
    """``ev`` in under :data:`LIMIT` bytes of JSON (with ``full``: and the whole result beside)."""
    key, why = _reason(ev)
    mismatch = _first_mismatch(ev)
    trials = ev.metadata.get("correctness_trials")
    flags = _flags(ev)
    scale = 1.0
    while True:  # texts cut shorter until the JSON fits (a character may take 4 bytes)

        def cut(text: Any, limit: int, scale: float = scale) -> str:
            return _cut(text, max(8, int(limit * scale)))

        out = Compact(
            verdict=ev.verdict,
            summary=cut(ev.summary, 200),
            format=ev.format,
            speedup=ev.speedup,
            runtime=round(ev.runtime, 3) if ev.runtime > 0 else -1.0,
            ref_runtime=round(ev.ref_runtime, 3) if ev.ref_runtime > 0 else -1.0,
            gpu_timed=ev.gpu_timed,
            timing_method=cut(ev.timing_method, 60) if ev.timing_method else None,
            reason_key=cut(key, 40) if key else None,
            reason=cut(why, 300) if why else None,
            first_mismatch=cut(mismatch, 200) if mismatch else None,
            trials=cut(trials, 20) if trials else None,
            flags=[cut(f, 40) for f in flags[: max(1, int(12 * scale))]] if flags else [],
        )
        if len(msgspec.json.encode(out)) <= LIMIT or scale < 0.05:
            break
        scale *= 0.7
    if full:
        out.evaluation = ev.to_dict()
    return out
