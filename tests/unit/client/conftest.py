"""Fixtures of the client unit tests: a scripted fake server (see client_fakes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quarry.client import Client
from support.client_fakes import Fake


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = Fake()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(fake) -> Iterator[Client]:
    with fake.client() as c:
        yield c
