"""``krex eval REFERENCE CANDIDATE`` and ``krex eval --batch MANIFEST --jobs N``.

One pair: a human-readable verdict (``--json``: the :class:`Evaluation` as one JSON object); exit
0 when the candidate is correct, 1 for any other verdict. A batch: one JSON line per pair on
stdout (or ``--output FILE``), as each finishes, a progress bar on stderr when it is a terminal,
exit 0 once every pair has its line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

import msgspec

from ..workers.client.run_cli import _positive  # seconds > 0, as krex run --timeout takes them
from .options import EvaluateOptions

if TYPE_CHECKING:
    from .batch import BatchRecord
    from .result import Evaluation

__all__ = ["add_arguments", "run"]


def _mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid MiB: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is >= 0, not {text!r}")
    return value


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid tolerance: {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"a tolerance is >= 0, not {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "reference",
        nargs="?",
        help="the reference program (KernelBench Model, GPU MODE reference.py), or a GPU MODE problem's directory "
        "(its task.yml)",
    )
    p.add_argument("candidate", nargs="?", help="the candidate (KernelBench ModelNew, GPU MODE submission)")
    p.add_argument("--batch", metavar="MANIFEST", help="evaluate every pair of MANIFEST ('-': stdin); JSON lines out")
    p.add_argument("--jobs", "-j", type=_count, default=1, metavar="N", help="with --batch: N evaluations at once")
    p.add_argument("--output", "-o", metavar="FILE", help="with --batch: write the JSON lines to FILE")
    p.add_argument(
        "--format",
        default="auto",
        choices=["auto", "kernelbench", "gpumode"],
        help="default: told by the names defined",
    )
    p.add_argument("--json", action="store_true", help="one pair: the whole result as JSON")
    p.add_argument("--gpu", type=int, default=None, help="the GPU (default: the pool picks)")
    p.add_argument(
        "--timing",
        default="format",
        choices=["format", "bench", "converge"],
        help="format: the format's own method (default); bench: krex_lab.bench's; converge: GPU MODE's until the "
        "mean's relative standard error is 0.1 %% or --max-case-s",
    )
    p.add_argument("--max-case-s", type=_positive, default=None, metavar="S", help="timing seconds per case at most")
    p.add_argument("--strict", action="store_true", help="re-check the output of every timed call")
    p.add_argument("--seed", type=_seed, default=None, help="the inputs' seed (default: a secret one, said in --json)")
    p.add_argument("--atol", type=_tolerance, default=None, help="absolute tolerance (default: by the output's dtype)")
    p.add_argument("--rtol", type=_tolerance, default=None, help="relative tolerance (default: by the output's dtype)")
    p.add_argument("--no-timing", dest="measure", action="store_false", help="compile and check only")
    p.add_argument("--trials", type=_count, default=None, help="correctness trials (KernelBench: 5)")
    p.add_argument("--perf-trials", type=_count, default=None, help="KernelBench's timed calls (100)")
    p.add_argument("--mode", default="benchmark", choices=["test", "benchmark", "leaderboard"], help="GPU MODE's mode")
    p.add_argument("--tests", metavar="FILE", help="GPU MODE test cases ('key: value; ...' lines)")
    p.add_argument("--benchmarks", metavar="FILE", help="GPU MODE benchmark cases")
    p.add_argument("--retime-reference", action="store_true", help="time the reference again, cached or not")
    p.add_argument("--no-reference-timing", dest="time_reference", action="store_false", help="no reference time")
    for phase, default in (("load", 600), ("check", 300), ("time", 300)):
        p.add_argument(
            f"--{phase}-timeout",
            type=_positive,
            default=None,
            metavar="S",
            help=f"time limit of the {phase} phase (default {default} s)",
        )
    p.add_argument("--no-region", dest="exclusive", action="store_false", help="time without a region (shared GPU)")
    memory = p.add_argument_group("with --batch: admission by GPU memory")
    memory.add_argument(
        "--memory-reserve-mb",
        type=_mib,
        default=1024,
        metavar="MIB",
        help="GPU memory kept free on every GPU beyond the admitted evaluations' footprints (default 1024)",
    )
    memory.add_argument(
        "--memory-unknown-mb",
        type=_count,
        default=2048,
        metavar="MIB",
        help="the least footprint an evaluation of a problem not measured yet is admitted with (it counts "
        "the largest measured so far where that is more; default 2048)",
    )
    memory.add_argument(
        "--memory-attempts",
        type=_count,
        default=4,
        metavar="N",
        help="runs of a pair at most while its out-of-memory errors are someone else's (default 4)",
    )
    memory.add_argument(
        "--memory-give-back-workers",
        action="store_true",
        help="when none could start for 5 s and the first waiting pair needs more memory than any GPU has free, "
        "let the pool keep half as many workers per GPU (down to what runs, at least 1), so that the idle ones' "
        "GPU contexts give their memory back (off by default)",
    )
    memory.add_argument(
        "--no-memory-admission",
        dest="memory_admission",
        action="store_false",
        help="start evaluations as workers are free, whatever the GPU's memory",
    )


def _options(args: argparse.Namespace) -> EvaluateOptions:
    """The flags as the evaluation's options, checked (ValueError names a bad one)."""
    timeouts = {
        phase: getattr(args, f"{phase}_timeout")
        for phase in ("load", "check", "time")
        if getattr(args, f"{phase}_timeout") is not None
    }
    options: dict[str, object] = {
        "format": args.format,
        "gpu": args.gpu,
        "timing": args.timing,
        "measure": args.measure,
        "trials": args.trials,
        "perf_trials": args.perf_trials,
        "mode": args.mode,
        "tests": args.tests,
        "benchmarks": args.benchmarks,
        "retime_reference": args.retime_reference,
        "time_reference": args.time_reference,
        "exclusive": args.exclusive,
        "strict": args.strict,
    }
    for name in ("seed", "atol", "rtol", "max_case_s"):  # given only: a batch line's own value stands
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if timeouts:
        options["timeouts"] = timeouts
    return EvaluateOptions.of(options)


def shown(text: str) -> str:
    """Text a candidate may have written, as a terminal is to show it: control and formatting
    characters (escape sequences, carriage returns, bidirectional overrides) as their escapes,
    never obeyed (a candidate's message could otherwise erase the verdict and print its own)."""
    return "".join(c if c in "\n\t" or c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def human(ev: Evaluation) -> str:
    """The verdict as a person reads it: the summary, then what explains it (:func:`shown`)."""
    return shown(_human(ev))


def _human(ev: Evaluation) -> str:
    lines = [ev.summary]
    facts = f"  format {ev.format}; compiled {ev.compiled}; correctness {ev.correctness}"
    if "reference_error" in ev.metadata:  # the candidate was never loaded: nothing of it to say
        facts = f"  format {ev.format}; the candidate was not run"
    trials = ev.metadata.get("correctness_trials")  # none where the candidate was never checked
    lines.append(f"{facts}; trials {trials}" if trials else facts)
    if ev.runtime > 0:
        st = ev.runtime_stats
        spread = f" (std {st.std:.2f}, min {st.min:.2f}, max {st.max:.2f}, {st.num_trials} trials)" if st else ""
        lines.append(f"  runtime {ev.runtime:.2f} us{spread}; method {ev.timing_method}")
    if ev.ref_runtime > 0:
        lines.append(f"  reference {ev.ref_runtime:.2f} us; speedup {ev.speedup}")
    for case in [*ev.tests, *ev.benchmarks]:
        timing = f" mean {case.mean:.2f} us ± {case.err:.2f} over {case.runs} runs" if case.mean is not None else ""
        lines.append(
            f"  {case.kind} [{case.spec}]: {'pass' if case.passed else 'FAIL' if case.passed is False else '-'}{timing}"
        )
    for key in ("compilation_error", "runtime_error", "correctness_issue", "timeout", "worker_died", "rejected"):
        if key in ev.metadata:
            text = ev.metadata[key] if isinstance(ev.metadata[key], str) else json.dumps(ev.metadata[key])
            lines.append(f"  {key}: " + "\n    ".join(text.splitlines()[:20]))
    reports = ev.region_reports()
    if reports:
        lines.append(f"  region: {reports[0].summary()}")
    lines += [f"  warning: {w}" for w in ev.warnings]
    if ev.output:
        lines.append("  candidate output: " + "\n    ".join(ev.output.splitlines()[:10]))
    return "\n".join(lines)


def _refuse(args: argparse.Namespace, exc: BaseException) -> int:
    """A call that cannot be evaluated: one line on stderr and, with ``--json``, the same as JSON
    on stdout (an ``error`` field, as ``krex status --json``); exit 2 for a bad call, else 1."""
    from ..errors import exit_code, fail_as_json

    if args.json:
        return fail_as_json("krex eval", exc)
    print(f"krex eval: {exc}", file=sys.stderr)
    return exit_code(exc)


def run(args: argparse.Namespace) -> int:
    from ..errors import KrexError

    try:
        options = _options(args)
    except ValueError as exc:
        return _refuse(args, exc)
    if args.batch:
        if args.reference or args.candidate:
            return _refuse(args, ValueError("--batch takes no REFERENCE CANDIDATE"))
        return _batch(args, options)
    if not (args.reference and args.candidate):
        return _refuse(args, ValueError("REFERENCE and CANDIDATE are required (or --batch MANIFEST)"))
    from .api import evaluate

    try:
        ev = evaluate(args.reference, args.candidate, options=options)
    except (FileNotFoundError, ValueError, TypeError, KrexError) as exc:
        return _refuse(args, exc)
    print(ev.to_json() if args.json else human(ev))
    return 0 if ev.verdict == "correct" else 1


def _batch(args: argparse.Namespace, options: EvaluateOptions) -> int:
    from dataclasses import replace

    from ..errors import KrexError
    from ..workers.client import default_client
    from .admission import MemoryPolicy
    from .batch import parse_manifest, run_batch

    if args.batch == "-":
        text, base = sys.stdin.read(), os.getcwd()
    else:
        try:
            with open(args.batch) as f:
                text = f.read()
        except OSError as exc:
            return _refuse(args, FileNotFoundError(f"cannot read the manifest: {exc}"))
        base = os.path.dirname(os.path.abspath(args.batch))
    pairs = parse_manifest(text, base)
    out = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115
    try:

        def emit(record: BatchRecord) -> None:
            out.write(msgspec.json.encode(record).decode() + "\n")
            out.flush()

        try:
            pool = default_client()
        except KrexError as exc:  # every pair still gets its line, saying why
            pairs = [p if p.problem else replace(p, problem=f"no pool: {exc}") for p in pairs]
            pool = None
        memory = MemoryPolicy(
            reserve_mb=args.memory_reserve_mb,
            unknown_footprint_mb=args.memory_unknown_mb,
            attempts=args.memory_attempts,
            enabled=args.memory_admission,
            give_back_workers=args.memory_give_back_workers,
        )
        verdicts = run_batch(pairs, jobs=args.jobs, defaults=options, pool=pool, emit=emit, memory=memory)
    finally:
        if out is not sys.stdout:
            out.close()
    counts = ", ".join(f"{n} {v}" for v, n in verdicts.most_common())
    print(f"krex eval: {len(pairs)} pair(s) evaluated: {counts or 'none'}", file=sys.stderr)
    return 0
