"""Coercion of what callers pass into the client's wire messages: entries (from an Entry, a
mapping of its fields, or keyword arguments), timestamps and request ids (AIP-155)."""

from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Mapping
from typing import Any

from google.protobuf import timestamp_pb2

from quarry.v1 import types_pb2

Entry = types_pb2.Entry

# quarry.v1.Entry's fields, in their order.
ENTRY_FIELDS = tuple(field.name for field in Entry.DESCRIPTOR.fields)


def to_timestamp(value: Any) -> timestamp_pb2.Timestamp | None:
    """A Timestamp from a Timestamp, an aware/naive (UTC) datetime or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, timestamp_pb2.Timestamp):
        return value
    ts = timestamp_pb2.Timestamp()
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        ts.FromDatetime(value)
        return ts
    if isinstance(value, (int, float)):
        ts.FromNanoseconds(int(round(value * 1e9)))
        return ts
    raise TypeError(
        f"mtime must be a Timestamp, datetime or epoch seconds, not {type(value).__name__}"
    )


def make_entry(  # noqa: PLR0913 — one keyword per Entry field: the public constructor
    path: str,
    physical_address: str = "",
    size_bytes: int = 0,
    checksum: str = "",
    mtime: Any = None,
    content_type: str = "",
    metadata: Mapping[str, str] | None = None,
) -> types_pb2.Entry:
    """A quarry.v1.Entry; `mtime` may be a Timestamp, datetime or epoch seconds."""
    entry = types_pb2.Entry(
        path=path,
        physical_address=physical_address,
        size_bytes=int(size_bytes),
        checksum=checksum,
        content_type=content_type,
        metadata=dict(metadata or {}),
    )
    stamp = to_timestamp(mtime)
    if stamp is not None:
        entry.mtime.CopyFrom(stamp)
    return entry


def as_entry(value: types_pb2.Entry | Mapping[str, Any]) -> types_pb2.Entry:
    """An Entry as given, or one made from a mapping of its fields (TypeError for others)."""
    if isinstance(value, types_pb2.Entry):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - set(ENTRY_FIELDS)
        if unknown:
            raise TypeError(f"unknown Entry fields: {', '.join(sorted(unknown))}")
        return make_entry(**value)
    raise TypeError(
        f"expected a quarry.v1.Entry or a mapping of its fields, not {type(value).__name__}"
    )


# ---- request ids (AIP-155) ---------------------------------------------------------------


def new_request_id() -> str:
    """A fresh request id (AIP-155: a UUID4 string)."""
    return str(uuid.uuid4())


def request_id_or_new(given: str | None) -> str:
    """The id of one logical call: the caller's, or a fresh one (kept across retries, as
    the request message is)."""
    return new_request_id() if given is None else given


def batch_request_id(request_id: str, index: int) -> str:
    """The id of message/call `index` of a multi-message logical call with `request_id`:
    a UUID derived deterministically, so a replay sends the same ids."""
    return str(uuid.uuid5(uuid.UUID(request_id), str(index)))


__all__ = [
    "Entry",
    "ENTRY_FIELDS",
    "to_timestamp",
    "make_entry",
    "as_entry",
    "new_request_id",
    "request_id_or_new",
    "batch_request_id",
]
