"""An apply split into key spans, applied by separate managers (range-writer replicas) and
named by one metarange: the same result as one apply_changes (docs/performance.md)."""

from __future__ import annotations

import random

import pytest

from quarry.committed import spans as spans_mod
from quarry.committed.format import is_boundary
from quarry.graveler.model import DiffSummary


def _case(rng: random.Random, make_entry):
    paths = [f"p/{i:05d}" for i in range(rng.randrange(300, 1500))]
    base = [make_entry(p, 0) for p in paths]
    changes = {}
    for p in rng.sample(paths, rng.randrange(1, 120)):
        changes[p] = None if rng.random() < 0.3 else make_entry(p, 1)
    for i in range(rng.randrange(0, 30)):  # new paths, some after the last one
        p = f"p/{rng.randrange(0, 2000):05d}x{i}"
        changes[p] = make_entry(p, 2)
    return base, sorted(changes.items())


@pytest.mark.parametrize("seed", range(20))
def test_spans_applied_apart_give_the_metarange_of_one_apply(
    new_manager, namespace, seed, make_entry
):
    rng = random.Random(seed)
    base_entries, changes = _case(rng, make_entry)
    coordinator = new_manager()
    base = coordinator.write_metarange(namespace, base_entries).metarange_id
    expected = new_manager().apply_changes(namespace, base, changes)

    parts = rng.randrange(2, 6)
    spans = coordinator.plan_spans(namespace, base, changes, parts)
    assert 1 <= len(spans) <= parts
    assert [c for span in spans for c in span.changes] == changes
    # Each span on its own replica (fresh manager, fresh caches).
    applied = [new_manager().apply_span(namespace, base, span) for span in spans]
    result = coordinator.put_metarange(namespace, base, applied)
    assert result.metarange_id == expected.metarange_id
    assert result.summary == expected.summary


def test_spans_cut_only_after_a_hash_boundary_no_change_deletes(new_manager, namespace, make_entry):
    manager = new_manager()
    entries = [make_entry(f"p/{i:05d}", 0) for i in range(2000)]
    base = manager.write_metarange(namespace, entries).metarange_id
    ranges = manager.get_metarange(namespace, base)
    # Delete the last path of every range: no cut is safe, so one span.
    deletes = [(r.max_key, None) for r in ranges]
    assert len(manager.plan_spans(namespace, base, deletes, 4)) == 1
    changes = [(e.path, make_entry(e.path, 1)) for e in entries[::50]]
    spans = manager.plan_spans(namespace, base, changes, 4)
    assert len(spans) == 4
    for span in spans[:-1]:
        last = ranges[span.stop - 1].max_key
        assert is_boundary(last, manager.target_range_entries)
        assert all(path <= last for path, _ in span.changes)


def test_a_span_is_durable_when_it_returns_and_nothing_changed_keeps_the_base(
    new_manager, namespace, stores, make_entry
):
    manager = new_manager()
    entries = [make_entry(f"p/{i:05d}", 0) for i in range(500)]
    base = manager.write_metarange(namespace, entries).metarange_id
    changes = [(entries[7].path, make_entry(entries[7].path, 3))]
    (span,) = manager.plan_spans(namespace, base, changes, 1)
    applied = manager.apply_span(namespace, base, span)
    # The coordinator names these ranges in a metarange right after: none may be unsynced.
    assert applied.written == 1 and not stores(namespace).inner._unsynced_files
    no_op = manager.apply_span(namespace, base, type(span)(span.first, span.stop, []))
    kept = manager.put_metarange(namespace, base, [no_op])
    assert kept.metarange_id == base and kept.summary == DiffSummary()


def test_ranges_ended_by_the_byte_cap_are_never_cut_after(new_manager, namespace, make_entry):
    # With a small byte cap most ranges end at the cap, not at a hash boundary: cutting a
    # span there would rechunk differently from one apply (the cap counts from a range's
    # start), so spans only end after hash boundaries, and the result stays the same.
    manager = new_manager(target_range_entries=64, max_range_bytes=3000)
    entries = [make_entry(f"p/{i:05d}", 0) for i in range(3000)]
    base = manager.write_metarange(namespace, entries).metarange_id
    ranges = manager.get_metarange(namespace, base)
    capped = [r for r in ranges[:-1] if not is_boundary(r.max_key, 64)]
    assert len(capped) > len(ranges) // 2
    rng = random.Random(3)
    changes = sorted(
        (e.path, None if rng.random() < 0.2 else make_entry(e.path, 1))
        for e in rng.sample(entries, 200)
    )
    expected = new_manager(target_range_entries=64, max_range_bytes=3000).apply_changes(
        namespace, base, changes
    )
    spans = manager.plan_spans(namespace, base, changes, 4)
    assert len(spans) > 1
    for span in spans[:-1]:
        assert is_boundary(ranges[span.stop - 1].max_key, 64)
    applied = [
        new_manager(target_range_entries=64, max_range_bytes=3000).apply_span(namespace, base, span)
        for span in spans
    ]
    assert manager.put_metarange(namespace, base, applied).metarange_id == expected.metarange_id


def test_changes_in_few_ranges_are_not_split(new_manager, namespace, make_entry):
    # A span is worth its round trip only if it rewrites enough ranges: 300 changes in
    # 3 neighbouring ranges stay one span, the same number spread over every range split.
    manager = new_manager()
    entries = [make_entry(f"p/{i:05d}", 0) for i in range(6000)]
    base = manager.write_metarange(namespace, entries).metarange_id
    ranges = manager.get_metarange(namespace, base)
    first = sum(r.count for r in ranges[:10])
    localized = [(e.path, make_entry(e.path, 1)) for e in entries[first : first + 40]]
    assert spans_mod.ranges_touched([r.max_key for r in ranges], [p for p, _ in localized]) <= 4
    assert len(manager.plan_spans(namespace, base, localized, 4)) > 1  # no floor: split
    assert len(manager.plan_spans(namespace, base, localized, 4, min_ranges_per_span=8)) == 1
    spread = [(e.path, make_entry(e.path, 1)) for e in entries[:: len(entries) // 40]]
    touched = spans_mod.ranges_touched([r.max_key for r in ranges], [p for p, _ in spread])
    assert touched >= 32
    planned = manager.plan_spans(namespace, base, spread, 4, min_ranges_per_span=8)
    assert 2 <= len(planned) <= min(4, touched // 8)


def test_ranges_touched_counts_each_range_once_and_paths_after_the_last():
    max_keys = ["b", "d", "f"]
    assert spans_mod.ranges_touched(max_keys, []) == 0
    assert spans_mod.ranges_touched(max_keys, ["a", "b"]) == 1
    assert spans_mod.ranges_touched(max_keys, ["a", "c", "d", "e"]) == 3
    assert spans_mod.ranges_touched(max_keys, ["g", "h"]) == 1  # after the last range
    assert spans_mod.ranges_touched(max_keys, ["b", "f", "z"]) == 3
