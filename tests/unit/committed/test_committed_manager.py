"""CommittedManager on real files: reads, apply semantics, history independence, costs."""

from __future__ import annotations

import os
import random
import threading

import pytest

from quarry import errors
from quarry.committed import (
    EMPTY_METARANGE_ID,
    DuplicatePath,
    InvalidMetaRangeId,
    InvalidPath,
    MetaRangeNotFound,
    RangeNotFound,
    UnsortedInput,
    metarange_key,
    range_key,
)
from quarry.committed.apply import LIST_PATHS_AFTER
from quarry.committed.metaranges import read_metarange_tree
from quarry.graveler.model import Change, ChangeType, Entry

TRICKY_PATHS = sorted(
    [
        "a",
        "a/",
        "a/b",
        "a/b/",
        "a/b/c",
        "a/bc",
        "a0",
        "ab",
        "a\u00e9",
        "a\u00e9/x",
        "a\uffff",
        "a\U0001f600",
        "a\U0001f600/z",
        "b",
        "b/" + "x" * 300,
        "é",
        "€/1",
        "\U0001f600",
        "日本/データ",
        "日本語",
    ]
)


def model_apply(model: dict[str, Entry], changes) -> dict[str, Entry]:
    out = dict(model)
    for path, entry in changes:
        if entry is None:
            out.pop(path, None)
        elif path not in out or out[path].identity != entry.identity:
            out[path] = entry
    return out


def ids_of(manager, namespace, metarange_id):
    return [r.id for r in manager.get_metarange(namespace, metarange_id)]


# ---- reads ------------------------------------------------------------------------------------


def test_write_then_read_everything(new_manager, namespace, make_entry):
    manager = new_manager(target_range_entries=4)
    entries = [make_entry(p, i) for i, p in enumerate(TRICKY_PATHS)]
    result = manager.write_metarange(namespace, entries)
    assert result.summary.added == len(entries) and result.ranges_reused == 0
    ranges = manager.get_metarange(namespace, result.metarange_id)
    assert len(ranges) == result.ranges_written > 1
    assert (
        sum(r.count for r in ranges)
        == len(entries)
        == manager.count(namespace, result.metarange_id)
    )
    assert all(a.max_key < b.min_key for a, b in zip(ranges, ranges[1:], strict=False))
    listed = list(manager.iterate(namespace, result.metarange_id))
    assert listed == entries
    assert [e.identity for e in listed] == [e.identity for e in entries]
    for e in entries:
        got = manager.get_entry(namespace, result.metarange_id, e.path)
        assert got == e and got.identity == e.identity
    for missing in ("", "0", "a/b/c/", "a\U0001f600/", "zzz", "a/a", "日本/"):
        assert manager.get_entry(namespace, result.metarange_id, missing) is None


def test_prefix_and_start_match_a_sorted_model(new_manager, namespace, make_entry):
    manager = new_manager(target_range_entries=3)
    entries = [make_entry(p) for p in TRICKY_PATHS]
    mr = manager.write_metarange(namespace, entries).metarange_id
    probes = sorted({p[:k] for p in TRICKY_PATHS for k in range(len(p) + 1)} | {"", "zz"})
    for prefix in probes:
        expected = [p for p in TRICKY_PATHS if p.startswith(prefix)]
        assert [e.path for e in manager.iterate(namespace, mr, prefix=prefix)] == expected, prefix
    for start in probes:
        expected = [p for p in TRICKY_PATHS if p >= start]
        assert [e.path for e in manager.iterate(namespace, mr, start=start)] == expected, start
    # start and prefix together: the later bound wins.
    assert [e.path for e in manager.iterate(namespace, mr, start="a/b/", prefix="a/")] == [
        "a/b/",
        "a/b/c",
        "a/bc",
    ]


def test_seek_ge(new_manager, namespace, make_entry):
    manager = new_manager(target_range_entries=3)
    mr = manager.write_metarange(namespace, [make_entry(p) for p in TRICKY_PATHS]).metarange_id
    it = manager.iterate(namespace, mr)
    assert next(it).path == "a"
    it.seek_ge("a/bc")
    assert [next(it).path, next(it).path] == ["a/bc", "a0"]
    it.seek_ge("a/")  # backwards is allowed (within the iterator's bounds)
    assert next(it).path == "a/"
    it.seek_ge("日本語")  # code point order: CJK sorts before the emoji
    assert [e.path for e in it] == ["日本語", "\U0001f600"]
    with pytest.raises(StopIteration):
        next(it)
    it.seek_ge("日本")  # after exhaustion, a seek revives it
    assert [e.path for e in it] == ["日本/データ", "日本語", "\U0001f600"]
    bounded = manager.iterate(namespace, mr, prefix="a/")
    bounded.seek_ge("")  # never before the prefix
    assert [e.path for e in bounded] == ["a/", "a/b", "a/b/", "a/b/c", "a/bc"]
    beyond = manager.iterate(namespace, mr, prefix="a/")
    beyond.seek_ge("a0")
    assert list(beyond) == []


def test_seek_and_prefix_skip_ranges_unread(new_manager, namespace, make_entry, stores):
    manager = new_manager(target_range_entries=16)
    entries = [make_entry(f"d{d:03d}/f{f:03d}") for d in range(100) for f in range(20)]
    mr = manager.write_metarange(namespace, entries).metarange_id
    ranges = manager.get_metarange(namespace, mr)
    assert len(ranges) > 60
    store = stores(namespace)
    fresh = new_manager(target_range_entries=16)
    fresh.get_metarange(namespace, mr)
    store.reset()
    listed = [e.path for e in fresh.iterate(namespace, mr, prefix="d050/")]
    assert listed == [f"d050/f{f:03d}" for f in range(20)]
    touching = [r for r in ranges if r.max_key >= "d050/" and r.min_key < "d050/\uffff"]
    assert store.reads <= len(touching) + 1
    store.reset()
    it = fresh.iterate(namespace, mr)
    next(it)
    it.seek_ge("d090/f010")
    assert next(it).path == "d090/f010"
    assert store.reads <= 2


def test_empty_metarange(new_manager, namespace, stores):
    manager = new_manager()
    result = manager.write_metarange(namespace, [])
    assert result.metarange_id == EMPTY_METARANGE_ID
    assert os.path.isfile(os.path.join(namespace, metarange_key(EMPTY_METARANGE_ID)))
    assert manager.get_metarange(namespace, EMPTY_METARANGE_ID) == []
    assert manager.get_metarange(namespace, "") == []
    assert list(manager.iterate(namespace, "")) == []
    assert manager.get_entry(namespace, EMPTY_METARANGE_ID, "x") is None
    assert list(manager.diff(namespace, "", EMPTY_METARANGE_ID)) == []
    nothing = manager.apply_changes(namespace, "", [("gone", None)])
    assert nothing.metarange_id == EMPTY_METARANGE_ID and nothing.summary.total == 0
    # Even without its file, the empty metarange reads as empty.
    other = os.path.join(namespace, "other")
    assert manager.get_metarange(other, EMPTY_METARANGE_ID) == []
    assert manager.ensure_empty_metarange(other) == EMPTY_METARANGE_ID
    assert os.path.isfile(os.path.join(other, metarange_key(EMPTY_METARANGE_ID)))


# ---- apply semantics ---------------------------------------------------------------------


def test_apply_summary_counts_only_real_changes(new_manager, namespace, make_entry):
    manager = new_manager(target_range_entries=4)
    base_entries = [make_entry(f"p{i:02d}", 1) for i in range(20)]
    base = manager.write_metarange(namespace, base_entries).metarange_id
    # Identity covers every field but mtime (format 2): only an mtime differs here.
    same_content = make_entry("p03", 1, mtime_us=5)
    assert same_content.identity == base_entries[3].identity
    repointed = make_entry("p04", 1, address="somewhere/else")
    assert repointed.identity != base_entries[4].identity
    result = manager.apply_changes(
        namespace,
        base,
        [
            ("p00", None),  # removed
            ("p03", same_content),  # identity equal: nothing, base entry kept
            ("p04", repointed),  # another address, nothing else: a change
            ("p05", make_entry("p05", 2)),  # changed
            ("p05a", make_entry("p05a", 1)),  # added
            ("p07x", None),  # delete of a missing path: nothing
            ("zz", make_entry("zz", 1)),  # added after the last range
        ],
    )
    assert (result.summary.added, result.summary.removed, result.summary.changed) == (2, 1, 2)
    assert (
        manager.get_entry(namespace, result.metarange_id, "p03").mtime_us
        == base_entries[3].mtime_us
    )
    assert (
        manager.get_entry(namespace, result.metarange_id, "p04").physical_address
        == "somewhere/else"
    )
    assert manager.get_entry(namespace, result.metarange_id, "p00") is None
    assert manager.get_entry(namespace, result.metarange_id, "p05").checksum == "etag-2"
    assert [e.path for e in manager.iterate(namespace, result.metarange_id)] == sorted(
        [e.path for e in base_entries[1:]] + ["p05a", "zz"]
    )


def test_no_op_applies_return_the_base_and_write_nothing(
    new_manager, namespace, make_entry, stores
):
    manager = new_manager(target_range_entries=4)
    entries = [make_entry(f"p{i:02d}", 1) for i in range(30)]
    base = manager.write_metarange(namespace, entries).metarange_id
    store = stores(namespace)
    store.reset()
    result = manager.apply_changes(
        namespace,
        base,
        [
            ("p04", make_entry("p04", 1)),
            ("p10x", None),
            ("p20", make_entry("p20", 1, mtime_us=42)),
        ],
    )
    assert result.metarange_id == base
    assert result.summary.total == 0 and result.ranges_written == 0
    assert store.counts["put"] == 0
    # Re-pointing an entry at another address is never a no-op (format 2).
    moved = manager.apply_changes(
        namespace, base, [("p04", make_entry("p04", 1, address="new/address"))]
    )
    assert moved.metarange_id != base and moved.summary.changed == 1
    assert manager.apply_changes(namespace, base, []).metarange_id == base


def test_changes_may_be_change_objects(new_manager, namespace, make_entry):
    manager = new_manager()
    base = manager.write_metarange(namespace, [make_entry("a"), make_entry("b")]).metarange_id
    result = manager.apply_changes(
        namespace,
        base,
        [Change(ChangeType.REMOVED, "a"), Change(ChangeType.ADDED, "c", make_entry("c"))],
    )
    assert [e.path for e in manager.iterate(namespace, result.metarange_id)] == ["b", "c"]


@pytest.mark.parametrize(
    "changes,error",
    [
        ([("b", None), ("a", None)], UnsortedInput),
        ([("a", None), ("a", None)], DuplicatePath),
        ([("", None)], InvalidPath),
        ([("a", Entry("b"))], errors.InvalidArgument),
        ([("a", "not an entry")], errors.InvalidArgument),
        ([("a\ud800", Entry("a\ud800"))], InvalidPath),
    ],
)
def test_apply_rejects_bad_input(new_manager, namespace, changes, error):
    manager = new_manager()
    with pytest.raises(error) as caught:
        manager.apply_changes(namespace, "", changes)
    assert caught.value.code.name == "INVALID_ARGUMENT"


def test_write_metarange_rejects_unsorted(new_manager, namespace, make_entry):
    manager = new_manager()
    with pytest.raises(UnsortedInput):
        manager.write_metarange(namespace, [make_entry("b"), make_entry("a")])
    with pytest.raises(DuplicatePath):
        manager.write_metarange(namespace, [make_entry("a"), make_entry("a")])


def test_bad_and_missing_ids(new_manager, namespace, make_entry):
    manager = new_manager()
    with pytest.raises(InvalidMetaRangeId):
        manager.get_metarange(namespace, "../../etc/passwd")
    with pytest.raises(MetaRangeNotFound) as caught:
        manager.get_metarange(namespace, "0" * 64)
    assert caught.value.reason == "METARANGE_NOT_FOUND"
    with pytest.raises(MetaRangeNotFound):
        manager.apply_changes(namespace, "1" * 64, [])
    mr = manager.write_metarange(namespace, [make_entry("a")]).metarange_id
    (rng,) = manager.get_metarange(namespace, mr)
    os.unlink(os.path.join(namespace, range_key(rng.id)))
    with pytest.raises(RangeNotFound):
        new_manager().get_entry(namespace, mr, "a")


# ---- content addressing and history independence ----------------------------------------


def random_history(rnd: random.Random, universe: list[str], make_entry, steps: int):
    """Batches of sorted changes over `universe`, with deletes and re-adds."""
    for _ in range(steps):
        batch: dict[str, Entry | None] = {}
        for _ in range(rnd.randint(1, 40)):
            path = rnd.choice(universe)
            if rnd.random() < 0.35:
                batch[path] = None
            else:
                version = rnd.randint(0, 2)
                big = {"blob": "x" * rnd.randint(50, 400)} if rnd.random() < 0.15 else None
                batch[path] = make_entry(path, version, metadata=big or {"v": str(version)})
        yield sorted(batch.items())


@pytest.mark.parametrize("changes_in_range", [3, LIST_PATHS_AFTER - 1, LIST_PATHS_AFTER, 300])
def test_many_changes_in_one_range_apply_as_few(
    new_manager, namespace, make_entry, changes_in_range
):
    """apply searches a range's paths in place for its first changes and in a list after
    LIST_PATHS_AFTER of them (a localized commit): the same result either way."""
    manager = new_manager(target_range_entries=1_000_000)
    base = {f"k/{i:04d}": make_entry(f"k/{i:04d}") for i in range(0, 800, 2)}
    mr = manager.write_metarange(namespace, list(base.values())).metarange_id
    manager.clear_memory_cache()
    rnd = random.Random(changes_in_range)
    picked = sorted(rnd.sample(range(800), changes_in_range))
    changes = []
    for i in picked:
        path = f"k/{i:04d}"
        kind = rnd.choice(["put", "same", "delete"])
        if kind == "delete":
            changes.append((path, None))  # also of paths that are not there
        else:
            changes.append((path, make_entry(path, 0 if kind == "same" else 1)))
    result = manager.apply_changes(namespace, mr, changes)
    expected = model_apply(base, changes)
    listed = list(manager.iterate(namespace, result.metarange_id))
    assert [e.path for e in listed] == sorted(expected)
    assert all(e == expected[e.path] for e in listed)
    (info,) = manager.get_metarange(namespace, mr)
    data = manager._loader.range(namespace, info)
    assert (data._paths is not None) == (changes_in_range >= LIST_PATHS_AFTER)


@pytest.mark.parametrize("target,max_bytes", [(8, 1 << 30), (6, 2_000)])
def test_same_entries_same_ids_whatever_the_history(
    new_manager, namespace, make_entry, target, max_bytes
):
    rnd = random.Random(target)
    universe = sorted(
        {f"t/{rnd.randint(0, 999):04d}" + rnd.choice(["", "/x", "é", "/€"]) for _ in range(500)}
    )
    first = new_manager(target_range_entries=target, max_range_bytes=max_bytes)
    second = new_manager(target_range_entries=target, max_range_bytes=max_bytes)
    model: dict[str, Entry] = {}
    mr = ""
    for changes in random_history(rnd, universe, make_entry, 60):
        result = first.apply_changes(namespace, mr, changes)
        model = model_apply(model, changes)
        mr = result.metarange_id
        listed = list(first.iterate(namespace, mr))
        assert [e.path for e in listed] == sorted(model)
        assert all(e == model[e.path] for e in listed)
        # The bisect keys the writer spliced for the cached metarange are its ranges'.
        cached = first._loader.metarange(namespace, mr)
        assert cached.max_keys == [r.max_key for r in cached.ranges]
        # The same set written from scratch: identical metarange (and so identical ranges).
        scratch = second.write_metarange(namespace, [model[p] for p in sorted(model)])
        assert scratch.metarange_id == mr
    if max_bytes < 1 << 30:
        ranges = first.get_metarange(namespace, mr)
        assert any(r.size_bytes >= max_bytes for r in ranges)  # the cap did cut
    # Yet another history: everything added in reverse-ordered batches, with junk deleted.
    third = new_manager(target_range_entries=target, max_range_bytes=max_bytes)
    paths = sorted(model)
    other = ""
    for k in range(5, -1, -1):
        chunk = paths[k::6]
        junk = [(p + "~junk", make_entry(p + "~junk")) for p in chunk[:3]]
        other = third.apply_changes(
            namespace, other, sorted([(p, make_entry(p, 9)) for p in chunk] + junk)
        ).metarange_id
        other = third.apply_changes(namespace, other, [(p, None) for p, _ in junk]).metarange_id
    other = third.apply_changes(namespace, other, [(p, model[p]) for p in paths]).metarange_id
    # Puts equal in identity keep the base entry (its mtime); rewrite those exactly.
    listed = {e.path: e for e in third.iterate(namespace, other)}
    fix = [(p, None) for p in paths if listed[p] != model[p]]
    other = third.apply_changes(namespace, other, fix).metarange_id
    other = third.apply_changes(namespace, other, [(p, model[p]) for p, _ in fix]).metarange_id
    assert other == mr
    assert ids_of(third, namespace, other) == ids_of(first, namespace, mr)


def test_existing_files_are_not_rewritten(new_manager, namespace, make_entry, stores):
    manager = new_manager(target_range_entries=4)
    entries = [make_entry(f"p{i:03d}") for i in range(100)]
    first = manager.write_metarange(namespace, entries)
    mtimes = {
        k: os.stat(os.path.join(namespace, k)).st_mtime_ns
        for k, *_ in stores(namespace).list("_quarry/")
    }
    manager.reset_stats()
    again = new_manager(target_range_entries=4).write_metarange(namespace, entries)
    assert again.metarange_id == first.metarange_id
    assert {
        k: os.stat(os.path.join(namespace, k)).st_mtime_ns
        for k, *_ in stores(namespace).list("_quarry/")
    } == mtimes


# ---- costs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory):
    """100,000 entries with the default chunking (~100 ranges), written once per module."""
    from quarry.blob import LocalBlobStore
    from quarry.committed import CommittedManager

    namespace = str(tmp_path_factory.mktemp("big"))
    manager = CommittedManager(lambda ns: LocalBlobStore(ns, durable=False), None)
    paths = [f"tables/t{i % 7}/part-{i:07d}.parquet" for i in range(100_000)]
    paths.sort()
    entries = [Entry(p, f"s3://b/{i}", i, f"c{i}", i, "x") for i, p in enumerate(paths)]
    result = manager.write_metarange(namespace, entries)
    manager.close()
    return namespace, result.metarange_id, entries


def _range_reads(store) -> list[str]:
    return [k for k in store.keys_read if k.startswith("_quarry/ranges/")]


@pytest.mark.parametrize(
    "kind", ["change", "insert", "delete", "delete_range_end", "insert_after_end"]
)
def test_apply_one_change_touches_at_most_two_ranges(big_repo, new_manager, stores, kind):
    namespace, mr, entries = big_repo
    ranges = new_manager(target_range_entries=1024).get_metarange(namespace, mr)
    assert 60 < len(ranges) < 200
    manager = new_manager(target_range_entries=1024)  # cold caches
    store = stores(namespace)
    store.reset()
    middle = ranges[len(ranges) // 2]
    victim = entries[sum(r.count for r in ranges[: len(ranges) // 2]) + 5]
    if kind == "change":
        change = (victim.path, Entry(victim.path, "new", 1, "new", 1, "y"))
    elif kind == "insert":
        change = (victim.path + "x", Entry(victim.path + "x", "new", 1, "new", 1, "y"))
    elif kind == "delete":
        change = (victim.path, None)
    elif kind == "delete_range_end":
        change = (middle.max_key, None)  # a boundary path: the range merges with the next
    else:
        change = ("zzz", Entry("zzz", "new", 1, "new", 1, "y"))
    result = manager.apply_changes(namespace, mr, [change])
    assert result.summary.total == 1
    stats = manager.stats
    assert store.counts["get"] == 0  # local files are read in place
    assert stats.ranges_read <= 2 and len(_range_reads(store)) <= 2
    # A cold read of the base: its file and, for an index root, each of its pages.
    assert stats.metaranges_read == 1 + len(read_metarange_tree(store, mr)[0])
    assert result.ranges_written <= 2 and stats.ranges_written <= 2
    assert stats.metaranges_written == 1 and stats.metarange_pages_written <= 2
    assert store.counts["put"] <= 3 + stats.metarange_pages_written
    assert result.ranges_reused >= len(ranges) - 2
    # Reads of the result see the change and nothing else.
    path, entry = change
    assert manager.get_entry(namespace, result.metarange_id, path) == entry
    diff = list(manager.diff(namespace, mr, result.metarange_id))
    assert [(c.path, c.type) for c in diff] == [
        (
            path,
            ChangeType.REMOVED
            if entry is None
            else ChangeType.CHANGED
            if kind == "change"
            else ChangeType.ADDED,
        )
    ]


def test_apply_reads_only_ranges_changes_fall_into(big_repo, new_manager, stores):
    namespace, mr, entries = big_repo
    manager = new_manager(target_range_entries=1024, read_workers=0)
    ranges = manager.get_metarange(namespace, mr)
    store = stores(namespace)
    store.reset()
    picks = [entries[i] for i in (10, 50_000, 99_990)]
    changes = [(e.path, Entry(e.path, "n", 2, "n", 2, "n")) for e in picks]
    result = manager.apply_changes(namespace, mr, changes)
    hit = {r.id for r in ranges if any(r.min_key <= e.path <= r.max_key for e in picks)}
    read_ids = {k.rsplit("/", 1)[1].split(".")[0] for k in _range_reads(store)}
    assert read_ids == hit
    assert result.ranges_written == 3 and result.ranges_reused == len(ranges) - 3


def test_diff_skips_equal_ranges(big_repo, new_manager, stores):
    namespace, mr, entries = big_repo
    writer = new_manager(target_range_entries=1024)
    picks = [entries[i] for i in (1000, 1001, 70_000)]
    result = writer.apply_changes(
        namespace,
        mr,
        [
            (picks[0].path, None),
            (picks[1].path, Entry(picks[1].path, "n", 1, "n", 1, "n")),
            (picks[2].path + "+", Entry(picks[2].path + "+", "n", 1, "n", 1, "n")),
        ],
    )
    reader = new_manager(target_range_entries=1024)
    store = stores(namespace)
    store.reset()
    changes = list(reader.diff(namespace, mr, result.metarange_id))
    assert [(c.type, c.path) for c in changes] == [
        (ChangeType.REMOVED, picks[0].path),
        (ChangeType.CHANGED, picks[1].path),
        (ChangeType.ADDED, picks[2].path + "+"),
    ]
    assert changes[0].entry is None and changes[1].entry.checksum == "n"
    assert len(_range_reads(store)) <= 4  # the changed ranges on each side, never the rest
    reverse = list(reader.diff(namespace, result.metarange_id, mr))
    assert [(c.type, c.path) for c in reverse] == [
        (ChangeType.ADDED, picks[0].path),
        (ChangeType.CHANGED, picks[1].path),
        (ChangeType.REMOVED, picks[2].path + "+"),
    ]
    assert list(reader.diff(namespace, mr, mr)) == []
    prefix = picks[2].path[: len("tables/tN/")]
    only = list(reader.diff(namespace, mr, result.metarange_id, prefix=prefix))
    expected = [c.path for c in changes if c.path.startswith(prefix)]
    assert expected and [c.path for c in only] == expected
    after = list(reader.diff(namespace, mr, result.metarange_id, start=picks[1].path))
    assert [c.path for c in after] == [picks[1].path, picks[2].path + "+"]


def test_diff_matches_a_model(new_manager, namespace, make_entry):
    rnd = random.Random(7)
    manager = new_manager(target_range_entries=5)
    universe = [f"k/{i:03d}" for i in range(300)]
    left_model = {p: make_entry(p, rnd.randint(0, 1)) for p in universe if rnd.random() < 0.6}
    left = manager.write_metarange(namespace, [left_model[p] for p in sorted(left_model)])
    for changes in random_history(rnd, universe, make_entry, 5):
        right_model = model_apply(left_model, changes)
        right = manager.apply_changes(namespace, left.metarange_id, changes)
        for prefix in ("", "k/1", "k/29", "x"):
            expected = []
            for p in sorted(set(left_model) | set(right_model)):
                if not p.startswith(prefix):
                    continue
                a, b = left_model.get(p), right_model.get(p)
                if a is None:
                    expected.append((ChangeType.ADDED, p, b))
                elif b is None:
                    expected.append((ChangeType.REMOVED, p, None))
                elif a.identity != b.identity:
                    expected.append((ChangeType.CHANGED, p, b))
            got = [
                (c.type, c.path, c.entry)
                for c in manager.diff(
                    namespace, left.metarange_id, right.metarange_id, prefix=prefix
                )
            ]
            assert got == expected


def test_written_ranges_are_cached_for_the_next_apply(new_manager, namespace, make_entry, stores):
    manager = new_manager(target_range_entries=8)
    base = manager.write_metarange(namespace, [make_entry(f"p{i:04d}") for i in range(500)])
    first = manager.apply_changes(namespace, base.metarange_id, [("p0100", None)])
    store = stores(namespace)
    store.reset()
    manager.apply_changes(namespace, first.metarange_id, [("p0101", None)])
    assert store.reads == 0  # the range written by the first apply came from memory


def test_a_range_rewritten_from_its_cached_self_keeps_few_chunks(
    new_manager, namespace, make_entry, stores
):
    """Each apply builds the new range from slices of the cached one: without a bound, a
    range changed commit after commit gains chunks every time (every read of it paying per
    chunk). The cached range stays within MAX_CACHED_CHUNKS, and its content is exact."""
    from quarry.committed.writer import MAX_CACHED_CHUNKS

    manager = new_manager(target_range_entries=100_000)  # one range
    model = {f"p{i:04d}": make_entry(f"p{i:04d}") for i in range(200)}
    metarange_id = manager.write_metarange(namespace, list(model.values())).metarange_id
    for version in range(1, 41):
        path = f"p{(version * 37) % 200:04d}"
        model[path] = make_entry(path, version)
        applied = manager.apply_changes(namespace, metarange_id, [(path, model[path])])
        metarange_id = applied.metarange_id
        (info,) = manager.get_metarange(namespace, metarange_id)
        store = stores(namespace)
        store.reset()
        cached = manager._loader.range(namespace, info)
        assert store.reads == 0  # the range just written, from memory
        assert cached.table.column("path").num_chunks <= MAX_CACHED_CHUNKS
    assert [e.identity for e in manager.iterate(namespace, metarange_id)] == [
        model[p].identity for p in sorted(model)
    ]


@pytest.mark.parametrize("changed", [1, 400], ids=["one-range", "many-ranges"])
def test_a_failed_range_write_fails_the_apply_and_publishes_no_metarange(
    namespace, make_entry, changed
):
    """Whether the failing range is written on a pool thread or (the last one) on the
    calling thread, the apply raises the store's error and never writes a metarange."""
    from quarry.blob import LocalBlobStore
    from quarry.blob.base import StorageUnreachable
    from quarry.blob.layout import METARANGES_PREFIX
    from quarry.committed import CommittedManager

    class FullDisk(LocalBlobStore):
        refuse = False

        def put_deferred(self, key: str, data: bytes) -> bool:
            if self.refuse:
                raise StorageUnreachable("no space left on device", cause="full")
            return super().put_deferred(key, data)

    store = FullDisk(namespace, durable=False)
    manager = CommittedManager(lambda ns: store, None, target_range_entries=8)
    try:
        base = manager.write_metarange(namespace, [make_entry(f"p{i:04d}") for i in range(400)])
        before = sorted(info.key for info in store.list(METARANGES_PREFIX))
        store.refuse = True
        changes = [(f"p{i:04d}", make_entry(f"p{i:04d}", 1)) for i in range(changed)]
        with pytest.raises(StorageUnreachable):
            manager.apply_changes(namespace, base.metarange_id, changes)
        assert sorted(info.key for info in store.list(METARANGES_PREFIX)) == before
    finally:
        manager.close()


def test_concurrent_applies_share_a_manager(new_manager, namespace, make_entry):
    manager = new_manager(target_range_entries=8)
    base = manager.write_metarange(namespace, [make_entry(f"p{i:04d}") for i in range(2000)])
    results: dict[int, str] = {}

    def work(k: int) -> None:
        changes = [(f"p{i:04d}", make_entry(f"p{i:04d}", 1)) for i in range(k, 2000, 97)]
        results[k] = manager.apply_changes(namespace, base.metarange_id, changes).metarange_id

    threads = [threading.Thread(target=work, args=(k % 4,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    for k, mr in results.items():
        expected = new_manager(target_range_entries=8).apply_changes(
            namespace,
            base.metarange_id,
            [(f"p{i:04d}", make_entry(f"p{i:04d}", 1)) for i in range(k, 2000, 97)],
        )
        assert expected.metarange_id == mr


def test_readahead_reads_the_same_ranges(big_repo, new_manager, stores):
    namespace, mr, entries = big_repo
    writer = new_manager(target_range_entries=1024)
    picks = [entries[i] for i in range(0, 100_000, 9_000)]
    changed = writer.apply_changes(
        namespace, mr, [(e.path, Entry(e.path, "ra", 3, "ra", 3, "ra")) for e in picks]
    )
    store = stores(namespace)
    results = {}
    for readahead in (0, 4):
        reader = new_manager(target_range_entries=1024, read_workers=4)
        store.reset()
        diff = list(reader.diff(namespace, mr, changed.metarange_id, readahead=readahead))
        results[readahead] = ([(c.type, c.path) for c in diff], sorted(_range_reads(store)))
        assert [c.path for c in diff] == [e.path for e in picks]
    assert results[0] == results[4]  # a full diff reads exactly the differing ranges
    reader = new_manager(target_range_entries=1024, read_workers=4)
    prefix = "tables/t3/"
    listed = [e.path for e in reader.iterate(namespace, mr, prefix=prefix, readahead=3)]
    assert listed == [e.path for e in entries if e.path.startswith(prefix)]


def test_an_entry_larger_than_the_byte_cap_gets_its_own_range(new_manager, namespace):
    manager = new_manager(target_range_entries=1_000_000, max_range_bytes=1_000)
    small = [Entry(f"p{i:03d}", "a", 1, "c") for i in range(30)]
    huge = Entry("p015x", "a", 1, "c", 0, "", {"blob": "x" * 5_000})
    entries = sorted(small + [huge], key=lambda e: e.path)
    result = manager.write_metarange(namespace, entries)
    ranges = manager.get_metarange(namespace, result.metarange_id)
    assert any(r.max_key == "p015x" and r.size_bytes > 5_000 for r in ranges)
    assert all(r.size_bytes < 1_000 + 100 or r.max_key == "p015x" for r in ranges)
    # Removing it through an apply converges on the set without it.
    without = manager.apply_changes(namespace, result.metarange_id, [("p015x", None)])
    assert without.metarange_id == manager.write_metarange(namespace, small).metarange_id
