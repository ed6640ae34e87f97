"""The range cache's accounting (ranges are charged for the Python columns they build, when
they build them, and for Arrow buffers once however many cached ranges hold them) and where
ranges are read ahead (remote stores only)."""

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


def test_lru_charges_a_shared_block_once_while_any_holder_is_cached():
    cache = LRUCache(1000)
    base, rewritten, other = object(), object(), object()
    cache.put("base", base, 10, {1: 300, 2: 200})
    cache.put("rewritten", rewritten, 20, {1: 300, 2: 200, 3: 5})  # slices of base + 1 row
    assert cache.size_bytes == 10 + 20 + 500 + 5
    cache.get("rewritten")  # "base" is now the oldest
    cache.put("other", other, 470)  # 1005 > 1000: "base" goes, its blocks stay held
    assert cache.peek("base") is None and cache.peek("rewritten") is rewritten
    assert cache.size_bytes == 20 + 505 + 470  # never less than what is still held
    cache.put("rewritten", rewritten, 20, {3: 5})  # re-put under the key: old blocks released
    assert cache.size_bytes == 20 + 5 + 470
    cache.put("huge", object(), 1, {9: 1000})  # could never fit: not cached, nothing evicted
    assert cache.peek("huge") is None and len(cache) == 2
    cache.clear()
    assert cache.size_bytes == 0 and len(cache) == 0
    cache.put("base", base, 0, {3: 5})  # a block held before the clear is charged again
    assert cache.size_bytes == 5


def one_cold_range(manager, namespace, make_entry, rows):
    """A metarange of one range of `rows` entries, written and then read back from its file
    into an empty cache: (its id, the range)."""
    written = manager.write_metarange(namespace, [make_entry(f"k/{i:04d}") for i in range(rows)])
    loader = manager._loader
    loader.clear_memory_cache()
    (info,) = loader.metarange(namespace, written.metarange_id).ranges
    return written.metarange_id, loader.range(namespace, info)


def test_lru_charges_a_block_at_the_largest_size_it_was_given_with():
    """A buffer and a prefix of it share an address: released in any order, the charge
    never drops below what is still held, and returns to zero."""
    for order in (("a", "b"), ("b", "a")):
        cache = LRUCache(1000)
        cache.put("a", object(), 0, {7: 100})  # the prefix
        cache.put("b", object(), 0, {7: 300})  # the whole buffer
        assert cache.size_bytes == 300
        cache.put(order[0], object(), 0)  # released: the other still holds the block
        assert cache.size_bytes == 300
        cache.put(order[1], object(), 0)
        assert cache.size_bytes == 0


def test_a_rewritten_range_is_charged_its_new_rows_not_its_base_again(
    new_manager, namespace, make_entry
):
    manager = new_manager(target_range_entries=1_000_000)
    base_id, base_data = one_cold_range(manager, namespace, make_entry, 2000)
    base_info = base_data.info
    loader = manager._loader
    cache = loader._ranges
    base_charge = cache.size_bytes
    assert base_charge == base_data.table.get_total_buffer_size() > 100_000
    result = manager.apply_changes(namespace, base_id, [("k/1000", make_entry("k/1000", 1))])
    (info,) = loader.metarange(namespace, result.metarange_id).ranges
    rewritten = loader._ranges.peek((namespace, info.id))
    assert rewritten is not None and rewritten.table.num_rows == 2000
    # The rewritten range holds slices of the base's buffers and one new row (and the apply
    # built the base's identity column).
    grown = base_data.python_bytes() + rewritten.python_bytes()
    assert 0 < cache.size_bytes - base_charge - grown < 5_000
    # Evicting the base frees nothing the rewritten range still holds: the charge never
    # falls below the memory the cached ranges keep alive.
    cache.put((namespace, base_info.id), object(), 0)  # the base's entry replaced: released
    assert cache.peek((namespace, info.id)) is rewritten
    assert cache.size_bytes >= rewritten.table.get_total_buffer_size() > 100_000


def test_a_cached_range_is_charged_for_the_python_columns_it_builds(
    new_manager, namespace, make_entry
):
    manager = new_manager(target_range_entries=1_000_000)
    _, data = one_cold_range(manager, namespace, make_entry, 500)
    cache = manager._loader._ranges
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


def test_the_caches_charged_bytes_are_gauges(tmp_path, monkeypatch):
    """quarry_range_cache_bytes / quarry_metarange_cache_bytes: what an operator compares
    with the process's resident memory (docs/observability.md)."""
    import weakref

    from prometheus_client import REGISTRY

    from quarry.committed.cache_metrics import CACHE_BYTES
    from quarry.graveler.model import Entry

    # The gauges sum every live loader of the process; other tests' loaders (collected
    # between two reads, or still charging) must not move this test's sum.
    monkeypatch.setattr(CACHE_BYTES, "loaders", weakref.WeakSet())
    manager = CommittedManager(LocalBlobStore, None)
    before = REGISTRY.get_sample_value("quarry_range_cache_bytes") or 0.0
    assert before == 0.0
    entries = (Entry(f"p{i:05d}", f"s3://b/{i}", 1, f"c{i}") for i in range(2000))
    base = manager.write_metarange(str(tmp_path / "lake"), entries).metarange_id
    change = Entry("p00007", "s3://b/new", 1, "new")
    manager.apply_changes(str(tmp_path / "lake"), base, [("p00007", change)])
    charged = manager._loader.range_cache_bytes
    assert charged > 0
    assert REGISTRY.get_sample_value("quarry_range_cache_bytes") == before + charged
    assert REGISTRY.get_sample_value("quarry_metarange_cache_bytes") > 0
    manager.close()
