"""A candidate's traceback as its author reads it: the frames of their own code (and of the
libraries it called), none of the harness that ran it. The text comes from the candidate's
process, so it is only shown, never trusted."""

from __future__ import annotations

import os
import re

#: the package's own directory: a frame there is the harness's, not the user's
_HARNESS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+')
_HEADER = "Traceback (most recent call last):"


def _harness(path: str) -> bool:
    return path.startswith(_HARNESS + os.sep) or path.startswith("<frozen ")


def user_traceback(text: str) -> str:
    """``text`` (``traceback.format_exception``'s) without the harness's frames; a traceback
    header left with no frame under it goes too."""
    out: list[str] = []
    dropping = False
    for line in text.splitlines():
        frame = _FRAME.match(line)
        if frame:
            dropping = _harness(frame["path"])
        elif not line.startswith("    "):
            dropping = False  # the exception's own lines, or the next chained traceback
        if not dropping:
            out.append(line)
    kept: list[str] = []
    for i, line in enumerate(out):
        if line == _HEADER and not (i + 1 < len(out) and _FRAME.match(out[i + 1])):
            continue
        kept.append(line)
    return "\n".join(kept)
