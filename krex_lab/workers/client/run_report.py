"""How ``krex run`` ends: what ``python`` would have printed at the end, plus what only KREX knows,
and the exit code. One definition for both ways a run goes (:mod:`.run_cli`, :mod:`.fast_run`);
the standard library only, so that the short way pays for nothing it does not use."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # `typing` costs `krex run`'s start; the checker alone reads these names
if TYPE_CHECKING:
    from typing import Any

    from ..results import JobResult


def report(result: JobResult | Any, quiet: bool = False) -> int:
    """Print what ``python`` would have printed at the end, plus what only KREX knows; the exit code."""
    never_ran = bool(result.error and result.error.startswith("exclusive=True"))
    if result.error and never_ran:
        import re

        # the region was never had (no arbiter, a refused request): the script did not run, and
        # the worker's frames that found it out are KREX's, not the script's
        why = re.sub(r"\bkrex_lab\.errors\.\w+: ", "", result.error.removeprefix("exclusive=True: "))
        print(f"krex run: --exclusive: {why}", file=sys.stderr)
    elif result.status in ("exception", "interrupted") and result.traceback:
        sys.stderr.write(result.traceback)
    elif result.status in ("died", "timeout", "failed", "cancelled") or (not result.ok and result.exit_code is None):
        print(f"krex run: {result.error}", file=sys.stderr)
    if result.notice and not never_ran:  # "ran without GPU exclusivity": it did not run at all
        print(f"krex run: {result.notice}", file=sys.stderr)
    if result.region and not quiet:
        print(result.region.summary(), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if result.exit_code is not None:
        return result.exit_code
    return 0 if result.ok else 1
