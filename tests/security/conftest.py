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


@pytest.fixture
def alice() -> Iterator[User]:
    with make_user("krexalice") as user:
        yield user


@pytest.fixture
def mallory() -> Iterator[User]:
    """The hostile neighbour of the attack tests."""
    with make_user("krexmal") as user:
        yield user
