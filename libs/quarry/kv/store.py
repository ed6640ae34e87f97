"""The KV store contract (ARCHITECTURE.md §3), shared by every backend and the remote client.

Partitions and keys are bytes. Within one partition keys are ordered by unsigned byte
comparison. There are no transactions and no cross-partition operations: the only
conditional write is `set_if` on a single key.

Predicates for `set_if`:
  * `ABSENT`             – succeed only if the key does not exist;
  * `EXISTS`             – succeed only if the key exists (any value, including b"");
  * `Equals(previous)`   – succeed only if the stored value equals `previous`, the
                           `predicate` returned by an earlier `get`.
An empty value (b"") is a real value, distinct from a missing key, also as a predicate.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterator, Sequence

from quarry import errors

# DynamoDB's limits, enforced on every backend so the embedded default never accepts what
# production would refuse. Item size is computed as DynamoDB does: attribute-name lengths
# plus value lengths, for our three attributes (see ITEM_ATTRIBUTE_NAMES).
MAX_ITEM_BYTES = 400 * 1024
MAX_PARTITION_KEY_BYTES = 2048
MAX_KEY_BYTES = 1024
ITEM_ATTRIBUTE_NAMES = (b"pk", b"k", b"v")
ITEM_OVERHEAD_BYTES = sum(len(n) for n in ITEM_ATTRIBUTE_NAMES)

DEFAULT_SCAN_BATCH_SIZE = 1000


# ---- errors ---------------------------------------------------------------------------

class MissingPartitionKey(errors.InvalidArgument):
    reason = "MISSING_PARTITION_KEY"


class MissingKey(errors.InvalidArgument):
    reason = "MISSING_KEY"


class MissingValue(errors.InvalidArgument):
    reason = "MISSING_VALUE"


class MissingPredicate(errors.InvalidArgument):
    reason = "MISSING_PREDICATE"


class KeyTooLarge(errors.InvalidArgument):
    reason = "KEY_TOO_LARGE"


class ItemTooLarge(errors.InvalidArgument):
    reason = "ITEM_TOO_LARGE"


class UnknownPartitionClass(errors.InvalidArgument):
    reason = "UNKNOWN_PARTITION_CLASS"


class KeyNotFound(errors.NotFound):
    reason = "KEY_NOT_FOUND"


class PredicateFailed(errors.Aborted):
    reason = "PREDICATE_FAILED"


class Throttled(errors.ResourceExhausted):
    """The backend (or the local limiter) refused for capacity; retry after `retry_delay`."""

    reason = "THROTTLED"


class BackendUnavailable(errors.Unavailable):
    reason = "KV_UNAVAILABLE"


# ---- predicates -----------------------------------------------------------------------

class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


class _Exists:
    __slots__ = ()

    def __repr__(self) -> str:
        return "EXISTS"


ABSENT = _Absent()
EXISTS = _Exists()


@dataclass(frozen=True)
class Equals:
    """Succeed only if the stored value equals `value` (bytes previously returned by get)."""

    value: bytes


Predicate = _Absent | _Exists | Equals


# ---- values ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GetResult:
    value: bytes
    # Opaque token to pass back as Equals(predicate); every backend here uses the value.
    predicate: bytes


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes


# ---- validation shared by every backend -----------------------------------------------

def check_partition(partition: bytes) -> None:
    if not partition:
        raise MissingPartitionKey("partition key is required")
    if len(partition) > MAX_PARTITION_KEY_BYTES:
        raise KeyTooLarge(f"partition key is {len(partition)} bytes; the limit is "
                          f"{MAX_PARTITION_KEY_BYTES}")


def check_key(partition: bytes, key: bytes) -> None:
    check_partition(partition)
    if not key:
        raise MissingKey("key is required")
    if len(key) > MAX_KEY_BYTES:
        raise KeyTooLarge(f"key is {len(key)} bytes; the limit is {MAX_KEY_BYTES}")


def item_size(partition: bytes, key: bytes, value: bytes) -> int:
    return ITEM_OVERHEAD_BYTES + len(partition) + len(key) + len(value)


def check_item(partition: bytes, key: bytes, value: bytes | None) -> None:
    check_key(partition, key)
    if value is None:
        raise MissingValue("value is required (an empty value is allowed)")
    size = item_size(partition, key, value)
    if size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"item is {size} bytes; the limit is {MAX_ITEM_BYTES}")


# ---- the interface --------------------------------------------------------------------

class ScanIterator(abc.ABC):
    """Iterates KeyValues of ONE partition in ascending key order, fetching pages lazily.

    `seek_ge(key)` repositions the same iterator (forward or backward) at the first key
    >= `key`, without the caller starting a new scan.
    """

    def __iter__(self) -> Iterator[KeyValue]:
        return self

    @abc.abstractmethod
    def __next__(self) -> KeyValue: ...

    @abc.abstractmethod
    def seek_ge(self, key: bytes) -> None: ...

    def close(self) -> None:
        """Release resources early; iterating after close is an error."""


class Store(abc.ABC):
    """One KV backend (or the remote gateway client). Thread-safe."""

    @abc.abstractmethod
    def get(self, partition: bytes, key: bytes) -> GetResult:
        """Raise KeyNotFound if missing."""

    @abc.abstractmethod
    def set(self, partition: bytes, key: bytes, value: bytes) -> None: ...

    @abc.abstractmethod
    def set_if(self, partition: bytes, key: bytes, value: bytes, predicate: Predicate) -> None:
        """Raise PredicateFailed if the predicate does not hold; MissingPredicate if None."""

    @abc.abstractmethod
    def delete(self, partition: bytes, key: bytes) -> None:
        """Idempotent: deleting a missing key succeeds."""

    @abc.abstractmethod
    def scan(self, partition: bytes, start: bytes = b"", end: bytes | None = None,
             batch_size: int = DEFAULT_SCAN_BATCH_SIZE) -> ScanIterator:
        """Keys k with start <= k < end (end exclusive, None = to the end of the partition)."""

    @abc.abstractmethod
    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[GetResult | None]:
        """Unconditional bulk read; result i is None where item i is missing."""

    @abc.abstractmethod
    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        """Unconditional bulk write of (partition, key, value); not atomic as a whole."""

    @abc.abstractmethod
    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Unconditional, idempotent bulk delete; not atomic as a whole."""

    def close(self) -> None:
        """Release connections."""
