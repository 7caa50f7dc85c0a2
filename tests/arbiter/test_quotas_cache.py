"""A user's groups are read once per GROUPS_TTL, not at every register and acquire (the read is
every group of the node, on the arbiter's event loop)."""

from __future__ import annotations

import grp
import os

import pytest

from krex_lab.arbiter import quotas


def test_groups_are_read_once_per_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = grp.getgrall

    def counting() -> list[grp.struct_group]:
        calls.append(1)
        return real()

    monkeypatch.setattr(quotas.grp, "getgrall", counting)
    monkeypatch.setattr(quotas, "_groups_seen", {})
    uid = os.getuid()
    first = quotas._user_and_groups(uid)
    assert [quotas._user_and_groups(uid) for _ in range(50)] == [first] * 50
    assert len(calls) == 1
    monkeypatch.setattr(quotas, "GROUPS_TTL", 0.0)  # expired: read again
    assert quotas._user_and_groups(uid) == first and len(calls) == 2
