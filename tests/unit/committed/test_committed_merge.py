"""CommittedManager.merge_metaranges on real files: semantics against a naive model, the
seed's retry table (docs/architecture.md §4, merge retry reuse), shortcuts and costs."""

from __future__ import annotations

import random

import pytest

from quarry import errors
from quarry.committed import EMPTY_METARANGE_ID, InvalidMetaRangeId, MetaRangeNotFound
from quarry.graveler.model import Conflict, DiffSummary, Entry, MergeStrategy
from support.merge_model import naive_merge

STRATEGIES = list(MergeStrategy)


def ent(path: str, version: int, address: str | None = None, mtime_us: int | None = None) -> Entry:
    return Entry(
        path,
        address if address is not None else f"s3://d/{path}#{version}",
        100 + version,
        f"etag-{version}",
        mtime_us if mtime_us is not None else 1_700_000_000_000_000 + version,
        "application/octet-stream",
        {"v": str(version)},
    )


def write(manager, namespace, model: dict[str, Entry]) -> str:
    return manager.write_metarange(namespace, [model[p] for p in sorted(model)]).metarange_id


def read(manager, namespace, metarange_id) -> dict[str, Entry]:
    return {e.path: e for e in manager.iterate(namespace, metarange_id)}


def _identities(model: dict[str, Entry]) -> dict[str, bytes]:
    return {path: e.identity for path, e in model.items()}


@pytest.fixture
def manager(new_manager):
    return new_manager(target_range_entries=8)


def filler(n: int = 200, version: int = 0) -> dict[str, Entry]:
    return {f"f/{i:04d}": ent(f"f/{i:04d}", version) for i in range(n)}


# ---- the seed's table ------------------------------------------------------------------------

# base | src | dst = base' | result = src' | dst' | final   (None = conflict)
SEED_TABLE = [
    ("A", "B", "A", "B", "A", "B"),
    ("A", "A", "B", "B", "B", "B"),
    ("A", "A", "A", "A", "B", "B"),  # (only) dst changed during the race
    ("A", "B", "C", None, None, None),  # conflicts never proceed
    ("A", "B", "A", "B", "C", None),  # conflict with the updated dst
    ("A", "A", "B", "B", "C", "C"),
]


@pytest.mark.parametrize(
    "deleted", [None, "A", "B", "C"], ids=["all-present", "A-absent", "B-absent", "C-absent"]
)
@pytest.mark.parametrize("row", range(len(SEED_TABLE)), ids=lambda i: f"row{i + 1}")
def test_seed_retry_table(manager, namespace, row, deleted):
    """Row by row: merge, then retry onto dst' with base' = dst and src' = the result. A
    deleted object behaves exactly like a particular unique content."""
    base_v, src_v, dst_v, result_v, dst2_v, final_v = SEED_TABLE[row]
    versions = {"A": 0, "B": 1, "C": 2}
    path = "f/0100x"  # between fillers, inside some range

    def tree(letter: str) -> dict[str, Entry]:
        model = filler()
        if letter != deleted:
            model[path] = ent(path, versions[letter])
        return model

    def content(letter: str | None):
        return None if letter is None or letter == deleted else versions[letter]

    def value(metarange_id: str):
        found = manager.get_entry(namespace, metarange_id, path)
        return None if found is None else found.size_bytes - 100

    base, src, dst, dst2 = (
        write(manager, namespace, tree(x)) for x in (base_v, src_v, dst_v, dst2_v or "C")
    )
    first = manager.merge_metaranges(namespace, base, src, dst)
    if result_v is None:
        assert first.metarange_id == "" and [c.path for c in first.conflicts] == [path]
        return  # conflicts never proceed
    assert first.metarange_id and not first.conflicts
    assert value(first.metarange_id) == content(result_v)
    retry = manager.merge_metaranges(namespace, dst, first.metarange_id, dst2)
    direct = manager.merge_metaranges(namespace, base, src, dst2)
    if final_v is None:
        assert retry.metarange_id == "" and [c.path for c in retry.conflicts] == [path]
        assert direct.metarange_id == "" and [c.path for c in direct.conflicts] == [path]
        return
    assert value(retry.metarange_id) == content(final_v)
    # Same content as merging the original inputs onto the new destination: same id.
    assert retry.metarange_id == direct.metarange_id
    assert read(manager, namespace, retry.metarange_id) == read(
        manager, namespace, direct.metarange_id
    )


# ---- semantics ---------------------------------------------------------------------------------


def test_conflicts_are_listed_in_path_order_bounded_and_nothing_is_written(
    manager, namespace, stores
):
    base = filler(300)
    source, dest = dict(base), dict(base)
    for i in range(0, 300, 10):  # 30 conflicting paths, 3 kinds
        p = f"f/{i:04d}"
        if i % 30 == 0:
            source[p], dest[p] = ent(p, 1), ent(p, 2)  # changed differently
        elif i % 30 == 10:
            source.pop(p)
            dest[p] = ent(p, 2)  # delete vs change
        else:
            source[p] = ent(p, 1)
            dest.pop(p)  # change vs delete
    source["g/new"], dest["g/new"] = ent("g/new", 1), ent("g/new", 2)  # add vs add
    source["f/0005"] = ent("f/0005", 1)  # clean source change
    source["f/0007x"] = ent("f/0007x", 1)  # clean source add
    source.pop("f/0009")  # clean source delete
    dest["f/0011"] = ent("f/0011", 3)  # destination-only change
    source["f/0013"] = dest["f/0013"] = ent("f/0013", 4)  # identical change: no conflict
    source.pop("f/0015"), dest.pop("f/0015")  # identical delete: no conflict
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    store = stores(namespace)
    store.reset()
    result = manager.merge_metaranges(namespace, b, s, d, max_conflicts=7)
    assert store.counts["put"] == 0
    expected = naive_merge(base, source, dest, MergeStrategy.DEFAULT)[2]
    assert len(expected) == 31
    assert result.metarange_id == ""
    assert result.conflicts == tuple(expected[:7]) and result.more_conflicts == 24
    assert [c.path for c in result.conflicts] == sorted(c.path for c in result.conflicts)
    first = result.conflicts[0]
    assert (first.base, first.source, first.destination) == (
        base["f/0000"],
        source["f/0000"],
        dest["f/0000"],
    )
    assert result.conflicts[1].source is None and result.conflicts[1].destination is not None
    assert result.conflicts[2].destination is None
    # The summary counts what would apply without the conflicts.
    assert result.summary == DiffSummary(added=1, removed=1, changed=1)
    everything = manager.merge_metaranges(namespace, b, s, d, max_conflicts=1000)
    assert len(everything.conflicts) == 31 and everything.more_conflicts == 0
    assert everything.conflicts[-1] == Conflict("g/new", None, source["g/new"], dest["g/new"])
    none_listed = manager.merge_metaranges(namespace, b, s, d, max_conflicts=0)
    assert none_listed.conflicts == () and none_listed.more_conflicts == 31
    # The strategies resolve every conflict.
    for strategy in (MergeStrategy.SOURCE_WINS, MergeStrategy.DEST_WINS):
        merged, summary, _c, _m = naive_merge(base, source, dest, strategy)
        out = manager.merge_metaranges(namespace, b, s, d, strategy=strategy)
        assert out.conflicts == () and out.more_conflicts == 0
        assert read(manager, namespace, out.metarange_id) == merged
        assert out.summary == summary
    src_wins = manager.merge_metaranges(namespace, b, s, d, strategy=MergeStrategy.SOURCE_WINS)
    assert src_wins.summary == DiffSummary(added=1 + 10, removed=1 + 10, changed=1 + 10 + 1)


def test_dry_run_reports_the_same_and_writes_nothing(manager, namespace, stores):
    base = filler(300)
    source, dest = dict(base), dict(base)
    source["f/0001"], dest["f/0001"] = ent("f/0001", 1), ent("f/0001", 2)
    source["f/0100"] = ent("f/0100", 1)
    source["f/0200a"] = ent("f/0200a", 1)
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    store = stores(namespace)
    for strategy in STRATEGIES:
        store.reset()
        dry = manager.merge_metaranges(namespace, b, s, d, strategy=strategy, dry_run=True)
        assert store.counts["put"] == 0
        assert dry.metarange_id == "" and dry.ranges_written == 0
        real = manager.merge_metaranges(namespace, b, s, d, strategy=strategy)
        assert (dry.summary, dry.conflicts, dry.more_conflicts) == (
            real.summary,
            real.conflicts,
            real.more_conflicts,
        )
    # Dry-run shortcuts too.
    for args in ((b, b, d), (b, s, b), (b, s, s)):
        store.reset()
        dry = manager.merge_metaranges(namespace, *args, dry_run=True)
        assert dry.metarange_id == "" and store.counts["put"] == 0
        assert dry.summary == manager.merge_metaranges(namespace, *args).summary


def test_shortcuts_read_no_range(manager, namespace, stores):
    base = filler(400)
    source, dest = dict(base), dict(base)
    source["f/0001"] = ent("f/0001", 1)
    source["f/0002a"] = ent("f/0002a", 1)
    del source["f/0300"]
    dest["f/0390"] = ent("f/0390", 2)
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    store = stores(namespace)
    for args, expected in (((b, b, d), d), ((b, s, s), s), ((s, d, d), d)):
        manager.clear_memory_cache()
        manager.reset_stats()
        store.reset()
        result = manager.merge_metaranges(namespace, *args)
        assert result.metarange_id == expected and result.summary == DiffSummary()
        assert manager.stats.ranges_read == 0 and store.counts["put"] == 0
        assert result.ranges_written == 0
        assert result.ranges_reused == len(manager.get_metarange(namespace, expected))
    # Fast-forward: the source itself; only the differing ranges are read for the summary.
    manager.clear_memory_cache()
    manager.reset_stats()
    store.reset()
    ff = manager.merge_metaranges(namespace, b, s, b)
    assert ff.metarange_id == s and ff.summary == DiffSummary(added=1, removed=1, changed=1)
    assert store.counts["put"] == 0 and ff.ranges_written == 0
    assert manager.stats.ranges_read <= 8 < len(manager.get_metarange(namespace, b))


def test_empty_metaranges(manager, namespace):
    a = {p: ent(p, 1) for p in ("a", "b", "c")}
    b = {p: ent(p, 2) for p in ("b", "d")}
    mr_a, mr_b = write(manager, namespace, a), write(manager, namespace, b)
    both = manager.merge_metaranges(namespace, "", mr_a, mr_b)
    assert both.metarange_id == "" and [c.path for c in both.conflicts] == ["b"]
    assert both.conflicts[0].base is None
    won = manager.merge_metaranges(namespace, "", mr_a, mr_b, strategy=MergeStrategy.SOURCE_WINS)
    assert read(manager, namespace, won.metarange_id) == {**b, **a}
    assert won.summary == DiffSummary(added=2, changed=1)
    gone = manager.merge_metaranges(namespace, mr_a, "", mr_a)  # the source deleted everything
    assert gone.metarange_id == EMPTY_METARANGE_ID and gone.summary.removed == 3
    assert manager.merge_metaranges(namespace, "", "", "").metarange_id == EMPTY_METARANGE_ID
    assert manager.merge_metaranges(namespace, "", mr_a, "").metarange_id == mr_a


def test_invalid_arguments(manager, namespace):
    mr = write(manager, namespace, filler(10))
    with pytest.raises(MetaRangeNotFound):
        manager.merge_metaranges(namespace, mr, "f" * 64, mr)
    with pytest.raises(InvalidMetaRangeId):
        manager.merge_metaranges(namespace, mr, "nope", mr)
    with pytest.raises(errors.InvalidArgument):
        manager.merge_metaranges(namespace, mr, mr, mr, strategy=7)
    with pytest.raises(errors.InvalidArgument):
        manager.merge_metaranges(namespace, mr, mr, mr, max_conflicts=-1)


# ---- randomized, against the naive model -------------------------------------------------------


def _random_case(rng: random.Random):
    universe = [f"{rng.choice('abc')}/{i:04d}" for i in range(rng.randrange(50, 400))]
    universe = sorted(set(universe))
    base = {p: ent(p, 0) for p in universe if rng.random() < 0.7}
    rate = rng.choice([0.01, 0.05, 0.3])

    def mutate(model: dict, version: int) -> dict:
        out = dict(model)
        for p in universe:
            if rng.random() >= rate:
                continue
            roll = rng.random()
            if p not in out:
                out[p] = ent(p, version)  # add
            elif roll < 0.4:
                del out[p]  # delete
            elif roll < 0.75:
                out[p] = ent(p, version)  # change
            elif roll < 0.9:
                # Re-pointed at another address, nothing else: a change (format 2).
                out[p] = ent(p, out[p].size_bytes - 100, address=f"moved{version}/{p}")
            else:
                # Same identity (every field but mtime): not a change.
                same = out[p]
                out[p] = ent(
                    p,
                    same.size_bytes - 100,
                    address=same.physical_address,
                    mtime_us=same.mtime_us + version,
                )
        return out

    source = mutate(base, 1)
    dest = mutate(base, 2)
    for p in universe:  # identical changes on both sides
        if rng.random() < rate / 2:
            if rng.random() < 0.5:
                source.pop(p, None)
                dest.pop(p, None)
            else:
                source[p] = dest[p] = ent(p, 3)
    return base, source, dest


@pytest.mark.parametrize("seed", range(25))
def test_random_merges_match_the_naive_model(new_manager, namespace, seed):
    rng = random.Random(seed)
    manager = new_manager(target_range_entries=8)
    base, source, dest = _random_case(rng)
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    max_conflicts = rng.choice([0, 3, 100])
    for strategy in STRATEGIES:
        merged, summary, conflicts, more = naive_merge(base, source, dest, strategy, max_conflicts)
        dry = manager.merge_metaranges(
            namespace, b, s, d, strategy=strategy, max_conflicts=max_conflicts, dry_run=True
        )
        result = manager.merge_metaranges(
            namespace, b, s, d, strategy=strategy, max_conflicts=max_conflicts
        )
        context = f"seed={seed} strategy={strategy.name}"
        assert result.summary == summary == dry.summary, context
        assert result.conflicts == tuple(conflicts) == dry.conflicts, context
        assert result.more_conflicts == more == dry.more_conflicts, context
        assert dry.metarange_id == ""
        if conflicts or more:
            assert result.metarange_id == "", context
            continue
        actual = read(manager, namespace, result.metarange_id)
        assert _identities(actual) == _identities(merged), context
        # The cached metarange's bisect keys (spliced by the writers) are its ranges'.
        cached = manager._loader.metarange(namespace, result.metarange_id)
        assert cached.max_keys == [r.max_key for r in cached.ranges], context
        for path, got in actual.items():
            # Exactly the model's entry; or, where the source re-staged the same content
            # (same identity, another mtime) in a range only it changed, the source's.
            assert got == merged[path] or got == source.get(path), (context, path)
        # Chunking is a pure function of the entry set: same ranges as writing it afresh.
        assert result.metarange_id == write(manager, namespace, actual), context


# ---- cost --------------------------------------------------------------------------------------


def _scattered(rng, paths, count, version):
    return sorted((p, ent(p, version)) for p in rng.sample(paths, count))


def test_work_is_proportional_to_the_change(new_manager, namespace, stores):
    manager = new_manager(target_range_entries=64)
    paths = [f"k/{i:06d}" for i in range(20_000)]
    base = manager.write_metarange(namespace, [ent(p, 0) for p in paths]).metarange_id
    n_ranges = len(manager.get_metarange(namespace, base))
    src = manager.apply_changes(namespace, base, [(paths[100], ent(paths[100], 1))])
    dst = manager.apply_changes(namespace, base, [(paths[15_000], ent(paths[15_000], 2))])
    manager.clear_memory_cache()
    manager.reset_stats()
    store = stores(namespace)
    store.reset()
    result = manager.merge_metaranges(namespace, base, src.metarange_id, dst.metarange_id)
    stats = manager.stats
    assert result.summary == DiffSummary(changed=1)
    # The source's changed range lands where the destination kept the base's: it is
    # spliced in by id; base and source range are only compared (path and identity columns)
    # for the summary. The destination's change is never read.
    assert stats.ranges_read == stats.ranges_read_keys <= 4, stats
    assert result.ranges_written == 0 and stats.ranges_written == 0
    assert result.ranges_reused == n_ranges
    # The metarange: its root and the index pages the change falls into (metaranges.py).
    assert store.counts["put"] == 1 + manager.stats.metarange_pages_written <= 3
    merged = read(manager, namespace, result.metarange_id)
    assert merged[paths[100]] == ent(paths[100], 1) and merged[paths[15_000]] == ent(
        paths[15_000], 2
    )
    # Both sides change the same range: it is merged by entry and re-derived.
    dst2 = manager.apply_changes(namespace, base, [(paths[101], ent(paths[101], 2))])
    manager.clear_memory_cache()
    manager.reset_stats()
    store.reset()
    both = manager.merge_metaranges(namespace, base, src.metarange_id, dst2.metarange_id)
    assert both.summary == DiffSummary(changed=1)
    assert 1 <= both.ranges_written <= 2 and both.ranges_reused >= n_ranges - 2
    assert manager.stats.ranges_read <= 6 and manager.stats.metarange_pages_written <= 2
    assert store.counts["put"] <= 3 + manager.stats.metarange_pages_written


def test_a_gap_the_destination_touched_in_one_range_splices_the_source_elsewhere(
    new_manager, namespace, stores
):
    # The source changes three neighbouring ranges (one gap between anchors); the
    # destination changes only the middle one. Only that range is merged by entry and
    # rewritten; the source's other two are spliced in by id, never rewritten.
    manager = new_manager(target_range_entries=64)
    paths = [f"k/{i:06d}" for i in range(20_000)]
    base = manager.write_metarange(namespace, [ent(p, 0) for p in paths]).metarange_id
    ranges = manager.get_metarange(namespace, base)
    first, middle, last = (ranges[i] for i in (10, 11, 12))
    src_paths = [first.min_key, middle.min_key, last.min_key]
    src = manager.apply_changes(namespace, base, [(p, ent(p, 1)) for p in src_paths])
    dst = manager.apply_changes(namespace, base, [(middle.max_key, ent(middle.max_key, 2))])
    src_ranges = {r.id for r in manager.get_metarange(namespace, src.metarange_id)}
    manager.clear_memory_cache()
    manager.reset_stats()
    store = stores(namespace)
    store.reset()
    result = manager.merge_metaranges(namespace, base, src.metarange_id, dst.metarange_id)
    assert result.summary == DiffSummary(changed=3)
    assert result.ranges_written == 1 and manager.stats.ranges_written == 1
    # The merged range and the metarange (its root and at most two index pages).
    assert store.counts["put"] == 2 + manager.stats.metarange_pages_written <= 4
    merged_ranges = manager.get_metarange(namespace, result.metarange_id)
    spliced = [r for r in merged_ranges if r.min_key in (first.min_key, last.min_key)]
    assert len(spliced) == 2 and all(r.id in src_ranges for r in spliced)
    merged = read(manager, namespace, result.metarange_id)
    for p in src_paths:
        assert merged[p] == ent(p, 1)
    assert merged[middle.max_key] == ent(middle.max_key, 2)
    # The same content as merging without the split: chunking is a pure function of it.
    assert result.metarange_id == write(manager, namespace, merged)


def test_retry_onto_a_moved_destination_rewrites_only_what_the_new_head_changed(
    new_manager, namespace, stores
):
    """docs/architecture.md §4, merge retry reuse: merging branch A into main loses the race
    against B's merge; retrying with base' = old main, source' = the merged metarange,
    destination' = new main gives the same result as merging A from scratch onto new main,
    and writes again none of the ranges only A's merge touched."""
    manager = new_manager(target_range_entries=16)
    rng = random.Random(5)
    paths = [f"data/{i:06d}" for i in range(8_000)]
    base = manager.write_metarange(namespace, [ent(p, 0) for p in paths]).metarange_id
    a_paths = rng.sample(paths[:4000], 200)
    rest = sorted(set(paths) - set(a_paths))
    branch_a = manager.apply_changes(
        namespace, base, sorted((p, ent(p, 1)) for p in a_paths)
    ).metarange_id
    # main moved since A branched: 200 other changes in the same half. The first attempt
    # writes new files for the ranges both changed (A-only ranges are A's own files again).
    main_0 = manager.apply_changes(
        namespace, base, _scattered(rng, rest[:3800], 200, 2)
    ).metarange_id
    store = stores(namespace)

    manager.clear_memory_cache()
    manager.reset_stats()
    store.reset()
    attempt = manager.merge_metaranges(namespace, base, branch_a, main_0)
    first_stats = manager.stats
    first_written = first_stats.ranges_written
    first_keys = set(store.keys_written)
    assert attempt.metarange_id and attempt.summary == DiffSummary(changed=200)
    assert first_written >= 50

    # Meanwhile B's merge moved main: 20 changes scattered everywhere.
    main_1 = manager.apply_changes(namespace, main_0, _scattered(rng, rest, 20, 3)).metarange_id
    manager.clear_memory_cache()
    manager.reset_stats()
    store.reset()
    retry = manager.merge_metaranges(namespace, main_0, attempt.metarange_id, main_1)
    retry_stats = manager.stats
    retry_keys = set(store.keys_written)
    print(
        f"first attempt: read {first_stats.ranges_read} ({first_stats.ranges_read_keys} keys "
        f"only), wrote {first_written} ranges; retry: read {retry_stats.ranges_read} "
        f"({retry_stats.ranges_read_keys} keys only), wrote {retry_stats.ranges_written}, "
        f"found {retry_stats.ranges_existing} already written"
    )
    assert retry.summary == DiffSummary(changed=200)
    # New range files only where A's and B's changes share a range.
    assert not first_keys & retry_keys
    assert retry_stats.ranges_written <= 30 and retry_stats.ranges_written * 4 < first_written
    # Ranges only A's merge touched are reused by id: neither read nor re-derived.
    assert retry.ranges_written <= 40 < retry.ranges_reused
    # Full reads only where B's changes landed; A-only ranges are just compared (path and
    # identity columns) to count the summary.
    full_reads = retry_stats.ranges_read - retry_stats.ranges_read_keys
    assert full_reads * 3 < first_stats.ranges_read - first_stats.ranges_read_keys
    # Same content, and the same ranges, as merging A from scratch onto the new main.
    direct = manager.merge_metaranges(namespace, base, branch_a, main_1)
    assert retry.metarange_id == direct.metarange_id
    assert retry.summary == direct.summary


def test_retry_counts_its_summary_without_reading_what_only_the_first_attempt_touched(
    new_manager, namespace
):
    """The retry's summary (what it changes on the new HEAD) comes from the first attempt's
    summary, remembered by metarange ids: the ranges only A's merge touched are not read
    again, even with the range cache cold. A manager that never saw the first attempt
    reads them and finds the same summary and result."""
    manager = new_manager(target_range_entries=16)
    rng = random.Random(8)
    paths = [f"data/{i:06d}" for i in range(8_000)]
    base = manager.write_metarange(namespace, [ent(p, 0) for p in paths]).metarange_id
    a_changes = _scattered(rng, paths[:4000], 200, 1)
    branch_a = manager.apply_changes(namespace, base, a_changes).metarange_id
    main_0 = manager.apply_changes(
        namespace, base, _scattered(rng, paths[4000:], 200, 2)
    ).metarange_id
    attempt = manager.merge_metaranges(namespace, base, branch_a, main_0)
    assert attempt.summary == DiffSummary(changed=200)
    # The race: one more change on main, away from A's ranges.
    main_1 = manager.apply_changes(
        namespace, main_0, [(paths[7_000], ent(paths[7_000], 3))]
    ).metarange_id
    manager.clear_memory_cache()
    manager.reset_stats()
    retry = manager.merge_metaranges(namespace, main_0, attempt.metarange_id, main_1)
    assert retry.summary == DiffSummary(changed=200)
    assert manager.stats.ranges_read == 0, manager.stats
    cold = new_manager(target_range_entries=16)
    recounted = cold.merge_metaranges(namespace, main_0, attempt.metarange_id, main_1)
    assert cold.stats.ranges_read >= 20  # the summary read the long way
    assert recounted.summary == retry.summary
    assert recounted.metarange_id == retry.metarange_id
    merged = read(manager, namespace, retry.metarange_id)
    assert all(merged[p] == e for p, e in a_changes)
    assert merged[paths[7_000]] == ent(paths[7_000], 3)


@pytest.mark.parametrize("seed", range(25))
def test_retry_summaries_from_remembered_counts_match_the_naive_model(new_manager, namespace, seed):
    """Random first attempts and moved destinations (random changes, and a block where the
    new HEAD already holds the merged values): every retry, which starts from the first
    attempt's remembered summary, reports exactly the naive model's summary and conflicts,
    and the same as a manager that counts everything by reading."""
    rng = random.Random(1000 + seed)
    manager = new_manager(target_range_entries=8)
    fresh = new_manager(target_range_entries=8)
    base, source, dest = _random_case(rng)
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    first = manager.merge_metaranges(
        namespace,
        b,
        s,
        d,
        strategy=rng.choice([MergeStrategy.SOURCE_WINS, MergeStrategy.DEST_WINS]),
    )
    assert first.metarange_id
    result = read(manager, namespace, first.metarange_id)
    dest_after = dict(dest)
    universe = sorted(set(base) | set(source) | set(dest))
    for p in rng.sample(universe, len(universe) // 20):
        dest_after[p] = ent(p, 4)
    start = rng.randrange(len(universe))
    for p in universe[start : start + len(universe) // 3]:  # the merged values already
        if p in result:
            dest_after[p] = result[p]
        else:
            dest_after.pop(p, None)
    d2 = write(manager, namespace, dest_after)
    for strategy in STRATEGIES:
        context = f"seed={seed} strategy={strategy.name}"
        _merged, summary, conflicts, more = naive_merge(dest, result, dest_after, strategy)
        retry = manager.merge_metaranges(namespace, d, first.metarange_id, d2, strategy=strategy)
        recount = fresh.merge_metaranges(namespace, d, first.metarange_id, d2, strategy=strategy)
        assert retry.summary == summary == recount.summary, context
        assert retry.conflicts == tuple(conflicts) == recount.conflicts, context
        assert retry.more_conflicts == more == recount.more_conflicts, context
        assert retry.metarange_id == recount.metarange_id, context


def test_conflicts_convert_to_proto_and_back(make_entry):
    from quarry.convert import conflict_from_proto, conflict_to_proto

    full = Conflict("p", make_entry("p", 0), make_entry("p", 1), make_entry("p", 2))
    assert conflict_from_proto(conflict_to_proto(full)) == full
    for sides in (
        (None, make_entry("p", 1), make_entry("p", 2)),
        (make_entry("p", 0), None, make_entry("p", 2)),
        (make_entry("p", 0), make_entry("p", 1), None),
    ):
        conflict = Conflict("p", *sides)
        message = conflict_to_proto(conflict)
        assert [message.HasField(f) for f in ("base", "source", "destination")] == [
            side is not None for side in sides
        ]
        assert conflict_from_proto(message) == conflict


def test_the_destinations_last_range_is_rechunked_when_the_source_appends_after_it(
    manager, namespace
):
    """The destination deletes the base's last path (a chunk boundary), so its last range
    ends where chunking would not end one; the source appends ranges after the base's end.
    Those are spliced in after the destination's last range, which must then be re-derived
    with them (ApplyOptions.open_ends), not reused: the result is the metarange of the
    merged entries written afresh."""
    from quarry.committed.format import is_boundary

    model = filler()
    last = max(p for p in model if is_boundary(p, manager.target_range_entries))
    base = {p: e for p, e in model.items() if p <= last}
    source = dict(base, **{f"g/{i:04d}": ent(f"g/{i:04d}", 1) for i in range(40)})
    dest = {p: e for p, e in base.items() if p != last}
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    dest_last = manager.get_metarange(namespace, d)[-1].max_key
    assert not is_boundary(dest_last, manager.target_range_entries)
    result = manager.merge_metaranges(namespace, b, s, d)
    merged = {p: e for p, e in source.items() if p != last}
    assert _identities(read(manager, namespace, result.metarange_id)) == _identities(merged)
    assert result.metarange_id == write(manager, namespace, merged)


def test_applying_nothing_hands_back_the_bases_own_lists_unless_an_open_end_needs_rechunking(
    manager, namespace
):
    """What a merge whose gaps were all spliced from the source costs above its gaps: with
    no change to apply and no open end to re-chunk, apply_to_ranges returns the base's own
    lists (no pass over its 10k ranges at 10M entries) and writes nothing. An open end not
    at a chunk boundary, with ranges after it, is still re-chunked (new lists)."""
    from quarry.committed.apply import ApplyOptions, apply_to_ranges

    model = filler()
    base = manager._loader.metarange(namespace, write(manager, namespace, model))
    assert len(base.ranges) > 2
    applied = apply_to_ranges(manager._writer, namespace, base, [])
    assert applied.ranges is base.ranges and applied.max_keys is base.max_keys
    assert (applied.written, applied.reused) == (0, len(base.ranges))

    # Open ends at chunk boundaries (and the last range, whatever it ends on) change nothing.
    ends_at_boundary = manager._writer.chunking.ends_at_boundary
    at_boundary = [k for k, info in enumerate(base.ranges) if ends_at_boundary(info)]
    assert at_boundary
    kept = apply_to_ranges(
        manager._writer,
        namespace,
        base,
        [],
        ApplyOptions(open_ends=[*at_boundary, len(base.ranges) - 1]),
    )
    assert kept.ranges is base.ranges

    # A range ending off a boundary (the last of a metarange of a few entries) before
    # others: re-chunked with the next one.
    few = dict(sorted(model.items())[:5])
    (piece,) = manager._loader.metarange(namespace, write(manager, namespace, few)).ranges
    assert not ends_at_boundary(piece) and piece.max_key < base.ranges[1].min_key
    joined = type(base)("", [piece, *base.ranges[1:]])
    rechunked = apply_to_ranges(manager._writer, namespace, joined, [], ApplyOptions(open_ends=[0]))
    assert rechunked.ranges is not joined.ranges
    assert rechunked.ranges[0] != joined.ranges[0]
    assert rechunked.written >= 1


def test_a_branch_commit_merged_counts_its_summary_without_reading_its_own_ranges(
    new_manager, namespace
):
    """A commit remembers its diff counts (parent -> result): merging that commit (base =
    its parent) counts the ranges only the source changed from them, unread, even with a
    cold range cache. A manager that never saw the commit reads them, for the same summary
    and result."""
    manager = new_manager(target_range_entries=16)
    rng = random.Random(11)
    paths = [f"data/{i:06d}" for i in range(8_000)]
    base = manager.write_metarange(namespace, [ent(p, 0) for p in paths]).metarange_id
    a_changes = _scattered(rng, paths[:4000], 150, 1) + [("data/0000005x", ent("data/0000005x", 1))]
    a_changes.sort(key=lambda change: change[0])
    branch_a = manager.apply_changes(namespace, base, a_changes).metarange_id
    main = manager.apply_changes(namespace, base, _scattered(rng, paths[4000:], 150, 2))
    manager.clear_memory_cache()
    manager.reset_stats()
    merged = manager.merge_metaranges(namespace, base, branch_a, main.metarange_id)
    assert merged.summary == DiffSummary(added=1, changed=150)
    assert manager.stats.ranges_read == 0, manager.stats  # no gap both sides touched
    cold = new_manager(target_range_entries=16)
    recounted = cold.merge_metaranges(namespace, base, branch_a, main.metarange_id)
    assert cold.stats.ranges_read >= 20
    assert (recounted.summary, recounted.metarange_id) == (merged.summary, merged.metarange_id)
