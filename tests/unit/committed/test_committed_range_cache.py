"""The range cache's accounting (ranges are charged for the Python columns they build, when
they build them) and where ranges are read ahead (remote stores only)."""

from __future__ import annotations

from quarry.blob import CountingBlobStore, LocalBlobStore
from quarry.committed import CommittedManager
from quarry.lru import LRUCache


def test_lru_grow_charges_an_entry_and_evicts_past_the_bound():
    cache = LRUCache(100)
    a, b = object(), object()
    cache.put("a", a, 40)
    cache.put("b", b, 40)
    cache.grow("a", object(), 50)  # another value under the key: not charged
    assert cache.size_bytes == 80
    cache.grow("b", b, 10)
    assert cache.size_bytes == 90 and cache.get("a") is a
    cache.grow("a", a, 30)  # 120 > 100: the oldest ("b", as "a" was just read) goes
    assert cache.get("b") is None and cache.get("a") is a and cache.size_bytes == 70
    cache.grow("missing", a, 1000)
    assert cache.size_bytes == 70


def test_a_cached_range_is_charged_for_the_python_columns_it_builds(
    new_manager, namespace, make_entry
):
    manager = new_manager(target_range_entries=1_000_000)
    result = manager.write_metarange(namespace, [make_entry(f"k/{i:04d}") for i in range(500)])
    loader = manager._loader
    loader.clear_memory_cache()
    (info,) = loader.metarange(namespace, result.metarange_id).ranges
    data = loader.range(namespace, info)
    cache = loader._ranges
    table_only = cache.size_bytes
    assert table_only == data.table.get_total_buffer_size()  # nothing built yet
    data.paths  # noqa: B018 — builds the path list
    with_paths = cache.size_bytes
    assert with_paths - table_only >= 500 * 50
    data.entry(0)  # builds every column
    assert cache.size_bytes - with_paths >= 500 * 200
    assert data.cache_bytes == cache.size_bytes  # the charge is what cache_bytes says now


class RemoteLike(CountingBlobStore):
    """A local store that says it is not local (as an object store would)."""

    @property
    def is_local(self) -> bool:
        return False


def test_ranges_are_read_ahead_from_remote_stores_only(tmp_path, make_entry):
    local_ns, remote_ns = str(tmp_path / "local"), str(tmp_path / "remote")

    def opener(namespace):
        store = LocalBlobStore(namespace)
        return CountingBlobStore(store) if namespace == local_ns else RemoteLike(store)

    manager = CommittedManager(opener, None, target_range_entries=8)
    try:
        loader = manager._loader
        assert not loader.reads_ahead(local_ns) and loader.reads_ahead(remote_ns)
        for namespace in (local_ns, remote_ns):
            entries = [make_entry(f"k/{i:04d}") for i in range(400)]
            metarange = manager.write_metarange(namespace, entries).metarange_id
            loader.clear_memory_cache()
            infos = loader.metarange(namespace, metarange).ranges[:5]
            for info in infos:
                loader.prefetch(namespace, info)
            loaded = [
                loader._ranges.peek((namespace, i.id)) or loader._inflight.get((namespace, i.id))
                for i in infos
            ]
            if namespace == local_ns:
                assert loaded == [None] * 5  # nothing handed to the read pool
            else:
                assert all(x is not None for x in loaded)
    finally:
        manager.close()
