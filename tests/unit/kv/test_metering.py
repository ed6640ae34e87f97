"""Capacity metering (what DynamoDB would charge) and the per-partition limiter."""

from __future__ import annotations

import threading

import grpc
import pytest
from prometheus_client import CollectorRegistry

from quarry.kv import store
from quarry.kv.capacity import read_units, write_units
from quarry.kv.limiter import PartitionLimiter
from quarry.kv.memory import MemoryStore
from quarry.kv.metering import CapacityTotals, MeteredStore

REPO = b"repo/lake/i1"
STAGING = b"staging/t1"


def value_for(partition: bytes, key: bytes, item_bytes: int) -> bytes:
    """A value making the item exactly `item_bytes` as DynamoDB sizes it."""
    return b"x" * (item_bytes - store.item_size(partition, key, b""))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def backend():
    return MemoryStore()


@pytest.fixture
def metered(backend, registry):
    return MeteredStore(backend, registry=registry)


def totals_of(metered: MeteredStore, partition: bytes) -> CapacityTotals:
    for hot in metered.report(top_n=1000).hottest:
        if hot.partition == partition:
            return hot.totals
    return CapacityTotals()


# ---- unit arithmetic -------------------------------------------------------------------


def test_unit_functions_at_boundaries():
    assert [read_units(n) for n in (0, 1, 4096, 4097, 8192, 8193)] == [1, 1, 1, 2, 2, 3]
    assert [write_units(n) for n in (0, 1, 1024, 1025, 2048, 2049)] == [1, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("item_bytes, expected_units", [(4096, 1), (4097, 2), (400 * 1024, 100)])
def test_get_is_charged_per_4kb_of_item(metered, backend, item_bytes, expected_units):
    backend.set(REPO, b"k", value_for(REPO, b"k", item_bytes))
    metered.get(REPO, b"k")
    assert totals_of(metered, REPO) == CapacityTotals(read_units=expected_units, reads=1)


def test_get_of_a_missing_key_costs_the_minimum(metered):
    with pytest.raises(store.KeyNotFound):
        metered.get(REPO, b"missing")
    assert totals_of(metered, REPO) == CapacityTotals(read_units=1, reads=1)


@pytest.mark.parametrize("item_bytes, expected_units", [(1024, 1), (1025, 2)])
def test_writes_are_charged_per_1kb_of_item(metered, item_bytes, expected_units):
    metered.set(REPO, b"k", value_for(REPO, b"k", item_bytes))
    assert totals_of(metered, REPO) == CapacityTotals(write_units=expected_units, writes=1)
    metered.set_if(REPO, b"k", value_for(REPO, b"k", item_bytes), store.EXISTS)
    assert totals_of(metered, REPO) == CapacityTotals(write_units=2 * expected_units, writes=2)


def test_failed_set_if_is_charged_like_dynamodb(metered):
    with pytest.raises(store.PredicateFailed):
        metered.set_if(REPO, b"k", value_for(REPO, b"k", 1025), store.EXISTS)
    assert totals_of(metered, REPO) == CapacityTotals(write_units=2, writes=1)


def test_delete_is_charged_for_the_key_only_item(metered, backend):
    backend.set(REPO, b"k", value_for(REPO, b"k", 10_000))
    metered.delete(REPO, b"k")
    metered.delete(REPO, b"k" * 1000)  # key-only item of ~1 KB: still 1 unit
    metered.delete(REPO, b"k" * 1024)  # key-only item just over 1 KB: 2 units
    assert totals_of(metered, REPO) == CapacityTotals(write_units=4, writes=3)


def test_scan_is_charged_per_page_by_bytes_returned(metered, backend):
    for key in (b"a", b"b", b"c"):
        backend.set(REPO, key, value_for(REPO, key, 4096))
    # Pages of 2: [a, b] = 8192 bytes = 2 units, [c] = 4096 bytes = 1 unit.
    assert [kv.key for kv in metered.scan(REPO, batch_size=2)] == [b"a", b"b", b"c"]
    assert totals_of(metered, REPO) == CapacityTotals(read_units=3, reads=2)


def test_scan_small_items_and_empty_pages_cost_one_unit_per_page(metered, backend):
    assert list(metered.scan(STAGING)) == []
    assert totals_of(metered, STAGING) == CapacityTotals(read_units=1, reads=1)

    backend.set(REPO, b"a", b"1")
    backend.set(REPO, b"b", b"2")
    iterator = metered.scan(REPO, batch_size=2)
    # A full page then an empty one (the backend must ask again to learn it is done).
    assert [kv.key for kv in iterator] == [b"a", b"b"]
    with pytest.raises(StopIteration):
        next(iterator)  # asking again after the end costs nothing
    assert totals_of(metered, REPO) == CapacityTotals(read_units=2, reads=2)

    iterator.seek_ge(b"b")  # a new query
    assert [kv.key for kv in iterator] == [b"b"]
    assert totals_of(metered, REPO) == CapacityTotals(read_units=3, reads=3)


def test_batches_are_charged_per_item(metered, backend):
    backend.set(REPO, b"big", value_for(REPO, b"big", 4097))
    backend.set(STAGING, b"small", b"s")
    results = metered.batch_get([(REPO, b"big"), (STAGING, b"small"), (STAGING, b"missing")])
    assert [r and r.value[:1] for r in results] == [b"x", b"s", None]
    assert totals_of(metered, REPO) == CapacityTotals(read_units=2, reads=1)
    assert totals_of(metered, STAGING) == CapacityTotals(read_units=2, reads=2)

    metered.batch_set([(STAGING, b"a", value_for(STAGING, b"a", 1025)), (STAGING, b"b", b"")])
    metered.batch_delete([(STAGING, b"a"), (STAGING, b"b"), (REPO, b"big")])
    assert totals_of(metered, STAGING) == CapacityTotals(
        read_units=2, reads=2, write_units=3 + 2, writes=2 + 2
    )
    assert totals_of(metered, REPO) == CapacityTotals(
        read_units=2, reads=1, write_units=1, writes=1
    )


# ---- aggregation -----------------------------------------------------------------------


def test_totals_per_class_and_hottest_partitions(metered):
    metered.set(b"quarry", b"repos/lake", b"r")
    for i in range(3):
        metered.set(REPO, b"branches/b%d" % i, b"b")
    metered.set(b"repo/other/i9", b"settings/x", value_for(b"repo/other/i9", b"settings/x", 5000))
    metered.set(STAGING, b"path", b"e")
    metered.set(b"staging/t2", b"path", b"e")
    metered.get(STAGING, b"path")
    metered.set(b"not-a-class", b"k", b"v")

    report = metered.report(top_n=3)
    assert report.by_class["quarry"] == CapacityTotals(write_units=1, writes=1)
    assert report.by_class["repo"] == CapacityTotals(write_units=3 + 5, writes=4)
    assert report.by_class["staging"] == CapacityTotals(
        write_units=2, writes=2, read_units=1, reads=1
    )
    assert report.by_class["cleanup"] == CapacityTotals()
    assert report.by_class["auth"] == CapacityTotals()
    assert report.by_class["unknown"] == CapacityTotals(write_units=1, writes=1)

    # Hottest first by read + write units: 5, then 3, then staging/t1's 1 write + 1 read.
    assert [(h.partition, h.partition_class, h.totals.total_units) for h in report.hottest] == [
        (b"repo/other/i9", "repo", 5),
        (REPO, "repo", 3),
        (STAGING, "staging", 2),
    ]
    # Ties are ordered by name, so the report is stable.
    tied = [h.partition for h in metered.report(top_n=10).hottest if h.totals.total_units == 1]
    assert tied == sorted(tied) == [b"not-a-class", b"quarry", b"staging/t2"]


def test_counting_is_thread_safe(metered):
    def writer(n: int) -> None:
        for i in range(200):
            metered.set(b"staging/t%d" % (n % 2), b"k%d" % i, b"v")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert metered.report().by_class["staging"] == CapacityTotals(write_units=1600, writes=1600)


def test_tracked_partitions_are_bounded_keeping_the_hottest(backend, registry):
    metered = MeteredStore(backend, registry=registry, max_tracked_partitions=4)
    for _ in range(5):
        metered.set(b"staging/hot", b"k", b"v")
    for i in range(20):
        metered.set(b"staging/cold%d" % i, b"k", b"v")
    report = metered.report(top_n=10)
    assert len(report.hottest) <= 4
    assert report.hottest[0].partition == b"staging/hot"
    assert report.by_class["staging"].writes == 25  # class totals stay exact


# ---- limiter ---------------------------------------------------------------------------


def test_limiter_refuses_past_the_rate_and_admits_after_refill(backend, registry):
    clock = FakeClock()
    limiter = PartitionLimiter(read_units_per_second=10, write_units_per_second=5, clock=clock)
    metered = MeteredStore(backend, limiter=limiter, registry=registry)

    for i in range(5):  # the burst: one second of capacity
        metered.set(REPO, b"k%d" % i, b"v")
    with pytest.raises(store.Throttled) as caught:
        metered.set(REPO, b"k5", b"v")
    throttled = caught.value
    assert throttled.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert throttled.retry_delay == pytest.approx(1 / 5)
    assert throttled.metadata["partition_class"] == "repo"
    with pytest.raises(store.KeyNotFound):
        backend.get(REPO, b"k5")  # refused before reaching the backend

    # Partitions are limited independently.
    metered.set(STAGING, b"k", b"v")

    clock.advance(throttled.retry_delay)
    metered.set(REPO, b"k5", b"v")
    assert backend.get(REPO, b"k5").value == b"v"

    report = metered.report()
    assert report.by_class["repo"].throttled == 1
    assert totals_of(metered, REPO).throttled == 1
    assert totals_of(metered, REPO).write_units == 6
    assert report.by_class["staging"].throttled == 0


def test_large_read_goes_into_debt_and_delays_the_next(backend, registry):
    clock = FakeClock()
    limiter = PartitionLimiter(read_units_per_second=10, write_units_per_second=5, clock=clock)
    metered = MeteredStore(backend, limiter=limiter, registry=registry)
    backend.set(REPO, b"big", value_for(REPO, b"big", 12 * 4096))  # 12 units

    metered.get(REPO, b"big")  # admitted on 1 unit, the other 11 charged after: debt of 2
    assert limiter.available("read", REPO) == pytest.approx(-2)
    with pytest.raises(store.Throttled) as caught:
        metered.get(REPO, b"big")
    assert caught.value.retry_delay == pytest.approx(0.3)  # from -2 back up to 1 unit

    clock.advance(0.3)
    metered.get(REPO, b"big")
    assert totals_of(metered, REPO) == CapacityTotals(read_units=24, reads=3, throttled=1)


def test_throttled_batch_is_refused_whole(backend, registry):
    clock = FakeClock()
    limiter = PartitionLimiter(read_units_per_second=10, write_units_per_second=5, clock=clock)
    metered = MeteredStore(backend, limiter=limiter, registry=registry)
    metered.batch_set([(REPO, b"k%d" % i, b"v") for i in range(4)])

    with pytest.raises(store.Throttled) as caught:
        metered.batch_set([(STAGING, b"a", b"v"), (REPO, b"x", b"v"), (REPO, b"y", b"v")])
    assert caught.value.retry_delay == pytest.approx(1 / 5)
    assert list(backend.scan(STAGING)) == []
    assert limiter.available("write", STAGING) == pytest.approx(5)  # not charged
    assert totals_of(metered, REPO).throttled == 1
    assert totals_of(metered, STAGING).throttled == 0


def test_backend_throttling_is_counted(registry):
    class ThrottlingStore(MemoryStore):
        def get(self, partition, key):
            raise store.Throttled("backend says slow down", retry_delay=0.05)

    metered = MeteredStore(ThrottlingStore(), registry=registry)
    with pytest.raises(store.Throttled):
        metered.get(REPO, b"k")
    assert totals_of(metered, REPO) == CapacityTotals(reads=1, throttled=1)


def test_no_limiter_by_default(metered, backend):
    backend.set(REPO, b"big", value_for(REPO, b"big", 400 * 1024))
    for _ in range(100):  # 10,000 units in no time
        metered.get(REPO, b"big")
    assert totals_of(metered, REPO).throttled == 0


# ---- Prometheus ------------------------------------------------------------------------


def test_prometheus_samples_by_partition_class(backend, registry):
    clock = FakeClock()
    limiter = PartitionLimiter(read_units_per_second=10, write_units_per_second=1, clock=clock)
    metered = MeteredStore(backend, limiter=limiter, registry=registry)
    metered.set(REPO, b"k", value_for(REPO, b"k", 1025))  # 2 units: admitted on a full bucket
    metered.get(REPO, b"k")
    metered.batch_get([(STAGING, b"a"), (STAGING, b"b")])
    with pytest.raises(store.Throttled):
        metered.set(REPO, b"k", b"v")

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("quarry_kv_write_units_total", partition_class="repo") == 2
    assert sample("quarry_kv_read_units_total", partition_class="repo") == 1
    assert sample("quarry_kv_read_units_total", partition_class="staging") == 2
    assert sample("quarry_kv_requests_total", partition_class="repo", op="set") == 2
    assert sample("quarry_kv_requests_total", partition_class="repo", op="get") == 1
    assert sample("quarry_kv_requests_total", partition_class="staging", op="batch_get") == 2
    assert sample("quarry_kv_throttled_total", partition_class="repo") == 1


def test_several_stores_share_a_registry_without_duplicate_collectors(backend, registry):
    first = MeteredStore(backend, registry=registry)
    second = MeteredStore(backend, registry=registry)
    first.set(REPO, b"k", b"v")
    second.set(REPO, b"k", b"v")
    assert (
        registry.get_sample_value("quarry_kv_write_units_total", {"partition_class": "repo"}) == 2
    )
    # The default (global) registry too, and no export at all.
    MeteredStore(backend)
    MeteredStore(backend)
    MeteredStore(backend, registry=None).set(REPO, b"k", b"v")
