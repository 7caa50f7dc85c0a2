"""What a region enforced, as the arbiter reports it, with a one-line summary."""

from __future__ import annotations

from typing import Any


class RegionReport(dict[str, Any]):
    """What a region enforced (the arbiter's report), with a one-line summary."""

    def summary(self) -> str:
        if not self:
            return "region not granted"
        sim = " [simulated GPU]" if self.get("simulated") else ""
        parts = [
            f"KREX region {self.get('region')} on GPU {self.get('gpu')}{sim}"
            + (" (nested: the enclosing region's)" if self.get("nested") else "")
            + ":",
            # The caller's own wait where the client measured it (a caller stopped as another
            # region's intruder before it could queue waited longer than the queue saw).
            f"waited {self.get('caller_wait_s', self.get('wait_s', 0)) * 1e3:.1f} ms,"
            + (
                f" stopped {self['stopped_before_request_s'] * 1e3:.1f} ms by another region before it queued,"
                if self.get("stopped_before_request_s")
                else ""
            )
            + f" acquired in {self.get('acquire_s', 0) * 1e3:.1f} ms;",
            f"drained {len(self.get('drained', []))}, frozen {len(self.get('frozen', []))},"
            f" moved {len(self.get('moved', []))}, cores {self.get('cores', [])}",
        ]
        if "hold_s" in self:
            parts.append(f"; held {self['hold_s']:.3f} s")
        if self.get("max_hold_asked_s"):
            parts.append(
                f"; lease capped at {self.get('max_hold_s', 0):g} s by this user's max_hold quota"
                f" (asked {self['max_hold_asked_s']:g} s)"
            )
        if self.get("not_drained"):
            parts.append(f"; NOT drained: {', '.join(self['not_drained'])}")
        if self.get("degraded"):
            # Say why (not-drained processes are named above): the first failure, and how many more.
            failures = [str(f) for f in self.get("failures", [])]
            why = f" ({failures[0]}{f'; {len(failures) - 1} more' if len(failures) > 1 else ''})" if failures else ""
            parts.append(f" - DEGRADED{why}")
        if self.get("expired"):
            parts.append(" - LEASE EXPIRED")
        if self.get("revoked"):
            parts.append(f" - {str(self.get('released_by', 'ended by admin')).upper()}")
        return " ".join(parts)
