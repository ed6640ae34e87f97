"""Storage format versions of range and metarange files: another version is refused on
read (FAILED_PRECONDITION / FORMAT_VERSION_MISMATCH naming export/import), and only the
legacy rewriter used by `quarry store import` reads format 1, rewriting it once per distinct file."""

from __future__ import annotations

import hashlib

import grpc
import pyarrow as pa
import pytest

from quarry.blob import CountingBlobStore, LocalBlobStore
from quarry.committed import CommittedManager
from quarry.committed.errors import MetaRangeNotFound, RangeCorrupt
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    FORMAT_TAG,
    IDENTITY_TYPE,
    METARANGE_FORMAT,
    RANGE_FORMAT,
    RowBuffer,
    decode_metarange,
    decode_range,
    decode_range_keys,
    encode_range,
    metarange_id_of,
    metarange_key,
    range_id_of,
    range_key,
)
from quarry.committed.legacy import CommittedRewriter
from quarry.committed.metaranges import encode_metarange
from quarry.graveler.model import Entry, RangeInfo
from quarry.runtime.format_version import FormatVersionMismatch
from support.format_v1 import v1_entry_identity

V1_RANGE_HEADER = b"quarry/range/v1\x00"
V1_METARANGE_HEADER = b"quarry/metarange/v1\x00"
V1_EMPTY_METARANGE_ID = hashlib.sha256(V1_METARANGE_HEADER).hexdigest()


def entries(prefix: str, n: int) -> list[Entry]:
    return [
        Entry(
            f"{prefix}/{i:03d}",
            f"s3://b/{prefix}/{i}",
            10 + i,
            "" if i % 2 else f"c{i}",
            1_700_000_000_000_000 + i,
            "text/csv",
            {"k": str(i)} if i % 3 else {},
        )
        for i in range(n)
    ]


def v1_range(store, batch: list[Entry]) -> RangeInfo:
    """A range file exactly as format 1 wrote it: format-1 identities, tag and id header."""
    rows = RowBuffer()
    for e in batch:
        rows.append(e, len(e.path.encode()))
    table = rows.to_table()
    identities = pa.array(
        [
            v1_entry_identity(
                e.physical_address, e.size_bytes, e.checksum, e.content_type, e.metadata
            )
            for e in batch
        ],
        IDENTITY_TYPE,
    )
    table = table.set_column(table.schema.get_field_index("identity"), "identity", identities)
    range_id = range_id_of(table, header=V1_RANGE_HEADER)
    data = encode_range(table, range_id)
    store.put(range_key(range_id), _retag(data, b"range/v1"))
    return RangeInfo(range_id, batch[0].path, batch[-1].path, len(batch), 100 * len(batch))


def v1_metarange(store, ranges: list[RangeInfo]) -> str:
    metarange_id = metarange_id_of(ranges, header=V1_METARANGE_HEADER)
    store.put(
        metarange_key(metarange_id), _retag(encode_metarange(ranges, metarange_id), b"metarange/v1")
    )
    return metarange_id


def _retag(data: bytes, tag: bytes | None) -> bytes:
    """The file rewritten with another format tag (None: without one)."""
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(data))
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != FORMAT_TAG}
    table = table.replace_schema_metadata({**metadata, FORMAT_TAG: tag} if tag else metadata)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def store(tmp_path):
    return CountingBlobStore(LocalBlobStore(str(tmp_path / "ns")))


def test_a_file_of_another_format_version_is_refused(store):
    info = v1_range(store, entries("a", 5))
    metarange_id = v1_metarange(store, [info])
    for decode, data in (
        (decode_range, store.get(range_key(info.id))),
        (decode_range_keys, store.get(range_key(info.id))),
        (decode_metarange, store.get(metarange_key(metarange_id))),
    ):
        with pytest.raises(FormatVersionMismatch) as caught:
            decode(data)
        assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert caught.value.reason == "FORMAT_VERSION_MISMATCH"
        assert "storage format version 1" in caught.value.message
        assert (
            "quarry store export" in caught.value.message
            and "quarry store import" in caught.value.message
        )
    # The manager (every service's reader) refuses it too, from a local path.
    manager = CommittedManager(lambda ns: store, None)
    with pytest.raises(FormatVersionMismatch):
        manager.get_metarange("ns", metarange_id)


def test_a_file_without_the_tag_is_corrupt_not_guessed(store):
    info = v1_range(store, entries("a", 3))
    untagged = _retag(store.get(range_key(info.id)), None)
    with pytest.raises(RangeCorrupt):
        decode_range(untagged)
    with pytest.raises(RangeCorrupt):
        decode_range(_retag(untagged, b"something/else"))


def test_the_rewriter_recomputes_identities_once_per_range(store, tmp_path):
    shared = v1_range(store, entries("a", 6))
    first = v1_range(store, entries("b", 4))
    second = v1_range(store, entries("c", 5))
    old_one = v1_metarange(store, [shared, first])
    old_two = v1_metarange(store, [shared, second])
    rewriter = CommittedRewriter(store, "ns")
    store.reset()
    new_one = rewriter.metarange(old_one)
    new_two = rewriter.metarange(old_two)
    assert rewriter.metarange(old_one) == new_one  # memoized: no more reads
    # Three distinct ranges, each read and written once; two metaranges.
    assert (rewriter.stats.ranges_rewritten, rewriter.stats.metaranges_rewritten) == (3, 2)
    assert store.counts["get"] == 2 + 3
    manager = CommittedManager(lambda ns: LocalBlobStore(str(tmp_path / "ns")), None)
    for new_id, old_ranges, expected in (
        (new_one, (shared, first), entries("a", 6) + entries("b", 4)),
        (new_two, (shared, second), entries("a", 6) + entries("c", 5)),
    ):
        new_ranges = manager.get_metarange("ns", new_id)
        # Same bounds, counts and sizes; new range ids.
        assert [(r.min_key, r.max_key, r.count, r.size_bytes) for r in new_ranges] == [
            (r.min_key, r.max_key, r.count, r.size_bytes) for r in old_ranges
        ]
        assert not {r.id for r in new_ranges} & {r.id for r in old_ranges}
        read = list(manager.iterate("ns", new_id))
        assert read == expected  # every field
        assert [e.identity for e in read] == [e.identity for e in expected]
    assert new_one not in (old_one, old_two)
    # A metarange of this build's format is kept as it is; the empty ones map to empty.
    assert CommittedRewriter(store, "ns").metarange(new_one) == new_one
    assert rewriter.metarange(V1_EMPTY_METARANGE_ID) == EMPTY_METARANGE_ID
    assert rewriter.metarange("") == ""


def test_the_rewriter_never_overwrites_and_refuses_unknown_files(store):
    info = v1_range(store, entries("a", 3))
    old = v1_metarange(store, [info])
    old_bytes = {key: store.get(key) for key in (range_key(info.id), metarange_key(old))}
    CommittedRewriter(store, "ns").metarange(old)
    assert {key: store.get(key) for key in old_bytes} == old_bytes
    with pytest.raises(MetaRangeNotFound):
        CommittedRewriter(store, "ns").metarange("f" * 64)
    future = metarange_id_of([info], header=b"quarry/metarange/v9\x00")
    store.put(metarange_key(future), _retag(encode_metarange([info], future), b"metarange/v9"))
    with pytest.raises(FormatVersionMismatch):
        CommittedRewriter(store, "ns").metarange(future)
    assert RANGE_FORMAT == b"range/v3" and METARANGE_FORMAT == b"metarange/v3"


def v2_range(store, batch: list[Entry]) -> RangeInfo:
    """A range file as format 2 wrote it: this build's identities, format 2's tag and id."""
    rows = RowBuffer()
    for e in batch:
        rows.append(e, len(e.path.encode()))
    table = rows.to_table()
    range_id = range_id_of(table, header=b"quarry/range/v2\x00")
    store.put(range_key(range_id), _retag(encode_range(table, range_id), b"range/v2"))
    return RangeInfo(range_id, batch[0].path, batch[-1].path, len(batch), 100 * len(batch))


def test_a_flat_format_2_metarange_is_rebuilt_with_index_pages(store, tmp_path, monkeypatch):
    """Format 2 → 3: a flat metarange of many ranges becomes an index root over pages
    (metaranges.py), its ranges keep their rows under new ids; a cold manager reads every
    entry back, and the old files are left as they were."""
    from quarry.committed import metaranges

    monkeypatch.setattr(metaranges, "PAGE_TARGET_RANGES", 4)
    monkeypatch.setattr(metaranges, "PAGE_MAX_RANGES", 8)
    batches = [entries(f"p{i:03d}", 3) for i in range(60)]
    old_ranges = [v2_range(store, batch) for batch in batches]
    old = metarange_id_of(old_ranges, header=b"quarry/metarange/v2\x00")
    store.put(metarange_key(old), _retag(encode_metarange(old_ranges, old), b"metarange/v2"))
    old_bytes = {key: store.get(key) for key in store.keys_written}
    rewriter = CommittedRewriter(store, "ns")
    new = rewriter.metarange(old)
    assert new != old and rewriter.stats.ranges_rewritten == 60
    pages, new_ranges = metaranges.read_metarange_tree(store, new)
    assert len(pages) > 5
    assert [(r.min_key, r.max_key, r.count) for r in new_ranges] == [
        (r.min_key, r.max_key, r.count) for r in old_ranges
    ]
    assert {key: store.get(key) for key in old_bytes} == old_bytes
    manager = CommittedManager(lambda ns: LocalBlobStore(str(tmp_path / "ns")), None)
    try:
        read = list(manager.iterate("ns", new))
        expected = [e for batch in batches for e in batch]
        assert read == expected
        assert [e.identity for e in read] == [e.identity for e in expected]
    finally:
        manager.close()
