"""What a quota says: the user's name (not a uid), counts in the right number, and a lease over
the user's ``max_hold`` capped rather than refused."""

from __future__ import annotations

import pwd
import types

import pytest

from krex_lab.arbiter.quotas import Quotas
from krex_lab.errors import QuotaExceeded


def _nobody() -> tuple[int, str]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    return entry.pw_uid, entry.pw_name


def _waiting(uid: int, n: int) -> list[object]:
    return [types.SimpleNamespace(session=types.SimpleNamespace(uid=uid)) for _ in range(n)]


def test_queued_refusal_names_the_user_and_counts_right() -> None:
    uid, name = _nobody()
    quotas = Quotas(queued_per_user=1)
    with pytest.raises(QuotaExceeded) as one:
        quotas.check_acquire(uid, 10.0, _waiting(uid, 1))  # type: ignore[arg-type]
    assert str(one.value) == f"user {name} already has 1 request waiting: the limit is queued_per_user=1"
    with pytest.raises(QuotaExceeded) as two:
        Quotas(queued_per_user=2).check_acquire(uid, 10.0, _waiting(uid, 2))  # type: ignore[arg-type]
    assert f"user {name} already has 2 requests waiting" in str(two.value)


def test_sessions_refusal_names_the_user() -> None:
    uid, name = _nobody()
    sessions = [types.SimpleNamespace(uid=uid, pid=1000 + i) for i in range(1)]
    with pytest.raises(QuotaExceeded) as exc:
        Quotas(sessions_per_user=1).check_register(uid, 999, sessions, capacity=100)
    assert str(exc.value) == f"user {name} has 1 session: the limit is sessions_per_user=1"


def test_a_lease_over_the_users_max_hold_is_capped() -> None:
    uid, _ = _nobody()
    quotas = Quotas(max_hold=20.0)
    assert quotas.check_acquire(uid, 60.0, []) == 20.0
    assert quotas.check_acquire(uid, 5.0, []) == 5.0
    assert Quotas().check_acquire(uid, 60.0, []) == 60.0, "0: no per-user cap"
    assert quotas.check_acquire(0, 60.0, []) == 60.0, "root is exempt"


def test_reload_takes_the_file_as_it_is_now() -> None:
    from traitlets.config import Config

    quotas = Quotas(config=Config({"Quotas": {"max_hold": 20.0, "users": {"bob": {"max_hold": 50}}}}))
    changed = quotas.reload(Config({"Quotas": {"max_hold": 30.0}}))
    assert sorted(changed) == ["max_hold", "users"]
    assert quotas.max_hold == 30.0 and quotas.users == {}, "a setting the file no longer has is dropped"
