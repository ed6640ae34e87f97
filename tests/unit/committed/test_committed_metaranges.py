"""The two-level metarange (quarry.committed.metaranges): pages cut from the ranges alone
(the same ranges give the same pages and id whatever the base they were planned from), files
that read back to the ranges, and a localized change that writes a page or two and a small
root instead of a file naming every range."""

from __future__ import annotations

import hashlib
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quarry.blob import CountingBlobStore, LocalBlobStore
from quarry.committed import CommittedManager, metaranges
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    FORMAT_TAG,
    METARANGE_FORMAT,
    METARANGE_INDEX_FORMAT,
    metarange_id_of,
    metarange_key,
)
from quarry.committed.metaranges import (
    plan_metarange,
    read_metarange,
    read_metarange_tree,
    root_id_of,
    write_metarange,
)
from quarry.committed.rangedata import MetaRange
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
        width = rng.choice([0, 1, 2, 5, 40])
        keys = sorted({rng.randrange(10**6) for _ in range(rng.choice([0, 1, 3, 30]))})
        lo = out[at - 1].max_key if at else ""
        hi = out[at + width].min_key if at + width < len(out) else "\uffff"
        new = [_info(rng, k, f"{step}") for k in keys]
        new = [r for r in new if lo < r.min_key and r.max_key < hi]
        out[at : at + width] = new
    if out and rng.random() < 0.3:
        i = rng.randrange(len(out))
        r = out[i]
        out[i] = RangeInfo(r.id, r.min_key, r.max_key, r.count, r.size_bytes)  # equal, not same
    if rng.random() < 0.03:
        out = []
    return out


@pytest.fixture
def small_pages(monkeypatch):
    """Pages of ~4 ranges (at most 8): many pages from a few hundred ranges."""
    monkeypatch.setattr(metaranges, "PAGE_TARGET_RANGES", 4)
    monkeypatch.setattr(metaranges, "PAGE_MAX_RANGES", 8)


def _as_metarange(ranges: list[RangeInfo], plan: metaranges.MetaRangePlan) -> MetaRange:
    return MetaRange(plan.id, ranges, [], None, plan.pages, plan.page_ends)


@pytest.mark.parametrize("seed", range(40))
def test_a_plan_derived_from_a_base_is_the_plan_from_scratch(seed, small_pages):
    """A chain of edits, each planned from the previous metarange (as commits on a branch
    are): id, pages and page ends equal those planned from the ranges alone; every page
    ends at a page end or at the cap; a one-page list is flat under its flat id."""
    rng = random.Random(seed)
    ranges = sorted(
        (_info(rng, k, "0") for k in rng.sample(range(10**6), rng.randrange(0, 400))),
        key=lambda r: r.min_key,
    )
    plan = plan_metarange(ranges)
    for step in range(1, 15):
        edited = _edit(rng, ranges, step)
        derived = plan_metarange(edited, _as_metarange(ranges, plan))
        scratch = plan_metarange(edited)
        assert (derived.id, derived.pages, derived.page_ends) == (
            scratch.id,
            scratch.pages,
            scratch.page_ends,
        )
        if not scratch.pages:
            assert scratch.id == (metarange_id_of(edited) if edited else EMPTY_METARANGE_ID)
        else:
            assert scratch.id == root_id_of(scratch.pages)
            starts = (0, *scratch.page_ends[:-1])
            for start, end, page in zip(starts, scratch.page_ends, scratch.pages, strict=True):
                assert page.id == metarange_id_of(edited[start:end])
                assert (
                    end - start == 8
                    or metaranges.is_page_end(edited[end - 1])
                    or end == len(edited)
                )
            assert scratch.page_ends[-1] == len(edited)
        ranges, plan = edited, derived


def _common(left: list[RangeInfo], right: list[RangeInfo]) -> tuple[int, int]:
    """(head, tail) one range at a time: the longest common prefix, then the longest common
    suffix of what is left."""
    head = 0
    while head < min(len(left), len(right)) and left[head] == right[head]:
        head += 1
    tail = 0
    limit = min(len(left), len(right)) - head
    while tail < limit and left[-1 - tail] == right[-1 - tail]:
        tail += 1
    return head, tail


@pytest.mark.parametrize("seed", range(40))
def test_shared_ends_by_page_ids_are_the_common_prefix_and_suffix(seed, small_pages):
    """What merge's gap finder skips unread (metaranges.shared_ends: whole pages by id,
    then range by range) is exactly the common prefix and suffix a range-by-range walk
    finds, between edits of one list and between two edits of it (a merge's source and
    destination), flat or paged."""
    rng = random.Random(seed)
    ranges = sorted(
        (_info(rng, k, "0") for k in rng.sample(range(10**6), rng.randrange(0, 400))),
        key=lambda r: r.min_key,
    )
    base = _as_metarange(ranges, plan_metarange(ranges))
    for step in range(1, 8):
        one = _edit(rng, ranges, step)
        other = _edit(rng, one, 100 + step) if rng.random() < 0.5 else _edit(rng, ranges, 100)
        left = _as_metarange(one, plan_metarange(one))
        right = _as_metarange(other, plan_metarange(other))
        for a, b in ((base, left), (left, base), (left, right), (right, left), (left, left)):
            assert metaranges.shared_ends(a, b) == _common(a.ranges, b.ranges)
            # The planner's suffix over plain lists, too.
            head = metaranges.common_prefix_length(a.ranges, b.ranges)
            limit = min(len(a.ranges), len(b.ranges)) - head
            assert (
                metaranges.common_suffix_length(a.ranges, b.ranges, limit)
                == (_common(a.ranges, b.ranges)[1])
            )


def test_small_metaranges_stay_flat_and_large_ones_get_a_root(tmp_path, small_pages):
    rng = random.Random(1)
    store = LocalBlobStore(str(tmp_path))
    few = sorted((_info(rng, k, "f") for k in range(5)), key=lambda r: r.min_key)
    few = [r for r in few if not metaranges.is_page_end(r)]  # one page
    flat = write_metarange(store, few)
    assert flat == metarange_id_of(few)
    tag = pq.ParquetFile(pa.BufferReader(store.get(metarange_key(flat)))).metadata.metadata
    assert tag[FORMAT_TAG] == METARANGE_FORMAT
    assert read_metarange_tree(store, flat) == ([], few)
    many = sorted((_info(rng, k, "m") for k in range(300)), key=lambda r: r.min_key)
    root = write_metarange(store, many)
    tag = pq.ParquetFile(pa.BufferReader(store.get(metarange_key(root)))).metadata.metadata
    assert tag[FORMAT_TAG] == METARANGE_INDEX_FORMAT
    pages, ranges = read_metarange_tree(store, root)
    assert ranges == many and len(pages) > 10
    assert read_metarange(store, root) == many


class _RemoteDirectory(LocalBlobStore):
    """A directory the loader reads as it reads an object store (no local paths)."""

    @property
    def is_local(self) -> bool:
        return False

    def local_path(self, key: str) -> str | None:
        return None


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_commits_and_merges_write_the_metarange_of_their_ranges(tmp_path, make_entry, remote):
    """Through the manager: every metarange a commit or merge writes from its base is, in
    the store, the metarange write_metarange writes for its ranges from scratch (same id,
    same files), zstd-compressed for a remote store, uncompressed into a local directory;
    a cold manager reads the same ranges back."""
    namespace = str(tmp_path / "ns")
    opener = _RemoteDirectory if remote else LocalBlobStore
    manager = CommittedManager(opener, None, target_range_entries=4)
    try:
        paths = [f"d/{i:05d}" for i in range(3000)]
        base = manager.write_metarange(namespace, [make_entry(p) for p in paths]).metarange_id
        store = manager.store(namespace)
        rng = random.Random(3)
        heads = [base]
        for version in range(1, 8):
            start = rng.randrange(len(paths) - 40)
            changes = [(p, make_entry(p, version)) for p in paths[start : start + 30 : 3]]
            heads.append(manager.apply_changes(namespace, heads[-1], changes).metarange_id)
        merged = manager.merge_metaranges(namespace, heads[2], heads[-1], heads[3])
        cold = CommittedManager(opener, None, target_range_entries=4)
        scratch = LocalBlobStore(str(tmp_path / "scratch"))
        for metarange_id in [*heads, merged.metarange_id]:
            ranges = manager.get_metarange(namespace, metarange_id)
            assert cold.get_metarange(namespace, metarange_id) == ranges
            assert write_metarange(scratch, ranges) == metarange_id
            pages, read = read_metarange_tree(store, metarange_id)
            assert read == ranges and len(pages) > 1
            data = store.get(metarange_key(metarange_id))
            codec = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0).column(0)
            assert codec.compression == ("ZSTD" if remote else "UNCOMPRESSED")
        cold.close()
    finally:
        manager.close()


def test_a_one_range_change_writes_a_page_or_two_and_a_root(tmp_path, make_entry):
    """The point of the index: on a metarange of ~2,500 ranges (~20 pages), one changed
    entry writes its range, at most two index pages and the root, and the metarange files
    written hold a few hundred rows, not one per range of the repository. A cold reader
    that holds the base reads only the new root and the pages that changed."""
    namespace = str(tmp_path / "ns")
    stores: dict[str, CountingBlobStore] = {}

    def opener(ns: str) -> CountingBlobStore:
        return stores.setdefault(ns, CountingBlobStore(LocalBlobStore(ns)))

    manager = CommittedManager(opener, None, target_range_entries=8)
    try:
        paths = [f"p/{i:06d}" for i in range(20_000)]
        base = manager.write_metarange(namespace, [make_entry(p) for p in paths]).metarange_id
        base_ranges = manager.get_metarange(namespace, base)
        store = stores[namespace]
        base_pages, _ = read_metarange_tree(store, base)
        assert len(base_ranges) > 2000 and len(base_pages) >= 10
        store.reset()
        manager.reset_stats()
        path = paths[len(paths) // 2]
        result = manager.apply_changes(namespace, base, [(path, make_entry(path, 1))])
        stats = manager.stats
        assert stats.ranges_written <= 2
        assert stats.metaranges_written == 1 and stats.metarange_pages_written <= 2
        written = [k for k in store.keys_written if k.startswith("_quarry/metaranges/")]
        assert len(written) == 1 + stats.metarange_pages_written <= 3
        rows = sum(pq.ParquetFile(pa.BufferReader(store.get(k))).metadata.num_rows for k in written)
        assert rows <= len(base_pages) + 2 * metaranges.PAGE_MAX_RANGES < len(base_ranges) / 2
        # A reader holding the base reads the new root and its new pages only.
        cold = CommittedManager(opener, None, target_range_entries=8)
        cold.get_metarange(namespace, base)
        cold.reset_stats()
        assert cold.get_entry(namespace, result.metarange_id, path) == make_entry(path, 1)
        assert cold.stats.metaranges_read == len(written)
        cold.close()
    finally:
        manager.close()
