"""The KV store contract (docs/architecture.md §3), shared by every backend and the remote client.

Partitions and keys are bytes. Within one partition keys are ordered by unsigned byte
comparison. There are no transactions and no cross-partition operations: the only
conditional writes are `set_if` and `delete_if` on a single key.

Predicates for `set_if`:
  * `ABSENT`             – succeed only if the key does not exist;
  * `EXISTS`             – succeed only if the key exists (any value, including b"");
  * `Equals(previous)`   – succeed only if the stored value equals `previous`, the
                           `predicate` returned by an earlier `get`.
An empty value (b"") is a real value, distinct from a missing key, also as a predicate.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from quarry import errors

# DynamoDB's limits, enforced on every backend so the embedded default never accepts what
# production would refuse. Item size is computed as DynamoDB does: attribute-name lengths
# plus value lengths, for our three attributes (see ITEM_ATTRIBUTE_NAMES).
MAX_ITEM_BYTES = 400 * 1024
MAX_PARTITION_KEY_BYTES = 2048
MAX_KEY_BYTES = 1024
ITEM_ATTRIBUTE_NAMES = (b"pk", b"k", b"v")
ITEM_OVERHEAD_BYTES = sum(len(n) for n in ITEM_ATTRIBUTE_NAMES)

# Scan page sizes, in items: the default of every backend and client, and the most the
# kv-gateway serves per page whatever a caller asks for.
DEFAULT_SCAN_BATCH_SIZE = 1000
MAX_SCAN_BATCH_SIZE = 10_000


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


class WrongStagingShard(errors.InvalidArgument):
    """A staged key written into a shard partition of its token that is not the key's shard."""

    reason = "WRONG_STAGING_SHARD"


class InvalidStagingShards(errors.InvalidArgument):
    """A staging shard count outside 1..MAX_STAGING_SHARDS."""

    reason = "INVALID_STAGING_SHARDS"


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
        raise KeyTooLarge(
            f"partition key is {len(partition)} bytes; the limit is {MAX_PARTITION_KEY_BYTES}"
        )


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

    def close(self) -> None:  # noqa: B027 — optional hook: most iterators hold nothing
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
    def delete_if(self, partition: bytes, key: bytes, predicate: Equals) -> None:
        """Compare-and-delete: delete the key only if its stored value equals the predicate's
        (the `predicate` of an earlier get). PredicateFailed if it differs or the key is
        missing; MissingPredicate if None."""

    @abc.abstractmethod
    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = DEFAULT_SCAN_BATCH_SIZE,
    ) -> ScanIterator:
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

    def set_then_get(
        self,
        items: Sequence[tuple[bytes, bytes, bytes]],
        then_get: Sequence[tuple[bytes, bytes]],
    ) -> list[GetResult | None]:
        """Write `items` (one item: `set`, more: `batch_set`), then, once every write is
        done, `batch_get` the keys of `then_get` (results as batch_get's): a write and the
        read that must see it. Exactly those operations, in that order; a failed write reads
        nothing. The remote store sends them in one round trip (kv-gateway SetItemsThenGet)."""
        if len(items) == 1:
            self.set(*items[0])
        else:
            self.batch_set(items)
        return self.batch_get(then_get)

    def close(self) -> None:  # noqa: B027 — optional hook: in-memory stores hold nothing
        """Release connections."""


# ---- helpers shared by the backends in this package ------------------------------------
# Added alongside the interface so every backend validates and pages the same way; the
# remote client may use them too.


def has_items(store: Store, partition: bytes) -> bool:
    """Whether `partition` holds any item (a scan of one)."""
    iterator = store.scan(partition, batch_size=1)
    try:
        return next(iter(iterator), None) is not None
    finally:
        iterator.close()


def check_predicate(predicate: object) -> None:
    if predicate is None:
        raise MissingPredicate("predicate is required: ABSENT, EXISTS or Equals(previous)")
    if not isinstance(predicate, (_Absent, _Exists, Equals)):
        # A common slip is passing GetResult.predicate (bytes) instead of Equals(...).
        raise errors.InvalidArgument(
            f"predicate must be ABSENT, EXISTS or Equals(bytes), not {type(predicate).__name__}"
        )
    if isinstance(predicate, Equals) and predicate.value is None:
        raise MissingPredicate("Equals(previous) needs the previous value")


def check_delete_predicate(predicate: object) -> None:
    """delete_if takes Equals(previous) only (ABSENT would delete nothing, EXISTS is an
    unconditional delete)."""
    if predicate is None:
        raise MissingPredicate("delete_if needs a predicate: Equals(previous)")
    if not isinstance(predicate, Equals):
        raise errors.InvalidArgument(
            f"delete_if predicate must be Equals(bytes), not {predicate!r}"
        )
    check_predicate(predicate)


def normalize_end(end: bytes | None) -> bytes | None:
    """An empty end key means "no end", like None (a protobuf bytes field cannot tell them
    apart, and an empty exclusive end would select nothing)."""
    return end if end else None


def check_scan(partition: bytes, start: bytes, end: bytes | None, batch_size: int) -> None:
    check_partition(partition)
    # Bounds longer than any key cannot be expressed in a DynamoDB key condition; refuse
    # them everywhere so every backend behaves alike.
    for name, bound in (("start", start), ("end", end)):
        if bound is not None and len(bound) > MAX_KEY_BYTES:
            raise KeyTooLarge(
                f"scan {name} key is {len(bound)} bytes; the limit is {MAX_KEY_BYTES}"
            )
    if batch_size < 1:
        raise errors.InvalidArgument(f"batch_size must be >= 1, got {batch_size}")


# A backend's page read: (partition, lower, after, end, limit) -> (KeyValues, resume cursor).
PageReader = Callable[
    [bytes, bytes, "bytes | None", "bytes | None", int], "tuple[list[KeyValue], bytes | None]"
]


class PagedScanIterator(ScanIterator):
    """The ScanIterator of every backend that reads one page of a partition at a time.

    `read_page(partition, lower, after, end, limit)` returns up to `limit` KeyValues of the
    partition in ascending order with key >= `lower`, key > `after` (when `after` is not
    None) and, if it can, key < `end`, with the cursor to resume after (normally the last
    key read) or None when the partition holds nothing further.

    Each page is a fresh read that resumes strictly after the previous page's cursor, so a
    scan never holds a read snapshot open, never returns a key twice or out of order, and
    keys deleted while it pages are simply not seen. `seek_ge` only resets the cursor.
    Seeks are clamped to the scan's [start, end) range.
    """

    def __init__(
        self,
        read_page: PageReader,
        partition: bytes,
        start: bytes,
        end: bytes | None,
        batch_size: int,
    ):
        self._read_page = read_page
        self._partition = partition
        self.start = start
        self.end = end
        self.batch_size = batch_size
        self._buffer: collections.deque[KeyValue] = collections.deque()
        self._lower = start
        self._cursor: bytes | None = None
        self._done = False
        self._closed = False

    def _fetch_page(
        self, lower: bytes, after: bytes | None, limit: int
    ) -> tuple[list[KeyValue], bytes | None]:
        return self._read_page(self._partition, lower, after, self.end, limit)

    def __next__(self) -> KeyValue:
        if self._closed:
            raise errors.FailedPrecondition("scan iterator is closed")
        while not self._buffer:
            if self._done:
                raise StopIteration
            self._fill()
        return self._buffer.popleft()

    def _fill(self) -> None:
        if self.end is not None and self._lower >= self.end:
            self._done = True
            return
        items, cursor = self._fetch_page(self._lower, self._cursor, self.batch_size)
        for kv in items:
            # The end bound is enforced here as well, for backends that can only push an
            # inclusive bound down (DynamoDB's BETWEEN).
            if self.end is not None and kv.key >= self.end:
                cursor = None
                break
            self._buffer.append(kv)
        self._cursor = cursor
        if cursor is None:
            self._done = True

    def seek_ge(self, key: bytes) -> None:
        if self._closed:
            raise errors.FailedPrecondition("scan iterator is closed")
        if len(key) > MAX_KEY_BYTES:
            raise KeyTooLarge(f"seek key is {len(key)} bytes; the limit is {MAX_KEY_BYTES}")
        self._buffer.clear()
        self._lower = max(key, self.start)
        self._cursor = None
        self._done = False

    def close(self) -> None:
        self._closed = True
        self._buffer.clear()


def check_batch_keys(items: Sequence[tuple[bytes, bytes]]) -> None:
    """Validate every (partition, key) before a batch touches the backend."""
    for partition, key in items:
        check_key(partition, key)


def check_batch_items(items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
    """Validate every (partition, key, value) before a batch touches the backend."""
    for partition, key, value in items:
        check_item(partition, key, value)


class PagedStore(Store):
    """A Store that reads a partition one page at a time: its `scan` is this one (checks,
    then a PagedScanIterator over `_page`, see PageReader); a backend implements `_page`."""

    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = DEFAULT_SCAN_BATCH_SIZE,
    ) -> ScanIterator:
        end = normalize_end(end)
        check_scan(partition, start, end, batch_size)
        return PagedScanIterator(
            self._page,
            bytes(partition),
            bytes(start),
            None if end is None else bytes(end),
            batch_size,
        )

    @abc.abstractmethod
    def _page(
        self, partition: bytes, lower: bytes, after: bytes | None, end: bytes | None, limit: int
    ) -> tuple[list[KeyValue], bytes | None]: ...
