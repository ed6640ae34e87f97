"""Capacity metering: what DynamoDB would charge for each call (docs/architecture.md §3).

`MeteredStore` computes, whatever the backend, what DynamoDB would charge for each call:

  * `get`: 1 read unit per 4 KB of item size, rounded up, minimum 1 (strongly consistent
    reads; a get that finds nothing still costs the minimum 1);
  * `set`, `set_if`: 1 write unit per 1 KB of the written item, rounded up, minimum 1; a
    `set_if` whose predicate fails is charged too, as DynamoDB charges failed conditions;
  * `delete`: the same, of the key-only item (partition + key, empty value);
  * `scan`: per page (`batch_size` items), 1 read unit per 4 KB of the items returned,
    rounded up, minimum 1 per page (an empty last page costs 1, like an empty Query);
  * batch calls: the sum over items, each item rounded on its own (as BatchGetItem and
    BatchWriteItem do).

Item sizes come from store.item_size. Totals are kept per partition and per partition class
(quarry.kv.partitions; "unknown" for names outside the known classes), `report()` returns
them with the hottest partitions, and Prometheus counters carry the per-class totals
(per-partition labels would explode cardinality: every staging token is a partition).

Counting: a *read* or *write* is one request against one partition: `get` = 1, each item of
a batch = 1, each scan page = 1. Requests are counted when attempted, including those then
throttled; `throttled` counts the ones refused, by the local limiter or by the backend.

The optional `PartitionLimiter` (quarry.kv.limiter) throttles per partition as DynamoDB
would; metering admits each request through it and charges it what was consumed.
"""

from __future__ import annotations

import collections
import heapq
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry

from quarry.kv import partitions, store
from quarry.kv.capacity import READ, WRITE, partition_class_or_unknown, read_units, write_units
from quarry.kv.limiter import PartitionLimiter


def _item_size(partition: bytes, key: bytes, value: bytes | None) -> int:
    # A missing value is refused by the backend's validation; don't fail here first.
    return store.item_size(partition, key, value if value is not None else b"")


# ---- report ----------------------------------------------------------------------------


@dataclass
class CapacityTotals:
    read_units: int = 0
    write_units: int = 0
    reads: int = 0
    writes: int = 0
    throttled: int = 0

    @property
    def total_units(self) -> int:
        return self.read_units + self.write_units


@dataclass(frozen=True)
class PartitionCapacity:
    partition: bytes
    partition_class: str
    totals: CapacityTotals


@dataclass(frozen=True)
class CapacityReport:
    # Every known partition class (zeros included), plus "unknown" if any was seen.
    by_class: dict[str, CapacityTotals]
    # The hottest partitions by read + write units, hottest first (ties by name).
    hottest: list[PartitionCapacity] = field(default_factory=list)


# ---- Prometheus ------------------------------------------------------------------------


class _PrometheusMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.read_units = prometheus_client.Counter(
            "quarry_kv_read_units",
            "Read capacity units DynamoDB would charge",
            ["partition_class"],
            registry=registry,
        )
        self.write_units = prometheus_client.Counter(
            "quarry_kv_write_units",
            "Write capacity units DynamoDB would charge",
            ["partition_class"],
            registry=registry,
        )
        self.requests = prometheus_client.Counter(
            "quarry_kv_requests",
            "KV requests (per item for batches, per page for scans)",
            ["partition_class", "op"],
            registry=registry,
        )
        self.throttled = prometheus_client.Counter(
            "quarry_kv_throttled",
            "KV requests refused for capacity (RESOURCE_EXHAUSTED)",
            ["partition_class"],
            registry=registry,
        )
        self.latency = prometheus_client.Histogram(
            "quarry_kv_operation_duration_seconds",
            "Backend time of a KV operation (scans: per page fetched), by operation and "
            "partition class (batches spanning several classes: 'mixed')",
            ["op", "partition_class"],
            buckets=(
                0.0001,
                0.00025,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1,
                2.5,
            ),
            registry=registry,
        )
        # labels() costs a lock and a dict walk per call; the label sets are few, so keep
        # the children (hot path: every KV request records two or three samples).
        self._children: dict[tuple, Any] = {}

    def child(
        self, counter: prometheus_client.Counter | prometheus_client.Histogram, *label_values: str
    ) -> Any:
        key = (id(counter), label_values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = counter.labels(*label_values)
        return found


# One set of collectors per registry: registering the same names twice in a registry fails,
# and several MeteredStores in one process (tests, or several gateways) must share them.
_metrics_lock = threading.Lock()
_metrics_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _PrometheusMetrics] = (
    weakref.WeakKeyDictionary()
)


def _metrics_for(registry: CollectorRegistry) -> _PrometheusMetrics:
    with _metrics_lock:
        metrics = _metrics_by_registry.get(registry)
        if metrics is None:
            metrics = _PrometheusMetrics(registry)
            _metrics_by_registry[registry] = metrics
        return metrics


# ---- the store -------------------------------------------------------------------------


class MeteredStore(store.Store):
    """Meters every call (see the module docstring) and, with a limiter, throttles.

    `registry`: where the Prometheus counters live (None: no export). Stores sharing a
    registry share its counters. `max_tracked_partitions` bounds the per-partition map: past
    it, the colder half is forgotten (class totals stay exact), so `hottest` is about the
    recent past of a long-running gateway rather than all of history.
    """

    def __init__(
        self,
        inner: store.Store,
        limiter: PartitionLimiter | None = None,
        registry: CollectorRegistry | None = prometheus_client.REGISTRY,
        max_tracked_partitions: int = 100_000,
    ):
        if max_tracked_partitions < 2:
            raise ValueError("max_tracked_partitions must be at least 2")
        self.inner = inner
        self.limiter = limiter
        self._metrics = _metrics_for(registry) if registry is not None else None
        self._max_tracked_partitions = max_tracked_partitions
        self._lock = threading.Lock()
        self._by_class: dict[str, CapacityTotals] = {
            name: CapacityTotals() for name in partitions.PARTITION_CLASSES
        }
        self._by_partition: dict[bytes, CapacityTotals] = {}

    # ---- reads ---------------------------------------------------------------------------

    def get(self, partition: bytes, key: bytes) -> store.GetResult:
        self._admit(READ, "get", {partition: 1}, {partition: 1})
        started = time.perf_counter()
        try:
            result = self.inner.get(partition, key)
        except store.KeyNotFound:
            self._time("get", partition, started)
            # A read that finds nothing costs the 1-unit minimum, already taken at admission.
            self._charge(READ, partition, units=1, prepaid=1)
            raise
        except store.Throttled:
            self._count_throttled([partition])
            raise
        self._time("get", partition, started)
        units = read_units(store.item_size(partition, key, result.value))
        self._charge(READ, partition, units=units, prepaid=1)
        return result

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[store.GetResult | None]:
        items_per_partition = collections.Counter(partition for partition, _ in items)
        # Estimate 1 unit per item up front; reconcile once the sizes are known.
        self._admit(READ, "batch_get", items_per_partition, items_per_partition)
        started = time.perf_counter()
        try:
            results = self.inner.batch_get(items)
        except store.Throttled:
            self._count_throttled(items_per_partition)
            raise
        self._time("batch_get", items_per_partition, started)
        units_per_partition: dict[bytes, int] = collections.Counter()
        for (partition, key), result in zip(items, results, strict=True):
            size = store.item_size(partition, key, result.value) if result is not None else 0
            units_per_partition[partition] += read_units(size)
        for partition, units in units_per_partition.items():
            self._charge(READ, partition, units=units, prepaid=items_per_partition[partition])
        return results

    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = store.DEFAULT_SCAN_BATCH_SIZE,
    ) -> store.ScanIterator:
        inner_iterator = self.inner.scan(partition, start, end, batch_size)
        return _MeteredScanIterator(self, partition, inner_iterator, batch_size)

    # ---- writes --------------------------------------------------------------------------

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        units = write_units(_item_size(partition, key, value))
        self._admit(WRITE, "set", {partition: units}, {partition: 1})
        started = time.perf_counter()
        try:
            self.inner.set(partition, key, value)
        except store.Throttled:
            self._count_throttled([partition])
            raise
        self._time("set", partition, started)
        self._charge(WRITE, partition, units=units, prepaid=units)

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        units = write_units(_item_size(partition, key, value))
        self._admit(WRITE, "set_if", {partition: units}, {partition: 1})
        started = time.perf_counter()
        try:
            self.inner.set_if(partition, key, value, predicate)
        except store.PredicateFailed:
            self._time("set_if", partition, started)
            # DynamoDB charges a failed condition check as the write it would have been.
            self._charge(WRITE, partition, units=units, prepaid=units)
            raise
        except store.Throttled:
            self._count_throttled([partition])
            raise
        self._time("set_if", partition, started)
        self._charge(WRITE, partition, units=units, prepaid=units)

    def delete(self, partition: bytes, key: bytes) -> None:
        units = write_units(store.item_size(partition, key, b""))
        self._admit(WRITE, "delete", {partition: units}, {partition: 1})
        started = time.perf_counter()
        try:
            self.inner.delete(partition, key)
        except store.Throttled:
            self._count_throttled([partition])
            raise
        self._time("delete", partition, started)
        self._charge(WRITE, partition, units=units, prepaid=units)

    def delete_if(self, partition: bytes, key: bytes, predicate: store.Equals) -> None:
        units = write_units(store.item_size(partition, key, b""))
        self._admit(WRITE, "delete_if", {partition: units}, {partition: 1})
        started = time.perf_counter()
        try:
            self.inner.delete_if(partition, key, predicate)
        except store.PredicateFailed:
            self._time("delete_if", partition, started)
            # As set_if: DynamoDB charges a failed condition check as the write.
            self._charge(WRITE, partition, units=units, prepaid=units)
            raise
        except store.Throttled:
            self._count_throttled([partition])
            raise
        self._time("delete_if", partition, started)
        self._charge(WRITE, partition, units=units, prepaid=units)

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        units_per_item = [
            (partition, write_units(_item_size(partition, key, value)))
            for partition, key, value in items
        ]
        self._batch_write("batch_set", units_per_item, lambda: self.inner.batch_set(items))

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        units_per_item = [
            (partition, write_units(store.item_size(partition, key, b"")))
            for partition, key in items
        ]
        self._batch_write("batch_delete", units_per_item, lambda: self.inner.batch_delete(items))

    def _batch_write(
        self, op: str, units_per_item: list[tuple[bytes, int]], call: Callable[[], None]
    ) -> None:
        units_per_partition: dict[bytes, int] = collections.Counter()
        items_per_partition: dict[bytes, int] = collections.Counter()
        for partition, units in units_per_item:
            units_per_partition[partition] += units
            items_per_partition[partition] += 1
        # A batch is refused as a whole if any of its partitions is out of capacity
        # (DynamoDB would return the items of that partition as unprocessed instead).
        self._admit(WRITE, op, units_per_partition, items_per_partition)
        started = time.perf_counter()
        try:
            call()
        except store.Throttled:
            self._count_throttled(units_per_partition)
            raise
        self._time(op, units_per_partition, started)
        for partition, units in units_per_partition.items():
            self._charge(WRITE, partition, units=units, prepaid=units)

    def close(self) -> None:
        self.inner.close()

    # ---- report --------------------------------------------------------------------------

    def report(self, top_n: int = 10) -> CapacityReport:
        with self._lock:
            by_class = {name: replace(totals) for name, totals in self._by_class.items()}
            hottest_items = heapq.nsmallest(
                max(0, top_n),
                self._by_partition.items(),
                key=lambda item: (-item[1].total_units, item[0]),
            )
            hottest = [
                PartitionCapacity(
                    partition=partition,
                    partition_class=partition_class_or_unknown(partition),
                    totals=replace(totals),
                )
                for partition, totals in hottest_items
            ]
        return CapacityReport(by_class=by_class, hottest=hottest)

    # ---- bookkeeping ---------------------------------------------------------------------

    def _admit(
        self,
        kind: str,
        op: str,
        units_by_partition: Mapping[bytes, int],
        requests_by_partition: Mapping[bytes, int],
    ) -> None:
        """Count the requests; with a limiter, take the units or raise Throttled."""
        for partition, count in requests_by_partition.items():
            self._record(partition, kind, requests=count, op=op)
        if self.limiter is None:
            return
        refusal = self.limiter.try_acquire(kind, units_by_partition)
        if refusal is None:
            return
        self._count_throttled([refusal.partition])
        partition_name = refusal.partition.decode("utf-8", "backslashreplace")
        partition_class = partition_class_or_unknown(refusal.partition)
        raise store.Throttled(
            f"partition {partition_name[:120]!r} is over its {kind} capacity "
            f"({self.limiter.rates[kind]:g} units/s); retry in {refusal.retry_delay:.3f}s",
            metadata={
                "partition": partition_name,
                "partition_class": partition_class,
                "capacity": kind,
            },
            retry_delay=refusal.retry_delay,
        )

    def _charge(self, kind: str, partition: bytes, units: int, prepaid: int) -> None:
        """Record `units` consumed; take from the limiter whatever admission did not."""
        self._record(partition, kind, units=units)
        if self.limiter is not None and units > prepaid:
            self.limiter.charge(kind, partition, units - prepaid)

    def _time(self, op: str, partitions_used: bytes | Iterable[bytes], started: float) -> None:
        """Observe the backend time of `op` since `started` (perf_counter), under the
        partition class of `partitions_used` (one partition, or the partitions of a batch)."""
        metrics = self._metrics
        if metrics is None:
            return
        elapsed = time.perf_counter() - started
        if isinstance(partitions_used, (bytes, bytearray, memoryview)):
            partition_class = partition_class_or_unknown(bytes(partitions_used))
        else:
            classes = {partition_class_or_unknown(p) for p in partitions_used}
            partition_class = classes.pop() if len(classes) == 1 else "mixed"
        metrics.child(metrics.latency, op, partition_class).observe(elapsed)

    def _count_throttled(self, partitions_hit: Iterable[bytes]) -> None:
        for partition in partitions_hit:
            self._record(partition, kind=None, throttled=1)

    def _record(
        self,
        partition: bytes,
        kind: str | None,
        *,
        requests: int = 0,
        units: int = 0,
        throttled: int = 0,
        op: str | None = None,
    ) -> None:
        if isinstance(partition, (bytearray, memoryview)):
            partition = bytes(partition)  # usable as a dict key
        partition_class = partition_class_or_unknown(partition)
        with self._lock:
            class_totals = self._by_class.get(partition_class)
            if class_totals is None:
                class_totals = self._by_class[partition_class] = CapacityTotals()
            partition_totals = self._by_partition.get(partition)
            if partition_totals is None:
                if len(self._by_partition) >= self._max_tracked_partitions:
                    self._forget_colder_half()
                partition_totals = self._by_partition[partition] = CapacityTotals()
            for totals in (class_totals, partition_totals):
                if kind == READ:
                    totals.reads += requests
                    totals.read_units += units
                elif kind == WRITE:
                    totals.writes += requests
                    totals.write_units += units
                totals.throttled += throttled

        metrics = self._metrics
        if metrics is None:
            return
        if requests and op is not None:
            metrics.child(metrics.requests, partition_class, op).inc(requests)
        if units and kind == READ:
            metrics.child(metrics.read_units, partition_class).inc(units)
        if units and kind == WRITE:
            metrics.child(metrics.write_units, partition_class).inc(units)
        if throttled:
            metrics.child(metrics.throttled, partition_class).inc(throttled)

    def _forget_colder_half(self) -> None:
        keep = heapq.nlargest(
            self._max_tracked_partitions // 2,
            self._by_partition.items(),
            key=lambda item: item[1].total_units,
        )
        self._by_partition = dict(keep)


class _MeteredScanIterator(store.ScanIterator):
    """Meters a scan page by page: a page is `batch_size` items, as the backend fetches them.

    A page is admitted (and charged its 1-unit minimum) when its first item is asked for;
    further units are charged as the returned bytes cross each 4 KB, so an iterator that is
    abandoned midway has paid for exactly what it received.
    """

    def __init__(
        self, meter: MeteredStore, partition: bytes, inner: store.ScanIterator, batch_size: int
    ):
        self._meter = meter
        self._partition = partition
        self._inner = inner
        self._batch_size = max(1, batch_size)
        self._page_open = False
        self._page_items = 0
        self._page_bytes = 0
        self._page_units = 0
        # After the end, further next() calls must not open (and pay for) new pages.
        self._exhausted = False

    def __next__(self) -> store.KeyValue:
        if self._exhausted:
            raise StopIteration
        if not self._page_open:
            self._meter._admit(READ, "scan", {self._partition: 1}, {self._partition: 1})
            self._meter._charge(READ, self._partition, units=1, prepaid=1)
            self._page_open = True
            self._page_items = 0
            self._page_bytes = 0
            self._page_units = 1
        # The first item of a page is when the backend fetches it: time that.
        started = time.perf_counter() if self._page_items == 0 else None
        try:
            item = next(self._inner)
        except StopIteration:
            self._page_open = False
            self._exhausted = True
            raise
        except store.Throttled:
            self._page_open = False
            self._meter._count_throttled([self._partition])
            raise
        if started is not None:
            self._meter._time("scan_page", self._partition, started)
        self._page_items += 1
        self._page_bytes += store.item_size(self._partition, item.key, item.value)
        units = read_units(self._page_bytes)
        if units > self._page_units:
            self._meter._charge(READ, self._partition, units=units - self._page_units, prepaid=0)
            self._page_units = units
        if self._page_items >= self._batch_size:
            self._page_open = False
        return item

    def seek_ge(self, key: bytes) -> None:
        # Repositioning is a new query for the backend: the next item opens a new page.
        self._inner.seek_ge(key)
        self._page_open = False
        self._exhausted = False

    def close(self) -> None:
        self._inner.close()
