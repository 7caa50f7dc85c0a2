"""What a region enforced, as the arbiter reports it: :class:`RegionReport`, with its one-line summary.

The arbiter makes it (``Region.report``), the wire carries it (``protocol.Granted``, the reply
of ``Release``), every client returns it (``region.report``). Everything else that shows a
region is derived from this one class, so a new field is added here alone:

- the history database's columns (:func:`krex_lab.arbiter.history.columns`): one per field, a
  structured one (a list, a map, the shield) as JSON text; a field added here becomes a column
  when the arbiter opens its database;
- what another user may see of a region (:data:`PUBLIC`, the fields marked ``public``);
- the field reference ``docs/reference/region-report.md`` (:func:`reference`, kept equal by a test).

Each field is annotated with its meaning (``description``) and, in ``extra``, its ``unit`` and
whether it is ``public``. A time the arbiter did not measure (a step that did not run) is None.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta

_S = {"unit": "s"}
_PUB = {"public": True}
_PUB_S = {"unit": "s", "public": True}
_EPOCH = {"unit": "epoch s"}

#: the prefix of ``released_by`` when an admin ended the region (``Release(force=True)``)
REVOKED = "ended by admin"


class ShieldIntrusion(msgspec.Struct, kw_only=True):
    """A process that put its threads back on the region's reserved cores during the region."""

    pid: Annotated[int, Meta(description="the intruding process")] = 0
    user: Annotated[str, Meta(description="its owner")] = ""
    times: Annotated[int, Meta(description="how many looks found it there (each put it back)")] = 0
    seconds: Annotated[float, Meta(description="how long it was there in all, at most")] = 0.0


class ShieldReport(msgspec.Struct, kw_only=True):
    """What the region's shield (its reserved cores) did."""

    mode: Annotated[str, Meta(description="how the cores were reserved: sessions, affinity or cpuset")] = "sessions"
    partition: Annotated[str, Meta(description="the partition cgroup of cpuset mode ('' where none was made)")] = ""
    adopted: Annotated[str, Meta(description="the lingering shield this one took over ('' when it made its own)")] = ""
    lingers: Annotated[str, Meta(description="the name under which this shield stays up after the region")] = ""
    processes: Annotated[int, Meta(description="processes whose threads were moved off the reserved cores")] = 0
    kernel_threads_left: Annotated[
        int, Meta(description="kernel threads left on the reserved cores (per-CPU ones cannot move)")
    ] = 0
    irqs_moved: Annotated[int, Meta(description="interrupts steered off the reserved cores")] = 0
    notes: Annotated[
        list[str], Meta(description="why something could not be shielded (said, not a failure of the region)")
    ] = []
    intrusions: Annotated[
        list[ShieldIntrusion],
        Meta(description="processes that widened their affinity onto the reserved cores and were put back"),
    ] = []


class RegionReport(msgspec.Struct, kw_only=True):
    """What a region enforced (the arbiter's report), with a one-line :meth:`summary`.

    An empty report (``region == ""``) is a region that was never granted."""

    region: Annotated[str, Meta(description="the region's id on its arbiter (r1, r2, ...)", extra=_PUB)] = ""
    gpu: Annotated[int, Meta(description="the GPU's index (-1: none)", extra=_PUB)] = -1
    session: Annotated[str, Meta(description="the holder's session id")] = ""
    holder_pid: Annotated[int, Meta(description="the holder's pid, in the arbiter's pid namespace")] = 0
    uid: Annotated[int, Meta(description="the holder's uid (-1: unknown)")] = -1
    user: Annotated[str, Meta(description="the holder's user name", extra=_PUB)] = ""
    name: Annotated[str, Meta(description="the holder session's name (notebook, script, pool worker)")] = ""
    # -- the holder's Slurm job (an arbiter run with --slurm; None: not in a Slurm job) ----------
    slurm_job: Annotated[
        str | None, Meta(description="the holder's Slurm job id (one the node's prolog admitted for its user)")
    ] = None
    slurm_step: Annotated[str | None, Meta(description="the holder's Slurm step ('batch': the batch script)")] = None
    account: Annotated[str | None, Meta(description="the Slurm account of the holder's job (from the prolog)")] = None
    state: Annotated[str, Meta(description="queued, granting, held, releasing or released", extra=_PUB)] = ""
    exempted: Annotated[list[int], Meta(description="pids the request asked to leave running (`exempt=`)")] = []
    max_hold_s: Annotated[float, Meta(description="the lease: released by the arbiter after it", extra=_PUB_S)] = 0.0
    max_hold_asked_s: Annotated[
        float | None,
        Meta(description="the lease asked for, where the user's max_hold quota capped it to max_hold_s", extra=_S),
    ] = None
    # -- times the arbiter measured (None: the step did not run) --------------------------------
    wait_s: Annotated[float | None, Meta(description="time in the GPU's queue", extra=_PUB_S)] = None
    stopped_before_request_s: Annotated[
        float | None, Meta(description="time stopped as another region's intruder before it queued", extra=_S)
    ] = None
    drain_list_s: Annotated[float | None, Meta(description="listing the GPU's processes", extra=_S)] = None
    drain_lock_s: Annotated[float | None, Meta(description="taking the driver locks (lock_capable)", extra=_S)] = None
    drain_s: Annotated[float | None, Meta(description="the whole drain step", extra=_S)] = None
    freeze_s: Annotated[float | None, Meta(description="the freeze step", extra=_S)] = None
    isolate_s: Annotated[float | None, Meta(description="the isolation (core reservation) step", extra=_S)] = None
    acquire_s: Annotated[
        float | None, Meta(description="from leaving the queue to the grant (None: never granted)", extra=_S)
    ] = None
    settle_s: Annotated[float | None, Meta(description="until every stop had landed, after the grant", extra=_S)] = None
    unisolate_s: Annotated[float | None, Meta(description="giving the reserved cores back", extra=_S)] = None
    thaw_s: Annotated[float | None, Meta(description="thawing the frozen processes", extra=_S)] = None
    unlock_s: Annotated[float | None, Meta(description="releasing the driver locks", extra=_S)] = None
    undo_s: Annotated[float | None, Meta(description="the whole release", extra=_S)] = None
    hold_s: Annotated[
        float | None, Meta(description="from the grant to the release (None while held)", extra=_PUB_S)
    ] = None
    # -- what the region did ---------------------------------------------------------------------
    drained: Annotated[list[int], Meta(description="pids that synchronised their GPU work or were locked")] = []
    locked: Annotated[list[int], Meta(description="pids whose GPU work the driver lock stopped (lock_capable)")] = []
    no_lock_needed: Annotated[
        dict[str, str],
        Meta(description="pid -> why it needed no lock: already-locked, checkpointed or not-cuda (not a failure)"),
    ] = {}
    not_drained: Annotated[
        dict[str, str], Meta(description="pid -> why it could not be drained (the region is degraded)")
    ] = {}
    gone: Annotated[list[int], Meta(description="sessions that exited or ended while being drained")] = []
    intruders: Annotated[list[int], Meta(description="processes that began GPU work during the region")] = []
    frozen: Annotated[list[int], Meta(description="pids stopped (SIGSTOP or a frozen cgroup) for the region")] = []
    frozen_cgroups: Annotated[list[str], Meta(description="cgroups frozen for the region")] = []
    skipped_stopped: Annotated[
        list[int],
        Meta(description="pids already stopped (by someone, or another GPU's region): not asked to drain, left alone"),
    ] = []
    moved: Annotated[
        list[int], Meta(description="pids of other sessions whose threads were moved off the reserved cores")
    ] = []
    cores: Annotated[list[int], Meta(description="CPU cores reserved for the holder ([]: none)")] = []
    shield: Annotated[ShieldReport, Meta(description="what the core shield did (see ShieldReport below)")] = (
        msgspec.field(default_factory=ShieldReport)
    )
    failures: Annotated[
        list[str], Meta(description="enforcement steps that failed, in words (the region is degraded)")
    ] = []
    degraded: Annotated[
        bool, Meta(description="something was not drained, frozen or isolated: timings may be disturbed", extra=_PUB)
    ] = False
    # -- how it ended ----------------------------------------------------------------------------
    expired: Annotated[bool, Meta(description="the lease (max_hold_s) ran out", extra=_PUB)] = False
    revoked: Annotated[bool, Meta(description="an admin ended it")] = False
    released_by: Annotated[str, Meta(description="who or what released it, in words ('' while held)", extra=_PUB)] = ""
    backend: Annotated[str, Meta(description="the arbiter's GPU backend (nvidia, amd, fake)", extra=_PUB)] = ""
    simulated: Annotated[
        bool, Meta(description="the backend is simulated: no real GPU work was stopped", extra=_PUB)
    ] = False
    lock_capable: Annotated[
        bool, Meta(description="the backend can lock a process's GPU work (else the drain is cooperative)")
    ] = False
    # -- wall-clock times, set when the region ends ----------------------------------------------
    requested_at: Annotated[float | None, Meta(description="when it was requested", extra=_EPOCH)] = None
    granted_at: Annotated[float | None, Meta(description="when it was granted (None: never)", extra=_EPOCH)] = None
    released_at: Annotated[float | None, Meta(description="when it ended", extra=_EPOCH)] = None
    # -- set by the client -----------------------------------------------------------------------
    nested: Annotated[bool, Meta(description="inside a region the caller already held: that region's report")] = False
    caller_wait_s: Annotated[
        float | None, Meta(description="the caller's own wait, connecting and registering included", extra=_S)
    ] = None

    # -- reading -------------------------------------------------------------------------------
    @property
    def granted(self) -> bool:
        """Whether the region was granted at some point."""
        return self.acquire_s is not None

    @property
    def outcome(self) -> str:
        """How a region ended: completed, expired, revoked (by an admin), failed (enforcement) or
        withdrawn (never granted)."""
        if self.released_by.startswith("enforcement failed"):
            return "failed"
        if not self.granted:
            return "withdrawn"
        if self.expired:
            return "expired"
        if self.released_by.startswith(REVOKED):
            return "revoked"
        return "completed"

    def why_degraded(self) -> list[str]:
        """The reasons the region is degraded, in words (empty when it is not)."""
        if not self.degraded:
            return []
        reasons = [f"process {pid} not drained: {why}" for pid, why in self.not_drained.items()]
        return reasons + list(self.failures)

    def cut_short(self, what: str = "block") -> str:
        """Why the region ended before the ``what`` it protected ended ('' when it did not):
        its lease expired, or an admin ended it."""
        unprotected = f"before the {what} ended: timings taken after that are not protected"
        if self.expired:
            return (
                f"region {self.region} exceeded max_hold={self.max_hold_s} s and was released by the arbiter "
                + unprotected
            )
        if self.revoked:
            return f"region {self.region} was {self.released_by} after {self.hold_s or 0.0:.1f} s, {unprotected}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; a time that was not measured is left out."""
        return {k: v for k, v in msgspec.to_builtins(self).items() if v is not None}

    def public_dict(self) -> dict[str, Any]:
        """What anyone may know of another user's region (:data:`PUBLIC`)."""
        out = self.to_dict()
        return {k: out[k] for k in PUBLIC if k in out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegionReport:
        """A report from plain data (JSON, an event, a history row); unknown keys are ignored,
        a wrong type raises ``msgspec.ValidationError``."""
        return msgspec.convert(data, cls, strict=False)

    # Read access by name, kept for code written when the report was a dict (``report["hold_s"]``).
    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key, None) if key in self.__struct_fields__ else None
        if value is None:
            raise KeyError(key)
        return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def keys(self) -> list[str]:
        return [k for k in self.__struct_fields__ if getattr(self, k) is not None]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

    def values(self) -> list[Any]:
        return [self[k] for k in self.keys()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __bool__(self) -> bool:
        return bool(self.region)

    # -- the one-line summary ------------------------------------------------------------------
    def summary(self) -> str:
        if not self.region:
            return "region not granted"
        sim = " [simulated GPU]" if self.simulated else ""
        nested = " (nested: the enclosing region's)" if self.nested else ""
        # The caller's own wait where the client measured it (a caller stopped as another
        # region's intruder before it could queue waited longer than the queue saw).
        wait = self.caller_wait_s if self.caller_wait_s is not None else (self.wait_s or 0.0)
        stopped = (
            f" stopped {self.stopped_before_request_s * 1e3:.1f} ms by another region before it queued,"
            if self.stopped_before_request_s
            else ""
        )
        moved = f", moved {len(self.moved)} off the reserved cores" if self.moved else ""
        text = (
            f"KREX region {self.region} on GPU {self.gpu}{sim}{nested}: "
            f"waited {wait * 1e3:.1f} ms,{stopped} acquired in {(self.acquire_s or 0.0) * 1e3:.1f} ms; "
            f"drained {len(self.drained)}, frozen {len(self.frozen)}{moved}, "
            f"cores {self.cores}"
        )
        if self.hold_s is not None:
            text += f"; held {self.hold_s:.3f} s"
        if self.max_hold_asked_s:
            text += (
                f"; lease capped at {self.max_hold_s:g} s by this user's max_hold quota"
                f" (asked {self.max_hold_asked_s:g} s)"
            )
        if self.not_drained:
            text += f"; NOT drained: {', '.join(self.not_drained)}"
        if self.degraded:
            # Say why (not-drained processes are named above): the first failure, and how many more.
            more = f"; {len(self.failures) - 1} more" if len(self.failures) > 1 else ""
            text += f" - DEGRADED: {self.failures[0]}{more}" if self.failures else " - DEGRADED"
        if self.expired:
            text += " - LEASE EXPIRED"
        if self.revoked:
            text += f" - {(self.released_by or REVOKED).upper()}"
        return text


def field_info(cls: type[msgspec.Struct] = RegionReport) -> list[tuple[str, Any, Meta]]:
    """Each field of ``cls`` (a report's struct): its name, its type and its annotation
    (``description``; in ``extra``, ``unit`` and ``public``)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for name in cls.__struct_fields__:
        hint = hints[name]
        meta = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Meta)), Meta())
        out.append((name, hint.__origin__ if hasattr(hint, "__metadata__") else hint, meta))
    return out


#: the fields kept in another user's view of a region (names and how much, never pids)
PUBLIC: tuple[str, ...] = tuple(name for name, _, meta in field_info() if (meta.extra or {}).get("public"))


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    if type(None) in args:  # optional: None means not measured, or not yet
        return " or ".join(f"`{_type_name(a).strip('`')}`" if a is not type(None) else "None" for a in args)
    return f"`{tp.__name__ if isinstance(tp, type) and not args else str(tp).replace('typing.', '')}`"


def reference() -> str:
    """The field tables of ``docs/reference/region-report.md`` (a test keeps the file equal)."""
    lines = []
    for cls in (RegionReport, ShieldReport):
        lines += [f"### `{cls.__name__}`", "", "| field | type | unit | public | meaning |", "|---|---|---|---|---|"]
        for name, tp, meta in field_info(cls):
            extra = meta.extra or {}
            public = "yes" if extra.get("public") else ""
            lines.append(
                f"| `{name}` | {_type_name(tp)} | {extra.get('unit', '')} | {public} | {meta.description or ''} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference(), end="")
