import pytest

from quarry.graveler.graveler import Graveler
from quarry.kv.memory import MemoryStore
from support.counting import CountingStore
from support.fake_committed import FakeCommitted


@pytest.fixture
def kv_store():
    return CountingStore(MemoryStore())


@pytest.fixture
def committed():
    return FakeCommitted()


@pytest.fixture
def graveler(kv_store, committed):
    return Graveler(kv_store, committed, committed)


# Every test on the `repo` fixture runs with unsharded staging tokens and with 4 shards
# (docs/architecture.md §10 "Sharded staging"): the flows must not tell them apart.
STAGING_SHARDS = (1, 4)


@pytest.fixture(params=STAGING_SHARDS, ids=lambda n: f"shards{n}")
def staging_shards(request):
    return request.param


@pytest.fixture
def repo(graveler, tmp_path, staging_shards):
    return graveler.create_repository(
        "demo", str(tmp_path / "lake"), staging_shards=staging_shards
    ).name
