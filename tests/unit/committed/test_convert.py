"""quarry.convert: domain values <-> quarry.v1 messages."""

from __future__ import annotations

import pytest

from quarry.convert import (
    change_from_proto,
    change_to_proto,
    entry_from_proto,
    entry_to_proto,
    put_or_delete_from_proto,
    put_or_delete_to_proto,
    range_info_from_proto,
    range_info_to_proto,
    summary_from_proto,
    summary_to_proto,
)
from quarry.graveler.model import Change, ChangeType, DiffSummary, Entry, RangeInfo
from quarry.v1 import types_pb2


@pytest.mark.parametrize("mtime_us", [0, 1, 1_700_000_000_123_456, -1_500_000, -1])
def test_entry_round_trip(mtime_us):
    entry = Entry("dir/ü", "s3://b/k", 42, "etag", mtime_us, "text/csv", {"b": "2", "a": "1"})
    message = entry_to_proto(entry)
    assert message.HasField("mtime") == bool(mtime_us)
    if mtime_us:
        assert message.mtime.ToMicroseconds() == mtime_us
    back = entry_from_proto(message)
    assert back == entry and back.identity == entry.identity
    assert entry_from_proto(message, path="other").path == "other"


@pytest.mark.parametrize(
    "seconds, nanos", [(0, -1), (0, 2**31 - 1), (-(2**63), 0), (253402300800, 0)]
)
def test_entry_with_an_invalid_mtime_is_the_callers_mistake(seconds, nanos):
    """Found by tests/integration/test_properties.py: it was INTERNAL (a ValueError)."""
    from quarry.graveler.errors import InvalidEntry

    message = types_pb2.Entry(path="p", physical_address="a", size_bytes=1)
    message.mtime.seconds, message.mtime.nanos = seconds, nanos
    with pytest.raises(InvalidEntry, match="p: invalid mtime"):
        entry_from_proto(message)


def test_change_round_trip():
    entry = Entry("p", "a", 1, "c")
    for change in (
        Change(ChangeType.ADDED, "p", entry),
        Change(ChangeType.CHANGED, "p", entry),
        Change(ChangeType.REMOVED, "p"),
    ):
        message = change_to_proto(change)
        assert message.HasField("entry") == (change.type != ChangeType.REMOVED)
        assert change_from_proto(message) == change
    # An entry without a path takes the change's path.
    message = types_pb2.Change(
        type=types_pb2.CHANGE_TYPE_ADDED, path="q", entry=types_pb2.Entry(physical_address="x")
    )
    assert change_from_proto(message).entry.path == "q"
    with pytest.raises(ValueError):
        change_from_proto(types_pb2.Change(path="p"))  # no type
    with pytest.raises(ValueError):
        change_from_proto(
            types_pb2.Change(
                type=types_pb2.CHANGE_TYPE_ADDED, path="p", entry=types_pb2.Entry(path="other")
            )
        )


def test_put_or_delete():
    entry = Entry("p", "a", 1, "c")
    assert put_or_delete_from_proto(put_or_delete_to_proto("p", entry)) == ("p", entry)
    assert put_or_delete_from_proto(put_or_delete_to_proto("p", None)) == ("p", None)
    with pytest.raises(ValueError):
        put_or_delete_from_proto(types_pb2.Change(type=types_pb2.CHANGE_TYPE_ADDED, path="p"))
    with pytest.raises(ValueError):
        put_or_delete_from_proto(types_pb2.Change(type=types_pb2.CHANGE_TYPE_CONFLICT, path="p"))


def test_summary_and_range_info():
    summary = DiffSummary(1, 2, 3)
    assert summary_from_proto(summary_to_proto(summary)) == summary
    info = RangeInfo("id", "a", "b", 3, 99)
    assert range_info_from_proto(range_info_to_proto(info)) == info
