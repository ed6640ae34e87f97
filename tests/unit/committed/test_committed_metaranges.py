"""Metarange encodings derived from a neighbour's (quarry.committed.metaranges): the same
rows, file and id as the metarange built row by row, whatever the edit; and the memory they
take counted within the metarange cache's bound."""

from __future__ import annotations

import hashlib
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quarry.blob import LocalBlobStore
from quarry.committed import CommittedManager, metaranges
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    METARANGE_ID_HEADER,
    decode_metarange,
    metarange_id_of,
    metarange_key,
    range_frame,
)
from quarry.committed.loader import LoaderOptions, RangeLoader
from quarry.committed.metaranges import (
    derive_metarange_encoding,
    encode_metarange,
    encode_metarange_table,
    metarange_encoding,
    metarange_table,
)
from quarry.committed.rangedata import MetaRange
from quarry.committed.stats import StatsCounter
from quarry.committed.writer import Chunking, RangeWriter
from quarry.graveler.model import RangeInfo


def _info(rng: random.Random, key: int, tag: str) -> RangeInfo:
    return RangeInfo(
        hashlib.sha256(f"{key}/{tag}".encode()).hexdigest(),
        f"k/{key:06d}/a",
        f"k/{key:06d}/{'z' * rng.randrange(1, 20)}é",
        rng.randrange(1, 5000),
        rng.randrange(1, 10**12),
    )


def _edit(rng: random.Random, ranges: list[RangeInfo], step: int) -> list[RangeInfo]:
    """`ranges` with a few windows replaced, dropped or inserted (new objects), anywhere:
    the start, the end, all of it, or nothing; some kept rows as equal copies."""
    out = list(ranges)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        at = rng.randrange(len(out) + 1)
        width = rng.choice([0, 1, 2, 5])
        keys = sorted({rng.randrange(10**6) for _ in range(rng.choice([0, 1, 3]))})
        lo = out[at - 1].max_key if at else ""
        hi = out[at + width].min_key if at + width < len(out) else "\uffff"
        new = [_info(rng, k, f"{step}") for k in keys]
        new = [r for r in new if lo < r.min_key and r.max_key < hi]
        out[at : at + width] = new
    if out and rng.random() < 0.3:
        i = rng.randrange(len(out))
        r = out[i]
        out[i] = RangeInfo(r.id, r.min_key, r.max_key, r.count, r.size_bytes)  # equal, not same
    if rng.random() < 0.05:
        out = []
    return out


def _assert_same_as_row_by_row(derived, ranges: list[RangeInfo]) -> None:
    scratch = metarange_encoding(ranges)
    assert derived.id == scratch.id == metarange_id_of(ranges)
    # Every kept hash state is the hash of the frames before its range.
    every = metaranges.CHECKPOINT_RANGES
    assert len(derived.checkpoints) == len(ranges) // every + 1
    for j, state in enumerate(derived.checkpoints):
        before = b"".join(range_frame(r) for r in ranges[: j * every])
        assert state.hexdigest() == hashlib.sha256(METARANGE_ID_HEADER + before).hexdigest()
    assert derived.frames == scratch.frames
    assert derived.ends.equals(scratch.ends)
    assert derived.table.equals(metarange_table(ranges))
    data = encode_metarange_table(derived.table, derived.id)
    # The file the row-by-row path writes, to the byte, and its rows read back.
    assert data == encode_metarange(ranges, derived.id)
    assert decode_metarange(data) == ranges


@pytest.mark.parametrize("every", [1024, 7, 1])
@pytest.mark.parametrize("seed", range(30))
def test_a_derived_encoding_is_the_row_by_row_one(seed, every, monkeypatch):
    """A chain of edits, each derived from the previous encoding (as commits on a branch
    do): table, id frames, id and file bytes equal those built row by row, with hash
    checkpoints every `every` ranges."""
    monkeypatch.setattr(metaranges, "CHECKPOINT_RANGES", every)
    rng = random.Random(seed)
    ranges = sorted(
        (_info(rng, k, "0") for k in rng.sample(range(10**6), rng.randrange(0, 300))),
        key=lambda r: r.min_key,
    )
    encoding = metarange_encoding(ranges)
    _assert_same_as_row_by_row(encoding, ranges)
    for step in range(1, 12):
        edited = _edit(rng, ranges, step)
        encoding = derive_metarange_encoding(ranges, encoding, edited)
        _assert_same_as_row_by_row(encoding, edited)
        ranges = edited


def test_the_empty_metarange_encoding_has_the_fixed_id():
    assert metarange_encoding([]).id == EMPTY_METARANGE_ID
    one = [RangeInfo("a" * 64, "a", "b", 1, 10)]
    assert derive_metarange_encoding(one, metarange_encoding(one), []).id == EMPTY_METARANGE_ID


class _RemoteDirectory(LocalBlobStore):
    """A directory the loader reads as it reads an object store (no local paths)."""

    @property
    def is_local(self) -> bool:
        return False

    def local_path(self, key: str) -> str | None:
        return None


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_commits_and_merges_write_the_row_by_row_metarange(tmp_path, make_entry, remote):
    """Through the manager: every metarange written from a base's encoding is, in the
    store, the file the row-by-row path writes for its ranges, under that path's id:
    zstd-compressed for a remote store, uncompressed into a local directory."""
    namespace = str(tmp_path / "ns")
    opener = _RemoteDirectory if remote else LocalBlobStore
    manager = CommittedManager(opener, None, target_range_entries=8)
    try:
        paths = [f"d/{i:05d}" for i in range(2000)]
        base = manager.write_metarange(namespace, [make_entry(p) for p in paths]).metarange_id
        store = manager.store(namespace)
        rng = random.Random(3)
        heads = [base]
        for version in range(1, 8):
            start = rng.randrange(len(paths) - 40)
            changes = [(p, make_entry(p, version)) for p in paths[start : start + 30 : 3]]
            heads.append(manager.apply_changes(namespace, heads[-1], changes).metarange_id)
        merged = manager.merge_metaranges(namespace, heads[2], heads[-1], heads[3])
        for metarange_id in [*heads, merged.metarange_id]:
            ranges = manager.get_metarange(namespace, metarange_id)
            assert metarange_id == metarange_id_of(ranges)
            data = store.get(metarange_key(metarange_id))
            expected = encode_metarange_table(metarange_table(ranges), metarange_id, remote)
            assert data == expected
            assert decode_metarange(data) == ranges
            codec = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0).column(0)
            assert codec.compression == ("ZSTD" if remote else "UNCOMPRESSED")
    finally:
        manager.close()


def test_encodings_are_counted_within_the_metarange_cache_bound(tmp_path, make_entry):
    """The encodings kept for the next derivation take their bytes from the metarange
    cache's budget: however many metaranges are written, the cache holds at most its
    bound, and what it holds counts every encoding's table and frames."""
    bound = 400_000  # a few metaranges of ~500 ranges with their encodings
    loader = RangeLoader(LocalBlobStore, LoaderOptions(metarange_cache_bytes=bound), StatsCounter())
    writer = RangeWriter(loader, Chunking(target_entries=4))
    namespace = str(tmp_path / "ns")
    try:
        head = writer.write_entries(
            namespace, [make_entry(f"p/{i:05d}") for i in range(2000)]
        ).metarange_id
        base = loader.metarange(namespace, head)
        encoding = loader.metarange_encoding(namespace, base)
        assert encoding.nbytes >= encoding.table.nbytes + len(encoding.frames)
        for version in range(1, 30):
            ranges = list(base.ranges)
            old = ranges[version]
            ranges[version] = RangeInfo(
                "f" * 64, old.min_key, old.max_key, old.count, old.size_bytes + version
            )
            writer.write_metarange_file(namespace, ranges, base)
            assert 0 < loader.metarange_cache_bytes <= bound
            base = loader.metarange(namespace, metarange_id_of(ranges))
        # A metarange just written is kept with its encoding, both counted in full.
        loader.clear_memory_cache()
        base_encoding = loader.metarange_encoding(namespace, base)  # built and kept
        assert loader.metarange_cache_bytes == base_encoding.nbytes
        ranges = list(base.ranges[1:])
        encoding = writer.metarange_encoding(namespace, ranges, base)
        writer.write_metarange_file(namespace, ranges, encoding=encoding)
        written = MetaRange(encoding.id, ranges)
        assert loader.metarange_cache_bytes == (
            base_encoding.nbytes + written.cache_bytes + encoding.nbytes
        )
        assert loader.metarange_encoding(namespace, written) is encoding
    finally:
        writer.close()
        loader.close()


def test_ranges_under_no_id_never_share_a_kept_encoding(tmp_path):
    """Lists of ranges without a metarange id (a merge's splice) are encoded as they are:
    one such list's encoding is never served for another."""
    loader = RangeLoader(LocalBlobStore, LoaderOptions(), StatsCounter())
    namespace = str(tmp_path / "ns")
    one = [RangeInfo("a" * 64, "a", "b", 1, 10)]
    two = [RangeInfo("b" * 64, "c", "d", 2, 20)]
    try:
        assert loader.metarange_encoding(namespace, MetaRange("", one)).id == metarange_id_of(one)
        assert loader.metarange_encoding(namespace, MetaRange("", two)).id == metarange_id_of(two)
    finally:
        loader.close()
