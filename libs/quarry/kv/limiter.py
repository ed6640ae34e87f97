"""`PartitionLimiter` reproduces DynamoDB's hot-partition throttling locally
(docs/architecture.md §3); `MeteredStore` (quarry.kv.metering) admits requests through it.

A token bucket per partition and direction (3,000 read units/s, 1,000 write units/s, burst = one second of
capacity). Write costs are known before the call and must be available in full. A read's
cost is known only once the item is seen, so a read is admitted if 1 unit is available, that
unit is taken up front, and the rest is charged afterwards, possibly into debt; a partition
in debt refuses further requests until it has refilled. This lets one large read through
and makes the next ones wait, which is how DynamoDB behaves too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from quarry.kv.capacity import READ, WRITE

# How much a bucket holds: one second of capacity, roughly DynamoDB's burst allowance.
BURST_SECONDS = 1.0

# Float refills (e.g. 0.1 s * 10 units/s) may land a hair below a whole unit.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Refusal:
    """Why the limiter refused: which partition ran out, and when to try again."""

    partition: bytes
    kind: str  # READ or WRITE
    retry_delay: float  # seconds until enough units will have refilled


class _Bucket:
    __slots__ = ("tokens", "updated")

    def __init__(self, tokens: float, updated: float):
        self.tokens = tokens
        self.updated = updated


class PartitionLimiter:
    """Token buckets per (partition, READ|WRITE); thread-safe; `clock` is injectable."""

    # Full buckets are indistinguishable from absent ones; forget them this often so the
    # map does not grow with every staging token ever used.
    SWEEP_INTERVAL_SECONDS = 10.0

    def __init__(
        self,
        read_units_per_second: float = 3000,
        write_units_per_second: float = 1000,
        clock: Callable[[], float] = time.monotonic,
        burst_seconds: float = BURST_SECONDS,
    ):
        if read_units_per_second <= 0 or write_units_per_second <= 0:
            raise ValueError("unit rates must be positive")
        self.rates = {READ: float(read_units_per_second), WRITE: float(write_units_per_second)}
        self._clock = clock
        self._burst_seconds = burst_seconds
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, bytes], _Bucket] = {}
        self._last_sweep = clock()

    def capacity(self, kind: str) -> float:
        return self.rates[kind] * self._burst_seconds

    def try_acquire(self, kind: str, units_by_partition: Mapping[bytes, int]) -> Refusal | None:
        """Take the units from every partition's bucket, or from none of them.

        A cost larger than a whole bucket only needs a full bucket (otherwise it could never
        pass) and leaves the bucket in debt. Returns None when admitted, else the Refusal
        with the longest wait, after which the whole request would be admitted.
        """
        rate = self.rates[kind]
        capacity = self.capacity(kind)
        with self._lock:
            now = self._clock()
            self._maybe_sweep(now)
            refusal: Refusal | None = None
            admitted: list[tuple[_Bucket, int]] = []
            for partition, units in units_by_partition.items():
                bucket = self._refilled_bucket(kind, partition, now)
                needed = min(units, capacity)
                if bucket.tokens + _EPSILON < needed:
                    delay = (needed - bucket.tokens) / rate
                    if refusal is None or delay > refusal.retry_delay:
                        refusal = Refusal(partition=partition, kind=kind, retry_delay=delay)
                admitted.append((bucket, units))
            if refusal is not None:
                return refusal
            for bucket, units in admitted:
                bucket.tokens -= units
            return None

    def charge(self, kind: str, partition: bytes, units: int) -> None:
        """Take `units` unconditionally (the part of a read's cost learnt after the read)."""
        if units <= 0:
            return
        with self._lock:
            now = self._clock()
            self._refilled_bucket(kind, partition, now).tokens -= units

    def available(self, kind: str, partition: bytes) -> float:
        """Units currently in the bucket (negative when in debt); for tests and debugging."""
        with self._lock:
            return self._refilled_bucket(kind, partition, self._clock()).tokens

    def _refilled_bucket(self, kind: str, partition: bytes, now: float) -> _Bucket:
        capacity = self.capacity(kind)
        bucket = self._buckets.get((kind, partition))
        if bucket is None:
            bucket = _Bucket(tokens=capacity, updated=now)
            self._buckets[(kind, partition)] = bucket
        elif now > bucket.updated:
            bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * self.rates[kind])
            bucket.updated = now
        return bucket

    def _maybe_sweep(self, now: float) -> None:
        if now - self._last_sweep < self.SWEEP_INTERVAL_SECONDS:
            return
        self._last_sweep = now
        for (kind, partition), bucket in list(self._buckets.items()):
            refilled = bucket.tokens + (now - bucket.updated) * self.rates[kind]
            if refilled >= self.capacity(kind):
                del self._buckets[(kind, partition)]
