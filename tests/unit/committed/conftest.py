"""Fixtures for committed-storage unit tests: real files under tmp_path."""

from __future__ import annotations

import pytest

from quarry.blob import CountingBlobStore, LocalBlobStore
from quarry.committed import CommittedManager
from quarry.graveler.model import Entry


def entry(
    path: str,
    version: int = 0,
    *,
    address: str | None = None,
    metadata=None,
    mtime_us: int | None = None,
    size: int | None = None,
) -> Entry:
    return Entry(
        path,
        address if address is not None else f"s3://data/{path}#{version}",
        size if size is not None else 100 + version,
        f"etag-{version}",
        mtime_us if mtime_us is not None else 1_700_000_000_000_000 + version,
        "application/octet-stream",
        metadata if metadata is not None else {"v": str(version)},
    )


class Stores:
    """Opens counting local stores and remembers them by namespace."""

    def __init__(self, durable: bool = False):
        self.by_namespace: dict[str, CountingBlobStore] = {}
        self.durable = durable

    def __call__(self, namespace: str) -> CountingBlobStore:
        store = self.by_namespace.get(namespace)
        if store is None:
            store = self.by_namespace[namespace] = CountingBlobStore(
                LocalBlobStore(namespace, durable=self.durable)
            )
        return store


@pytest.fixture
def make_entry():
    return entry


@pytest.fixture
def stores() -> Stores:
    return Stores()


@pytest.fixture
def namespace(tmp_path) -> str:
    path = tmp_path / "ns"
    path.mkdir()
    return str(path)


@pytest.fixture
def new_manager(stores, tmp_path):
    """new_manager(**kwargs) -> a CommittedManager over counting local stores (fresh caches)."""
    managers: list[CommittedManager] = []

    def make(**kwargs) -> CommittedManager:
        kwargs.setdefault("target_range_entries", 16)
        manager = CommittedManager(stores, None, **kwargs)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()
