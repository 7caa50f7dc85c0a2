"""The check phase: the candidate on fresh inputs, judged from the judge's own buffers.

Per trial, fresh inputs drawn on the device under a seed of the judge's, moved into memory of their
own with output buffers the judge owns (:mod:`.buffers`); the candidate's side copies its value
into those before the call is over, and the judge reads only them and compares here (:mod:`.compare`).
Its inputs are compared with a private pristine copy (written into: rejected). Then the last
trial's buffers, refilled in place with new values, must give the new answer (a result cached by
address is stale there). Used by :mod:`.session`, whose judge it is given.
"""

from __future__ import annotations

import time
from typing import Any

from ..channel import Shared
from ..messages import Call, CallAgain, Returned
from ..options import Case
from ..outcomes import CheckOutcome, CheckResult
from ..result import CaseResult
from .buffers import CallSet, out_spec, share_set
from .compare import compare, same, tolerances
from .tensors import arrays, clone, synchronize
from .values import CandidateFailed

#: the judge of :mod:`.session` (not imported: the session imports the check phase)
Judge = Any

__all__ = ["call", "check", "trial_data"]


def _scalar(x: Any) -> bool:
    return not list(arrays(x))


def trial_data(judge: Judge, case: Case | None) -> tuple[Any, Any, Any, set[int]]:
    """(the data, its pristine copy, the reference's answer, the arrays the reference writes)."""
    assert judge.problem is not None
    data = judge.problem.make(case, judge.seed())
    synchronize()
    pristine = clone(data)
    ref_data = clone(pristine)
    expected = judge.problem.reference(ref_data)
    synchronize()
    written = {k for k, (a, b) in enumerate(zip(arrays(pristine), arrays(ref_data))) if not same(a, b)}
    return data, pristine, expected, written


def call(judge: Judge, data: Any, expected: Any) -> tuple[CallSet, Returned]:
    """The candidate on ``data`` (moved into memory of its own, with output buffers laid out as
    ``expected``): (the call's memory as the judge sees it, the answer's body)."""
    assert judge.problem is not None
    shared = Shared()
    cs = share_set(judge.problem, data, out_spec(expected), shared)
    synchronize()  # the copies and the poison done before the candidate's process touches them
    judge._last_call = cs
    return cs, judge.ask(Call(set=cs.entry), Returned, shared)


def _late_writes(cs: CallSet, read: Any) -> dict[str, str]:
    """The output buffers must still hold what the judge read when the call ended."""
    for k, (now, then) in enumerate(zip(cs.outs, list(arrays(read)))):
        if now is not None and not same(now, then):
            return {
                "outputs_written_late": f"output {k} changed after the call had returned (work left running "
                "past the call writes the answer afterwards)"
            }
    return {}


def _check_one(
    judge: Judge, kind: str, case: Case | None, first: bool = False
) -> tuple[bool, str, dict[str, str], Any]:
    assert judge.problem is not None
    data, pristine, expected, written = judge.first if first and judge.first else trial_data(judge, case)
    cs, body = call(judge, data, expected)
    out = cs.read(body.values)
    shared_data = cs.args
    rejected: dict[str, str] = {}
    changed = {k for k, (a, b) in enumerate(zip(arrays(pristine), cs.inputs)) if not same(a, b)}
    wrote = sorted(changed - written)
    if wrote:
        rejected["inputs_modified"] = f"the candidate wrote into its input(s) {wrote} (the reference does not)"
    judge.threads = body.threads
    if judge.threads:
        rejected["threads_left"] = (
            f"the candidate left thread(s) running its own code after it returned ({', '.join(judge.threads[:3])}): "
            "work a timer around the call would not see"
        )
    aliased = sorted(set(body.aliased) - written)
    if aliased:
        rejected["aliased_output"] = f"the candidate returned its input(s) {aliased} (or a view) as its output"
    rejected.update(_late_writes(cs, out))
    if judge.problem.checker is not None:
        ok, issue = judge.problem.checker(clone(pristine), out)
        judge.last_cmp = None
        return (
            ok and not rejected,
            issue or ("" if ok else "the reference's check_implementation failed"),
            rejected,
            shared_data,
        )
    exp = list(arrays(expected)) if not _scalar(expected) else []
    got = list(arrays(out)) if out is not None else []
    if not exp:
        ok = out == expected
        judge.last_cmp = None
        return ok and not rejected, "" if ok else f"got {out!r}, expected {expected!r}", rejected, shared_data
    a, r = tolerances(exp, judge.opts.atol, judge.opts.rtol)
    cmp = compare(got, exp, a, r)
    judge.last_cmp = cmp
    return cmp.ok and not rejected, cmp.issue, rejected, shared_data


def check(judge: Judge) -> CheckResult:
    """The check phase: every check case on fresh inputs, then one trial refilled in place."""
    judge.phase = "check"
    assert judge.problem is not None
    result = CheckResult()
    t0 = time.perf_counter()
    cases = judge.problem.check_cases
    passed = 0
    outcome = CheckOutcome(correct=True, trials="")
    results: list[CaseResult] = []
    last_case: Case | None = None
    try:
        for i, (kind, case) in enumerate(cases):
            ok, issue, rejected, _ = _check_one(judge, kind, case, first=i == 0)
            last_case = case
            if judge.problem.format == "gpumode" and case is not None:
                results.append(
                    CaseResult(
                        spec=judge.problem.case_name(case) or "",
                        kind="test" if kind == "test" else "benchmark",
                        passed=ok,
                        message=issue or None,
                    )
                )
            _absorb_cmp(judge, outcome)
            if rejected:
                outcome.rejected = rejected
            if not ok:
                outcome.correct = False
                name = judge.problem.case_name(case)
                outcome.issue = f"{kind} case {name}: {issue}" if name else issue
                break
            passed += 1
        if outcome.correct:
            _refilled_trial(judge, outcome, last_case)
    except CandidateFailed as exc:
        exc.record(result)
    result.seconds = round(time.perf_counter() - t0, 6)
    outcome.trials = f"({passed} / {len(cases)})"
    outcome.cases = results
    meta = result.metadata
    meta["correctness_trials"] = outcome.trials
    if outcome.max_difference is not None:
        meta["max_difference"] = outcome.max_difference
    if outcome.avg_difference is not None:
        meta["avg_difference"] = outcome.avg_difference
    if outcome.issue:
        meta["correctness_issue"] = outcome.issue
    if getattr(judge, "rule", None):
        meta["correctness_rule"] = judge.rule
    if getattr(judge, "threads", None):
        meta["threads_reported"] = ", ".join(judge.threads)
    result.cases = outcome.cases
    if result.verdict is None:
        if outcome.rejected:
            result.verdict = "rejected"
            meta["rejected"] = outcome.rejected
        elif not outcome.correct:
            result.verdict = "incorrect"
    return result


def _absorb_cmp(judge: Judge, outcome: CheckOutcome) -> None:
    cmp = getattr(judge, "last_cmp", None)
    if cmp is not None:
        outcome.max_difference, outcome.avg_difference = cmp.max_difference, cmp.avg_difference
        if cmp.rule:
            judge.rule = cmp.rule


def _refilled_trial(judge: Judge, outcome: CheckOutcome, case: Case | None) -> None:
    """The last trial's buffers, refilled in place with new values, must give the new answer:
    a result kept by address, ``_version`` or call count is stale there. A wrong answer that is
    not the one it gave for the old values is a wrong answer (a float32 sum of 52 million values
    rounds differently each time), not a stale one."""
    assert judge.problem is not None
    data = judge.problem.make(case, judge.seed())
    synchronize()
    expected = judge.problem.reference(clone(data))
    cs, body = call(judge, data, expected)
    before = cs.read(body.values)  # its answer for the old values, in the judge's own copies
    # the same memory, new values (the candidate still holds the arrays of its last call)
    fresh, fresh_pristine, fresh_expected, _ = trial_data(judge, case)
    for dst, src in zip(cs.inputs, arrays(fresh)):
        if hasattr(dst, "copy_"):
            dst.copy_(src)
        else:
            dst[...] = src
    cs.poison()
    synchronize()
    out = cs.read(judge.ask(CallAgain(), Returned).values)
    if judge.problem.checker is not None:
        ok, issue = judge.problem.checker(clone(fresh_pristine), out)
    else:
        exp = list(arrays(fresh_expected))
        a, r = tolerances(exp, judge.opts.atol, judge.opts.rtol)
        cmp = compare(list(arrays(out)) if out is not None else [], exp, a, r)
        ok, issue = cmp.ok, cmp.issue
    if ok:
        return
    outcome.correct = False
    if _same_answer(before, out):
        outcome.rejected = {
            "cached_results": "the candidate returned a stale result when its input buffers were refilled "
            "with new values (it caches results across calls)"
        }
        outcome.issue = issue
    else:
        outcome.issue = f"a trial refilled in place with new values: {issue}"


def _same_answer(a: Any, b: Any) -> bool:
    """Whether two answers of the candidate's are the same, bit for bit."""
    xs, ys = list(arrays(a)), list(arrays(b))
    if not xs and not ys:
        return bool(a == b)
    return len(xs) == len(ys) and all(same(x, y) for x, y in zip(xs, ys))
