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


@pytest.fixture
def repo(graveler, tmp_path):
    return graveler.create_repository("demo", str(tmp_path / "lake")).name
