"""Domain values (quarry.graveler.model) ⇄ quarry.v1 protobuf messages.

One place for the mapping, used by every servicer and client-side adapter.
"""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from quarry.graveler.model import Change, ChangeType, DiffSummary, Entry, RangeInfo
from quarry.v1 import types_pb2


def entry_to_proto(entry: Entry) -> types_pb2.Entry:
    seconds, micros = divmod(entry.mtime_us, 1_000_000)
    message = types_pb2.Entry(path=entry.path, physical_address=entry.physical_address,
                              size_bytes=entry.size_bytes, checksum=entry.checksum,
                              content_type=entry.content_type, metadata=dict(entry.metadata))
    if entry.mtime_us:
        message.mtime.CopyFrom(timestamp_pb2.Timestamp(seconds=seconds, nanos=micros * 1000))
    return message


def entry_from_proto(message: types_pb2.Entry) -> Entry:
    mtime_us = message.mtime.seconds * 1_000_000 + message.mtime.nanos // 1000
    return Entry(message.path, message.physical_address, message.size_bytes, message.checksum,
                 mtime_us, message.content_type, message.metadata.items())


def change_to_proto(change: Change) -> types_pb2.Change:
    message = types_pb2.Change(type=int(change.type), path=change.path)
    if change.entry is not None:
        message.entry.CopyFrom(entry_to_proto(change.entry))
    return message


def change_from_proto(message: types_pb2.Change) -> Change:
    entry = entry_from_proto(message.entry) if message.HasField("entry") else None
    return Change(ChangeType(message.type), message.path, entry)


def summary_to_proto(summary: DiffSummary) -> types_pb2.DiffSummary:
    return types_pb2.DiffSummary(added=summary.added, removed=summary.removed,
                                 changed=summary.changed)


def summary_from_proto(message: types_pb2.DiffSummary) -> DiffSummary:
    return DiffSummary(message.added, message.removed, message.changed)


def range_info_to_proto(info: RangeInfo) -> types_pb2.RangeInfo:
    return types_pb2.RangeInfo(id=info.id, min_key=info.min_key, max_key=info.max_key,
                               count=info.count, size_bytes=info.size_bytes)


def range_info_from_proto(message: types_pb2.RangeInfo) -> RangeInfo:
    return RangeInfo(message.id, message.min_key, message.max_key, message.count,
                     message.size_bytes)
