"""Domain values (quarry.graveler.model) <-> quarry.v1 protobuf messages.

mtime: google.protobuf.Timestamp <-> Entry.mtime_us (microseconds since the epoch; an unset
Timestamp is 0, and 0 is sent as an unset Timestamp).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

from quarry import errors
from quarry.graveler.errors import InvalidEntry
from quarry.graveler.model import (
    Change,
    ChangeType,
    Conflict,
    DiffSummary,
    Entry,
    MergeStrategy,
    RangeInfo,
)
from quarry.v1 import types_pb2

# google.protobuf.Timestamp's valid range (0001-01-01 .. 9999-12-31), as its own checks say.
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799


def entry_to_proto(entry: Entry, out: types_pb2.Entry | None = None) -> types_pb2.Entry:
    message = out if out is not None else types_pb2.Entry()
    message.path = entry.path
    message.physical_address = entry.physical_address
    message.size_bytes = entry.size_bytes
    message.checksum = entry.checksum
    mtime_us = entry.mtime_us
    if mtime_us:
        # Timestamp.FromMicroseconds, inlined (bulk streams: an import sends one per object).
        seconds, micros = divmod(mtime_us, 1_000_000)
        mtime = message.mtime
        mtime.seconds = seconds
        mtime.nanos = micros * 1000
    message.content_type = entry.content_type
    if entry.metadata:
        message.metadata.update(entry.metadata)
    return message


def seconds_of(stamp: Any, field: str) -> float:
    """A request's Timestamp as epoch seconds; one outside the Timestamp range (seconds,
    or nanos outside [0, 1e9)) is the caller's mistake: INVALID_ARGUMENT, never INTERNAL."""
    seconds, nanos = stamp.seconds, stamp.nanos
    if not (_MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos < 1_000_000_000):
        raise errors.InvalidArgument(
            f"{field}: seconds {seconds}, nanos {nanos} are outside the Timestamp range",
            metadata={"field": field},
        )
    return float(seconds) + nanos / 1e9


def entry_from_proto(message: types_pb2.Entry, path: str | None = None) -> Entry:
    """`path` overrides message.path (e.g. the path of the enclosing Change). An mtime
    outside the Timestamp range is the caller's mistake: InvalidEntry, never INTERNAL."""
    mtime_us = 0
    if message.HasField("mtime"):
        # Timestamp.ToMicroseconds with its validity check, inlined (the range-writer decodes
        # one per entry of a WriteMetaRange stream).
        mtime = message.mtime
        seconds, nanos = mtime.seconds, mtime.nanos
        if not (_MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos < 1_000_000_000):
            raise InvalidEntry(
                f"{message.path}: invalid mtime: seconds {seconds}, nanos {nanos} outside "
                f"the Timestamp range [{_MIN_SECONDS}, {_MAX_SECONDS}] s, [0, 1e9) ns",
                metadata={"path": message.path},
            )
        mtime_us = seconds * 1_000_000 + nanos // 1000
    metadata = message.metadata
    return Entry(
        path if path is not None else message.path,
        message.physical_address,
        message.size_bytes,
        message.checksum,
        mtime_us,
        message.content_type,
        dict(metadata) if metadata else None,
    )


def change_to_proto(change: Change, out: types_pb2.Change | None = None) -> types_pb2.Change:
    message = out if out is not None else types_pb2.Change()
    message.type = cast("types_pb2.ChangeType.ValueType", int(change.type))
    message.path = change.path
    if change.entry is not None and change.type != ChangeType.REMOVED:
        entry_to_proto(change.entry, message.entry)
    return message


def change_from_proto(message: types_pb2.Change) -> Change:
    """A Change (entry None for REMOVED or when absent). An entry without a path takes the
    change's path. ValueError for an unknown type or an entry for another path."""
    try:
        change_type = ChangeType(message.type)
    except ValueError:
        raise ValueError(f"change at {message.path!r} has no valid type") from None
    if change_type == ChangeType.REMOVED or not message.HasField("entry"):
        return Change(change_type, message.path, None)
    entry = message.entry
    if entry.path and entry.path != message.path:
        raise ValueError(f"change at {message.path!r} carries an entry for {entry.path!r}")
    return Change(change_type, message.path, entry_from_proto(entry, path=message.path))


def put_or_delete_to_proto(
    path: str, entry: Entry | None, out: types_pb2.Change | None = None
) -> types_pb2.Change:
    """A (path, entry | None) apply input as a Change message (CHANGED for a put: the
    range-writer works out what really changed)."""
    message = out if out is not None else types_pb2.Change()
    message.path = path
    if entry is None:
        message.type = types_pb2.CHANGE_TYPE_REMOVED
    else:
        message.type = types_pb2.CHANGE_TYPE_CHANGED
        entry_to_proto(entry, message.entry)
    return message


def put_or_delete_from_proto(message: types_pb2.Change) -> tuple[str, Entry | None]:
    """An apply input: REMOVED = delete; ADDED or CHANGED = put, which needs an entry."""
    change = change_from_proto(message)
    if change.type not in (ChangeType.ADDED, ChangeType.CHANGED, ChangeType.REMOVED):
        raise ValueError(f"change at {message.path!r}: {change.type.name} cannot be applied")
    if change.type != ChangeType.REMOVED and change.entry is None:
        raise ValueError(f"change at {message.path!r} has no entry")
    return change.path, change.entry


def conflict_to_proto(
    conflict: Conflict, out: types_pb2.Conflict | None = None
) -> types_pb2.Conflict:
    """A merge conflict; a side where the path is absent (deleted) leaves its field unset."""
    message = out if out is not None else types_pb2.Conflict()
    message.path = conflict.path
    for side in ("base", "source", "destination"):
        entry = getattr(conflict, side)
        if entry is not None:
            entry_to_proto(entry, getattr(message, side))
    return message


def conflict_from_proto(message: types_pb2.Conflict) -> Conflict:
    """Unset sides are None; entries take the conflict's path."""

    def side(name: Literal["base", "source", "destination"]) -> Entry | None:
        if not message.HasField(name):
            return None
        return entry_from_proto(getattr(message, name), path=message.path)

    return Conflict(message.path, side("base"), side("source"), side("destination"))


def merge_strategy_from_proto(value: int) -> MergeStrategy:
    """ValueError for a value this build does not know."""
    try:
        return MergeStrategy(value)
    except ValueError:
        raise ValueError(f"unknown merge strategy {value}") from None


def summary_to_proto(
    summary: DiffSummary, out: types_pb2.DiffSummary | None = None
) -> types_pb2.DiffSummary:
    message = out if out is not None else types_pb2.DiffSummary()
    message.added = summary.added
    message.removed = summary.removed
    message.changed = summary.changed
    return message


def summary_from_proto(message: types_pb2.DiffSummary) -> DiffSummary:
    return DiffSummary(added=message.added, removed=message.removed, changed=message.changed)


def range_info_to_proto(
    info: RangeInfo, out: types_pb2.RangeInfo | None = None
) -> types_pb2.RangeInfo:
    message = out if out is not None else types_pb2.RangeInfo()
    message.id = info.id
    message.min_key = info.min_key
    message.max_key = info.max_key
    message.count = info.count
    message.size_bytes = info.size_bytes
    return message


def range_info_from_proto(message: types_pb2.RangeInfo) -> RangeInfo:
    return RangeInfo(
        message.id, message.min_key, message.max_key, message.count, message.size_bytes
    )


def range_infos_to_proto(infos: Iterable[RangeInfo]) -> list[types_pb2.RangeInfo]:
    return [range_info_to_proto(info) for info in infos]


__all__ = [
    "change_from_proto",
    "change_to_proto",
    "conflict_from_proto",
    "conflict_to_proto",
    "entry_from_proto",
    "entry_to_proto",
    "merge_strategy_from_proto",
    "put_or_delete_from_proto",
    "put_or_delete_to_proto",
    "range_info_from_proto",
    "range_info_to_proto",
    "range_infos_to_proto",
    "summary_from_proto",
    "summary_to_proto",
]
