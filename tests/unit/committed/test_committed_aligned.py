"""plan_aligned and build_aligned (the column-wise merge of a range both sides changed) gives exactly what the
entry walk gives: the same metarange, summary and conflicts, on real files; it is really
used where it applies and declines where it must (conflicts, moved paths, the byte cap)."""

from __future__ import annotations

import os
import random

import pytest

from quarry.committed import aligned, pieces
from quarry.committed.writer import RangeSink
from quarry.graveler.model import Entry, MergeStrategy
from support.merge_model import naive_merge

STRATEGIES = list(MergeStrategy)
BASE_MTIME = 1_700_000_000_000_000


def ent(path: str, version: int, mtime_us: int | None = None) -> Entry:
    return Entry(
        path,
        f"s3://d/{path}#{version}",
        100 + version,
        f"etag-{version}",
        mtime_us if mtime_us is not None else BASE_MTIME + version,
        "application/octet-stream",
        {"v": str(version)},
    )


def write(manager, namespace, model: dict[str, Entry]) -> str:
    return manager.write_metarange(namespace, [model[p] for p in sorted(model)]).metarange_id


class Spy:
    """Counts what plan_aligned decided (merged / declined)."""

    def __init__(self, monkeypatch, decline: bool = False):
        self.merged = self.declined = 0
        real = aligned.plan_aligned

        def spy(*args, **kwargs):
            result = None if decline else real(*args, **kwargs)
            if result is None:
                self.declined += 1
            else:
                self.merged += 1
            return result

        monkeypatch.setattr(pieces, "plan_aligned", spy)


def _update_only_case(rng: random.Random, n: int, conflicts: bool):
    """Base, source and destination with the same paths: each side re-points some entries,
    some identically on both, some re-staged with only a new mtime; with `conflicts`, a few
    changed differently on both."""
    paths = [f"p/{i:05d}" for i in range(n)]
    base = {p: ent(p, 0) for p in paths}
    source, dest = dict(base), dict(base)
    for p in rng.sample(paths, n // 20):
        source[p] = ent(p, 1)
    for p in rng.sample(paths, n // 20):
        if p not in source or source[p] == base[p]:
            dest[p] = ent(p, 2)
    for p in rng.sample(paths, n // 50):  # changed identically on both sides
        source[p] = dest[p] = ent(p, 3)
    for p in rng.sample(paths, n // 50):  # the same identity, another mtime
        source[p] = ent(p, 0, mtime_us=BASE_MTIME + 7)
    if conflicts:
        for p in rng.sample(paths, 3):
            source[p], dest[p] = ent(p, 4), ent(p, 5)
    return base, source, dest


def _write_models(new_manager, namespace, models, **tuning) -> tuple[str, str, str]:
    """The metaranges of (base, source, destination), written by a manager of their own."""
    manager = new_manager(**tuning)
    b, s, d = (write(manager, namespace, m) for m in models)
    return b, s, d


def _merge_both_ways(new_manager, namespace, monkeypatch, models, strategy, ids=None, **tuning):
    """The merge with plan_aligned and with every piece walked, each on a fresh manager
    (its own caches) over the same files: (column-wise result, walked result, spy).
    `ids`: the models' metaranges as _write_models wrote them (written here without)."""
    ids = ids or _write_models(new_manager, namespace, models, **tuning)
    results = []
    spy = None
    for decline in (False, True):
        manager = new_manager(**tuning)
        current = Spy(monkeypatch, decline=decline)
        spy = spy or current
        results.append(manager.merge_metaranges(namespace, *ids, strategy=strategy))
    return results[0], results[1], spy


@pytest.mark.parametrize("seed", range(12))
def test_column_wise_merge_equals_the_entry_walk(new_manager, namespace, monkeypatch, seed):
    rng = random.Random(seed)
    models = _update_only_case(rng, rng.choice([400, 900]), conflicts=seed % 3 == 0)
    ids = _write_models(new_manager, namespace, models, target_range_entries=16)
    for strategy in STRATEGIES:
        fast, walked, spy = _merge_both_ways(
            new_manager, namespace, monkeypatch, models, strategy, ids, target_range_entries=16
        )
        context = f"seed={seed} strategy={strategy.name}"
        assert spy.merged > 0, context  # the fast path really ran
        assert fast.metarange_id == walked.metarange_id, context
        assert fast.summary == walked.summary, context
        assert fast.conflicts == walked.conflicts, context
        assert fast.more_conflicts == walked.more_conflicts, context
        merged, summary, conflicts, _more = naive_merge(*models, strategy)
        assert fast.summary == summary and fast.conflicts == tuple(conflicts), context
        if not conflicts:
            manager = new_manager(target_range_entries=16)
            got = {e.path: e.identity for e in manager.iterate(namespace, fast.metarange_id)}
            assert got == {p: e.identity for p, e in merged.items()}, context
            assert fast.ranges_written == walked.ranges_written, context


def test_a_range_changed_differently_on_both_sides_is_walked(new_manager, namespace, monkeypatch):
    """A conflict is never decided column-wise: DEFAULT reports it, the strategies resolve
    it as the walk does."""
    base = {f"p/{i:04d}": ent(f"p/{i:04d}", 0) for i in range(200)}
    source, dest = dict(base), dict(base)
    source["p/0100"], dest["p/0100"] = ent("p/0100", 1), ent("p/0100", 2)
    ids = _write_models(new_manager, namespace, (base, source, dest))
    for strategy in STRATEGIES:
        fast, walked, spy = _merge_both_ways(
            new_manager, namespace, monkeypatch, (base, source, dest), strategy, ids
        )
        assert spy.merged == 0 and spy.declined >= 1
        assert (fast.metarange_id, fast.summary, fast.conflicts) == (
            walked.metarange_id,
            walked.summary,
            walked.conflicts,
        )
    default = new_manager().merge_metaranges(
        namespace, *(write(new_manager(), namespace, m) for m in (base, source, dest))
    )
    assert [c.path for c in default.conflicts] == ["p/0100"]


def test_moved_paths_and_the_byte_cap_are_left_to_the_walk(new_manager, namespace, monkeypatch):
    """An add or a delete on one side, or a merged range whose bytes would reach the cap
    (the chunker could end it elsewhere), declines; the results still equal the walk's."""
    base = {f"p/{i:04d}": ent(f"p/{i:04d}", 0) for i in range(300)}
    source, dest = dict(base), dict(base)
    source["p/0010"] = ent("p/0010", 1)
    dest["p/0011"] = ent("p/0011", 2)
    del source["p/0150"]
    dest["p/0151"] = ent("p/0151", 2)
    dest["p/0152x"] = ent("p/0152x", 2)  # added on the destination only
    fast, walked, _spy = _merge_both_ways(
        new_manager, namespace, monkeypatch, (base, source, dest), MergeStrategy.DEFAULT
    )
    assert (fast.metarange_id, fast.summary) == (walked.metarange_id, walked.summary)

    # The byte cap: a source entry much longer than the base's, in a range that is just
    # under the cap before the merge.
    long = Entry("p/0020", "s3://d/" + "x" * 3000, 1, "etag", BASE_MTIME, "", {})
    source = dict(base, **{"p/0020": long})
    dest = dict(base, **{"p/0021": ent("p/0021", 2)})
    for cap in (2_000, 6_000, 1 << 20):
        fast, walked, _spy = _merge_both_ways(
            new_manager,
            namespace,
            monkeypatch,
            (base, source, dest),
            MergeStrategy.DEFAULT,
            target_range_entries=16,
            max_range_bytes=cap,
        )
        assert (fast.metarange_id, fast.summary) == (walked.metarange_id, walked.summary), cap


def test_plan_aligned_declines_what_it_must(new_manager, namespace):
    """The functions themselves: None for different paths, a conflict, a range not ending at
    a chunk boundary, a merged size at the cap; the destination itself when nothing is
    taken; the built range has the destination's rows with the source's taken one."""
    manager = new_manager(target_range_entries=1_000_000)  # one range, no boundary inside
    loader = manager._loader

    def data(model):
        metarange = loader.metarange(namespace, write(manager, namespace, model))
        (info,) = metarange.ranges
        return loader.range(namespace, info)

    base = {f"p/{i:03d}": ent(f"p/{i:03d}", 0) for i in range(50)}
    b = data(base)
    # The only range of a metarange rarely ends at a boundary: find a target that makes it.
    target = next(t for t in range(2, 500) if b.last_is_boundary(t))
    source_model = dict(base, **{"p/010": ent("p/010", 1)})
    s = data(source_model)
    d = data(dict(base, **{"p/020": ent("p/020", 2)}))
    plan = aligned.plan_aligned(b, s, d, target, 1 << 20)
    assert plan is not None and (plan.rows, plan.source_changed) == ([10], 1)
    assert plan.size_bytes == d.info.size_bytes  # "#0" -> "#1": the same lengths
    built = aligned.build_aligned(plan)
    expected = dict(source_model, **{"p/020": ent("p/020", 2)})
    # The same range (id, keys, count, size) as writing the merged entries afresh.
    assert built.info == loader.metarange(namespace, write(manager, namespace, expected)).ranges[0]
    assert aligned.plan_aligned(b, s, d, target, plan.size_bytes) is None  # the byte cap
    non_boundary = next(t for t in range(2, 500) if not b.last_is_boundary(t))
    assert aligned.plan_aligned(b, s, d, non_boundary, 1 << 20) is None
    conflict = data(dict(base, **{"p/010": ent("p/010", 2)}))
    assert aligned.plan_aligned(b, s, conflict, target, 1 << 20) is None
    moved = data({**{p: e for p, e in base.items() if p != "p/030"}, "p/0305": ent("p/0305", 0)})
    assert aligned.plan_aligned(b, s, moved, target, 1 << 20) is None
    same = aligned.plan_aligned(b, d, d, target, 1 << 20)  # changed identically
    assert same is not None and same.rows == [] and aligned.build_aligned(same) is d


def test_a_failed_range_write_fails_the_merge_and_nothing_names_its_ranges(
    new_manager, namespace, monkeypatch
):
    """write_aligned writes on several lanes: a failure in one fails the merge, no
    metarange is written, and the same merge succeeds afterwards."""
    rng = random.Random(5)
    base, source, dest = _update_only_case(rng, 900, conflicts=False)
    manager = new_manager(target_range_entries=16)
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    calls = []
    real = RangeSink.write_now

    def failing(self, info, table):
        calls.append(info.id)
        if len(calls) == 3:
            raise OSError("disk full")
        real(self, info, table)

    monkeypatch.setattr(RangeSink, "write_now", failing)
    metaranges_before = manager.stats.metaranges_written
    with pytest.raises(OSError, match="disk full"):
        manager.merge_metaranges(namespace, b, s, d)
    assert manager.stats.metaranges_written == metaranges_before
    monkeypatch.setattr(RangeSink, "write_now", real)
    again = manager.merge_metaranges(namespace, b, s, d)
    _merged, summary, _conflicts, _more = naive_merge(base, source, dest, MergeStrategy.DEFAULT)
    assert again.summary == summary and again.metarange_id


def test_a_conflicting_merge_and_a_dry_run_write_no_range(new_manager, namespace, monkeypatch):
    """Ranges merged column-wise are written only once the merge has a result: a DEFAULT
    merge that finds a conflict elsewhere, and any dry run, leave no new file."""

    rng = random.Random(9)
    base, source, dest = _update_only_case(rng, 900, conflicts=True)
    _merged, _summary, conflicts, _more = naive_merge(base, source, dest, MergeStrategy.DEFAULT)
    assert conflicts
    manager = new_manager(target_range_entries=16)
    b, s, d = (write(manager, namespace, m) for m in (base, source, dest))
    ranges_dir = os.path.join(namespace, "_quarry", "ranges")
    before = sorted(os.listdir(ranges_dir))
    spy = Spy(monkeypatch)
    conflicted = manager.merge_metaranges(namespace, b, s, d)
    assert conflicted.metarange_id == "" and conflicted.conflicts
    assert spy.merged > 0  # pieces were merged column-wise before the walk met the conflict
    dry = manager.merge_metaranges(
        namespace, b, s, d, strategy=MergeStrategy.SOURCE_WINS, dry_run=True
    )
    assert dry.metarange_id == "" and dry.summary.total > 0
    assert sorted(os.listdir(ranges_dir)) == before
