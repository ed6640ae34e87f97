"""replace_prefixes: the range-level "the import owns these paths" of an import's commit."""

from __future__ import annotations

import random

import pytest

from quarry import errors


def _model(base, imported, prefixes):
    kept = {e.path: e for e in base if not any(e.path.startswith(p) for p in prefixes)}
    kept.update({e.path: e for e in imported})
    return [kept[p] for p in sorted(kept)]


def _paths(rng, n, roots):
    return sorted({f"{rng.choice(roots)}{rng.randrange(10**6):06d}" for _ in range(n)})


@pytest.mark.parametrize("seed", range(6))
def test_replace_matches_a_model_and_keeps_every_entry_outside(
    new_manager, namespace, make_entry, stores, seed
):
    rng = random.Random(seed)
    manager = new_manager(target_range_entries=8)
    roots = ["a/", "b-", "b/", "b/x/", "c/", "d\u00e9/", "z"]
    base = [make_entry(p, 1) for p in _paths(rng, 400, roots)]
    prefixes = rng.sample(["b/", "c/", "d\u00e9/", "q/"], rng.randint(1, 3))
    imported = [
        make_entry(p, 2)
        for p in _paths(rng, 300, prefixes)
        if any(p.startswith(x) for x in prefixes)
    ]
    base_id = manager.write_metarange(namespace, base).metarange_id
    import_id = manager.write_metarange(namespace, imported).metarange_id
    result = manager.replace_prefixes(namespace, base_id, prefixes, import_id)
    got = list(manager.iterate(namespace, result.metarange_id))
    assert got == _model(base, imported, prefixes)
    assert result.summary.added == len(imported)
    removed = [e for e in base if any(e.path.startswith(p) for p in prefixes)]
    assert result.summary.removed == len(removed)
    # Ranges wholly outside the prefixes, and the import's, are reused, not rewritten.
    assert result.ranges_reused > 0


def test_reuse_by_id_reads_only_ranges_at_the_edges(new_manager, namespace, make_entry, stores):
    manager = new_manager(target_range_entries=8)
    base = [make_entry(f"{r}/{i:05d}") for r in ("a", "m", "z") for i in range(500)]
    imported = [make_entry(f"m/{i:05d}", 3) for i in range(0, 1000, 3)]
    base_id = manager.write_metarange(namespace, base).metarange_id
    import_id = manager.write_metarange(namespace, imported).metarange_id
    fresh = new_manager(target_range_entries=8)  # empty caches: every read is counted
    store = stores(namespace)
    store.reset()
    result = fresh.replace_prefixes(namespace, base_id, ["m/"], import_id)
    reads = store.reads
    assert list(fresh.iterate(namespace, result.metarange_id)) == _model(base, imported, ["m/"])
    total = len(fresh.get_metarange(namespace, base_id)) + len(
        fresh.get_metarange(namespace, import_id)
    )
    # Only a few ranges (the edges of m/) are read, of the ~250 involved.
    assert reads < 12 < total


def test_everything_replaced_and_empty_import(new_manager, namespace, make_entry):
    manager = new_manager()
    base = [make_entry(f"x/{i:03d}") for i in range(50)]
    base_id = manager.write_metarange(namespace, base).metarange_id
    empty_import = manager.write_metarange(namespace, []).metarange_id
    emptied = manager.replace_prefixes(namespace, base_id, [""], empty_import)
    assert list(manager.iterate(namespace, emptied.metarange_id)) == []
    kept = manager.replace_prefixes(namespace, base_id, ["y/"], empty_import)
    assert list(manager.iterate(namespace, kept.metarange_id)) == base


def test_refuses_entries_outside_and_nested_prefixes(new_manager, namespace, make_entry):
    manager = new_manager()
    base_id = manager.write_metarange(namespace, [make_entry("a/1")]).metarange_id
    stray = manager.write_metarange(namespace, [make_entry("m/1"), make_entry("n/1")]).metarange_id
    with pytest.raises(errors.InvalidArgument, match="under none"):
        manager.replace_prefixes(namespace, base_id, ["m/"], stray)
    with pytest.raises(errors.InvalidArgument, match="overlap"):
        manager.replace_prefixes(namespace, base_id, ["m/", "m/x/"], stray)
