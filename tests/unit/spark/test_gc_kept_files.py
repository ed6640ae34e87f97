"""GC's reachability over two-level metaranges (quarry.spark.gc._kept_files): every index
page of a kept metarange is kept with it, and a missing page stops GC."""

from __future__ import annotations

import hashlib
import os

import pytest

from quarry.blob import LocalBlobStore
from quarry.blob.layout import classify
from quarry.committed import metaranges
from quarry.committed.format import metarange_key, range_key
from quarry.graveler.model import RangeInfo
from quarry.spark.gc import GarbageCollectionUnsafe, _kept_files


@pytest.fixture
def two_level(tmp_path, monkeypatch):
    """A namespace holding a metarange of 300 ranges in pages of ~4 (the range files are
    placeholders: GC only checks that they are listed)."""
    monkeypatch.setattr(metaranges, "PAGE_TARGET_RANGES", 4)
    monkeypatch.setattr(metaranges, "PAGE_MAX_RANGES", 8)
    store = LocalBlobStore(str(tmp_path / "ns"))
    ranges = [
        RangeInfo(hashlib.sha256(b"%d" % i).hexdigest(), f"k/{i:04d}/a", f"k/{i:04d}/z", 1, 10)
        for i in range(300)
    ]
    for r in ranges:
        store.put(range_key(r.id), b"range")
    root = metaranges.write_metarange(store, ranges)
    return store, root, ranges


def test_the_pages_of_a_kept_metarange_are_kept(two_level):
    store, root, ranges = two_level
    listing = {o.key for o in store.list("")}
    kept, range_ids = _kept_files(store, {root}, listing)
    assert range_ids == {r.id for r in ranges}
    pages, _ = metaranges.read_metarange_tree(store, root)
    assert len(pages) > 10
    # Every metarange file of the namespace is the root or one of its pages: GC (which
    # collects a metarange file not in `kept`) must find none to collect.
    files = {classify(k).id for k in listing if classify(k).kind == "metarange"}
    assert files == {root, *pages} and files <= kept


def test_a_missing_page_stops_gc(two_level):
    store, root, _ranges = two_level
    pages, _ = metaranges.read_metarange_tree(store, root)
    os.remove(store.local_path(metarange_key(pages[3])))
    with pytest.raises(GarbageCollectionUnsafe):
        _kept_files(store, {root}, {o.key for o in store.list("")})
