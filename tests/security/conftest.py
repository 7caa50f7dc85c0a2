"""The ``bob`` fixture: a real unprivileged user made with ``useradd`` and removed with
``userdel`` afterwards (tests using it skip unless run as root on a machine with ``useradd``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .users import User, make_user


@pytest.fixture
def bob() -> Iterator[User]:
    with make_user("krexbob") as user:
        yield user
