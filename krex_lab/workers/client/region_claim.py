"""Whether this process's jobs must run inside a region: the one it runs in (``KREX_REGION``, set
by the holder that started it) or the one it holds itself, and an identity ticket that lets the
pool's worker join it."""

from __future__ import annotations

import os
import sys


def held_region(gpu: int | None) -> str | None:
    """The region this process holds itself (``exclusive()`` in this process, no KREX_REGION): on the
    job's GPU, else any. Its region freezes the pool's ordinary workers, so its jobs must run inside it."""
    client = sys.modules.get("krex_lab.client")  # never imported: this process holds nothing
    mine = client.sessions() if client is not None else []
    held = [r for s in mine if (r := s.held_region(gpu) if gpu is not None else None)]
    anywhere = [r for s in mine if (r := s.held_region())]
    return (held or anywhere or [None])[0]


def region_claim(gpu: int | None = None) -> tuple[str | None, str | None]:
    """(the region, an identity ticket of this process) when this process runs inside a region (its
    KREX_REGION, set by the holder that started it) or holds one itself, so that the pool runs its
    jobs on a worker the arbiter lets join that region; (None, None) otherwise, or when the arbiter
    gives no ticket (the job is then an ordinary one)."""
    region = os.environ.get("KREX_REGION", "").strip() or held_region(gpu)
    if not region:
        return None, None
    from ...connection import Connection  # only here: most processes never run inside a region

    try:
        conn = Connection()
    except Exception:
        return None, None
    try:
        ticket = conn.ticket()
    except Exception:
        ticket = ""
    finally:
        conn.close()
    return (region, ticket) if ticket else (None, None)
