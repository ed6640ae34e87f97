import pytest

import quarry.compaction.sensor as sensor_module
from quarry.compaction.sensor import CompactionSensor, Thresholds
from quarry.graveler.graveler import Graveler
from quarry.kv.memory import MemoryStore
from quarry.telemetry.metrics import BranchLabels
from support.compaction_fakes import Clock, FakeCompactor
from support.fake_committed import FakeCommitted


@pytest.fixture(autouse=True)
def fresh_branch_labels(monkeypatch):
    """The sensor's per-branch gauges name only the first MAX_BRANCH_LABELS branches a
    process sees (the rest are "other"); in one pytest process every earlier test's branches
    count, so each test here starts from a label set of its own."""
    monkeypatch.setattr(sensor_module, "branch_labels", BranchLabels())


@pytest.fixture
def store():
    return MemoryStore()


@pytest.fixture
def graveler(store):
    committed = FakeCommitted()
    return Graveler(store, committed, committed)


@pytest.fixture(params=[1, 4], ids=["shards1", "shards4"])
def repo(graveler, tmp_path, request):
    """Every sensor test runs with unsharded staging tokens and with 4 shards per token (the
    rebuild counts every shard)."""
    return graveler.create_repository(
        "lake", str(tmp_path / "lake"), staging_shards=request.param
    ).name


@pytest.fixture
def compactor(store):
    return FakeCompactor(store)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make_sensor(store, compactor, clock):
    def make(
        tombstones=0,
        staged_entries=0,
        sealed_tokens=0,
        min_interval=60.0,
        compactor_=None,
        **kwargs,
    ):
        return CompactionSensor(
            store,
            compactor_ or compactor,
            Thresholds(tombstones, staged_entries, sealed_tokens),
            min_interval_seconds=min_interval,
            clock=clock,
            **kwargs,
        )

    return make
