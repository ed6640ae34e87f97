"""Targets for the KV contract (quarry.testing.kv): every backend, and the gateway over gRPC.

One store per target per session (the `kv_store` fixture is session-scoped, so pytest runs
each target's tests together); tests isolate themselves with fresh partitions instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from quarry.kv.memory import MemoryStore
from quarry.kv.store import Store
from support.servers import remote_store_target


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
    backend = MemoryStore()
    made = remote_store_target(backend)
    yield next(made)
    next(made, None)  # the store's and the gateway's cleanup
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
