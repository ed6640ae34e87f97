"""Targets for the KV conformance suite: every backend, and the gateway over gRPC.

One store per target per session (the `kv_store` fixture is session-scoped, so pytest runs
each target's tests together); tests isolate themselves with fresh partitions instead.
"""

from __future__ import annotations

import contextlib
import inspect
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from quarry.kv.memory import MemoryStore
from quarry.kv.store import Store


@contextlib.contextmanager
def _memory(request: pytest.FixtureRequest) -> Iterator[Store]:
    store = MemoryStore()
    yield store
    store.close()


@contextlib.contextmanager
def _sqlite(request: pytest.FixtureRequest) -> Iterator[Store]:
    from quarry.kv.sqlite import SQLiteStore

    path = request.getfixturevalue("tmp_path_factory").mktemp("kv") / "conformance.db"
    store = SQLiteStore(path)
    yield store
    store.close()


@contextlib.contextmanager
def _dynamodb(request: pytest.FixtureRequest) -> Iterator[Store]:
    from quarry.kv.dynamodb import DynamoDBStore

    endpoint = request.getfixturevalue("dynalite")
    store = DynamoDBStore("quarry-conformance", endpoint_url=endpoint)
    yield store
    store.close()


@contextlib.contextmanager
def _remote(request: pytest.FixtureRequest) -> Iterator[Store]:
    # Imported here: the module is owned by the gateway work and may be replaced at any time.
    from remote_target import make_remote_store

    backend = MemoryStore()
    made = make_remote_store(backend)
    if inspect.isgenerator(made):  # yield-fixture style: cleanup runs after the yield
        store = next(made)
        yield store
        next(made, None)
    else:
        yield made
        made.close()
    backend.close()


TARGETS: dict[str, Callable[[pytest.FixtureRequest], AbstractContextManager[Store]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "dynamodb": _dynamodb,
    "remote": _remote,
}


@pytest.fixture(scope="session", params=list(TARGETS))
def kv_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with TARGETS[request.param](request) as store:
        yield store


def _new_partition(suffix: str = "m") -> bytes:
    """A fresh partition of a class the gateway accepts (staging/<token>)."""
    return f"staging/{uuid.uuid4().hex}-{suffix}".encode()


@pytest.fixture
def new_partition() -> Callable[..., bytes]:
    """Factory of fresh partitions, for tests that need several."""
    return _new_partition


@pytest.fixture
def partition() -> bytes:
    return _new_partition()
