"""The KV store interface (store.py) and `open_store(url)` to pick a backend by URL.

Backends are imported lazily inside open_store, so importing quarry.kv costs nothing and a
backend whose module is missing (or whose dependencies are) only fails when asked for.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quarry.kv.store import (
    ABSENT,
    DEFAULT_SCAN_BATCH_SIZE,
    EXISTS,
    ITEM_ATTRIBUTE_NAMES,
    MAX_ITEM_BYTES,
    MAX_KEY_BYTES,
    MAX_PARTITION_KEY_BYTES,
    MAX_SCAN_BATCH_SIZE,
    BackendUnavailable,
    Equals,
    GetResult,
    ItemTooLarge,
    KeyNotFound,
    KeyTooLarge,
    KeyValue,
    MissingKey,
    MissingPartitionKey,
    MissingPredicate,
    MissingValue,
    Predicate,
    PredicateFailed,
    ScanIterator,
    Store,
    Throttled,
    UnknownPartitionClass,
    item_size,
)

if TYPE_CHECKING:
    from quarry.config import Settings

__all__ = [
    "ABSENT",
    "DEFAULT_SCAN_BATCH_SIZE",
    "MAX_SCAN_BATCH_SIZE",
    "EXISTS",
    "ITEM_ATTRIBUTE_NAMES",
    "MAX_ITEM_BYTES",
    "MAX_KEY_BYTES",
    "MAX_PARTITION_KEY_BYTES",
    "BackendUnavailable",
    "Equals",
    "GetResult",
    "ItemTooLarge",
    "KeyNotFound",
    "KeyTooLarge",
    "KeyValue",
    "MissingKey",
    "MissingPartitionKey",
    "MissingPredicate",
    "MissingValue",
    "Predicate",
    "PredicateFailed",
    "ScanIterator",
    "Store",
    "Throttled",
    "UnknownPartitionClass",
    "item_size",
    "open_store",
    "ThrottleRetry",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ThrottleRetry:
    """How a backend that throttles (DynamoDB) retries a throttled call: `retries` times
    more, each after a full-jitter backoff (jitter.backoff, low=0) from `base_seconds`
    doubling up to `cap_seconds`; then Throttled (RESOURCE_EXHAUSTED, with a retry delay).
    The kv-gateway's come from Settings (kv_throttle_*)."""

    retries: int = 8
    base_seconds: float = 0.05
    cap_seconds: float = 2.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ThrottleRetry:
        return cls(
            settings.kv_throttle_retries,
            settings.kv_throttle_backoff_base_seconds,
            settings.kv_throttle_backoff_cap_seconds,
        )


def open_store(url: str, throttle: ThrottleRetry | None = None) -> Store:
    """Open a KV store from a URL:

    memory://                                    in-process, for tests
    sqlite:///abs/path.db  |  sqlite://rel.db    the embedded default (a file)
    dynamodb://TABLE?endpoint_url=http://127.0.0.1:8000&region=us-east-1&create_table=true
    quarry://host:port                           the kv-gateway over gRPC

    `throttle`: how DynamoDB retries throttled calls (default ThrottleRetry()).
    """
    from quarry import errors

    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    params = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))

    if scheme == "memory":
        from quarry.kv.memory import MemoryStore

        return MemoryStore()

    if scheme == "sqlite":
        # sqlite:///abs/path → "/abs/path"; sqlite://rel/path → "rel/path" (netloc + path).
        path = urllib.parse.unquote(parsed.netloc + parsed.path)
        if not path:
            raise errors.InvalidArgument(f"sqlite URL needs a file path: {url!r}")
        from quarry.kv.sqlite import SQLiteStore

        return SQLiteStore(path)

    if scheme == "dynamodb":
        table = urllib.parse.unquote(parsed.netloc)
        if not table:
            raise errors.InvalidArgument(f"dynamodb URL needs a table name: {url!r}")
        unknown = set(params) - {"endpoint_url", "region", "create_table"}
        if unknown:
            raise errors.InvalidArgument(f"unknown dynamodb URL parameters {sorted(unknown)}")
        create = params.get("create_table", "true").lower()
        if create not in _TRUE | _FALSE:
            raise errors.InvalidArgument(f"create_table must be true or false, not {create!r}")
        from quarry.kv.dynamodb import DynamoDBOptions, DynamoDBStore

        throttle = throttle or ThrottleRetry()
        return DynamoDBStore(
            table,
            endpoint_url=params.get("endpoint_url") or None,
            region=params.get("region") or "us-east-1",
            create_table=create in _TRUE,
            options=DynamoDBOptions(
                max_throttle_retries=throttle.retries,
                backoff_base=throttle.base_seconds,
                backoff_max=throttle.cap_seconds,
            ),
        )

    if scheme == "quarry":
        # The kv-gateway client (quarry.kv.remote), written alongside the gateway service.
        if not parsed.netloc:
            raise errors.InvalidArgument(f"quarry URL needs host:port: {url!r}")
        from quarry.kv.remote import RemoteStore

        return RemoteStore(parsed.netloc)

    raise errors.InvalidArgument(
        f"unknown KV store URL {url!r} (expected memory://, sqlite://, dynamodb:// or quarry://)"
    )
