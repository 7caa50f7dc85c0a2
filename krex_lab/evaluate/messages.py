"""What the judge and the candidate's process say to each other: one struct per operation.

Each message over the channel (:mod:`.channel`) is an operation's name and its body; the body is
one of the structs below, checked field by field as it is read (:meth:`.channel.Envelope.read`),
so a side that sends a body of the wrong shape is told so in words, and nothing of it is used.
The candidate's process is hostile: whatever it sends the judge is decoded as the body the judge
asked for or refused, never taken as it came.

Arrays are never in a body: they cross as descriptors beside it (:class:`.channel.ArrayDesc`),
and bodies name them by number in value trees (:func:`.channel.encode_tree`), which
:func:`.channel.decode_tree` checks as it reads them. This module imports nothing of the
package, so both sides load it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

__all__ = [
    "REQUESTS",
    "Body",
    "Calibrate",
    "Calibrated",
    "Call",
    "CallAgain",
    "CallEntry",
    "Confine",
    "Confined",
    "Drop",
    "Failed",
    "Load",
    "Loaded",
    "Ok",
    "Quit",
    "Ready",
    "Release",
    "Returned",
    "Round",
    "Timed",
]

#: a value tree (:func:`.channel.encode_tree`): checked by :func:`.channel.decode_tree` as it is read
Tree = Any


class Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A message's body; ``op`` names the operation it goes with."""

    op: ClassVar[str]


class CallEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One call's input set: its arguments, its output buffers (an array's tree, or a scalar's
    place), and which of the message's arrays are its inputs."""

    args: Tree
    outs: list[Tree]
    ins: list[int]


# -- the judge's requests --------------------------------------------------------------------------


class Confine(Body):
    """The sandbox's file part, before any candidate code (:mod:`.candidate.sandbox`)."""

    op: ClassVar[str] = "confine"
    build_dir: str
    scratch: str
    readable: list[str]
    #: files it may write into, never replace (its output file)
    files: list[str] = []


class Load(Body):
    """The candidate compiled and imported, its model built, under its limits."""

    op: ClassVar[str] = "load"
    format: str
    source: str
    filename: str
    module: str
    build_dir: str
    path: list[str]
    init: Tree
    init_seed: int
    output_path: str
    load_file_limit: int
    memory_limit_mb: int
    #: the format's TF32/cuDNN switches (:mod:`.numerics`); None: torch's defaults
    numerics: dict[str, bool | str] | None = None


class Call(Body):
    """The candidate once, on the set that comes with the message."""

    op: ClassVar[str] = "call"
    set: CallEntry


class CallAgain(Body):
    """The last call's inputs again (the judge has refilled their memory)."""

    op: ClassVar[str] = "call_again"


class Round(Body):
    """Timed calls on the sets in ``order``; ``sets``: the round's own, else the last round's."""

    op: ClassVar[str] = "round"
    order: list[int]
    method: str
    sets: list[CallEntry] | None = None


class Calibrate(Body):
    """The harness alone on a no-op, ``calls`` calls (to the calibration twin only)."""

    op: ClassVar[str] = "calibrate"
    calls: int
    method: str
    sets: list[CallEntry] | None = None
    #: keep the sets until a ``drop`` (let go between rounds, as the candidate then does)
    keep: bool = False


class Calibrated(Body):
    """The calibration is over: its outputs let go."""

    op: ClassVar[str] = "calibrated"


class Drop(Body):
    """The round's sets let go."""

    op: ClassVar[str] = "drop"


class Release(Body):
    """Every array the judge shared let go (CUDA IPC memory is freed only once released)."""

    op: ClassVar[str] = "release"


class Quit(Body):
    op: ClassVar[str] = "quit"


#: what the candidate's process takes, by operation
REQUESTS: dict[str, type[Body]] = {
    b.op: b for b in (Confine, Load, Call, CallAgain, Round, Calibrate, Calibrated, Drop, Release, Quit)
}


# -- the candidate's process's answers ------------------------------------------------------------


class Ready(Body):
    """A spare's context is made: what its sandbox held."""

    op: ClassVar[str] = "ready"
    pid: int
    device: str
    sandbox: dict[str, str] = {}


class Confined(Body):
    op: ClassVar[str] = "confined"
    sandbox: dict[str, str]


class Loaded(Body):
    op: ClassVar[str] = "loaded"


class Ok(Body):
    op: ClassVar[str] = "ok"


class Returned(Body):
    """A call is over: its scalars (its arrays are in the judge's buffers), the inputs its value
    lay in, the threads still running the candidate's code."""

    op: ClassVar[str] = "returned"
    values: list[Any]
    aliased: list[int]
    threads: list[str]


class Timed(Body):
    """A round is over: each call's time in µs as measured in-process (none for a warm-up), and
    for each call what :class:`Returned` says of one."""

    op: ClassVar[str] = "timed"
    samples: list[float]
    values: list[Any]
    aliased: list[list[int]]
    threads: list[str]
    #: the harness's host time in each part of the round's calls, µs in all (``launch``: the L2
    #: flush and the events; ``call``; ``deliver``; ``sync``): what the process says, shown in
    #: ``metadata.timing_split_us`` beside the judge's own figures, never used for one
    parts_us: dict[str, float] = {}


class Failed(Body):
    """The operation raised (the candidate's code, or the harness on a bad request)."""

    op: ClassVar[str] = "failed"
    kind: str
    message: str
    traceback: str = ""
    #: the message of a sticky CUDA error, if it was one
    sticky: str | None = None
    oom: bool = False
