"""The committed-storage contract as an importable suite (like lakeFS pkg/kv/kvtest): every
implementation graveler may be given must pass it. tests/integration/committed/
test_committed_contract.py runs it for the dict-backed fake of the unit tests
(tests/support/fake_committed.py), the in-process CommittedManager, and the remote
range-writer client (RemoteRangeWriter against a real range-writer server on loopback). The
fake cannot drift from the real ones: what it accepts, they accept.

A new implementation runs it by subclassing CommittedContract with SUPPORTS and a `committed`
fixture. Each implementation declares what it supports beyond the common contract
(SUPPORTS); a test that needs more names it with @needs(...) and is generated only for the
implementations that declare it (nothing is skipped at run time):

    ranges        get_metarange lists the ranges (ids, key bounds, counts)
    range_reuse   ApplyResult counts ranges written and reused (the fake has no ranges)
    pages         one page of get_metarange at a time, resumed by token

Namespaces are local directories (the Implementation's `namespace`, a path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from quarry import errors
from quarry.blob import LocalBlobStore
from quarry.blob.ownership import MARKER_KEY
from quarry.committed import (
    DuplicatePath,
    InvalidMetaRangeId,
    MetaRangeNotFound,
    UnsortedInput,
)
from quarry.graveler.model import Change, ChangeType, Conflict, Entry, MergeStrategy, RangeInfo


@dataclass
class Implementation:
    """One committed storage under test: `writer` writes (and claims, merges, lists ranges),
    `reader` reads (get_entry, iterate, diff); `page(namespace, metarange_id, page_size,
    token)` returns one page of ranges and the next token (with "pages")."""

    name: str
    writer: Any
    reader: Any
    namespace: str
    page: Callable[[str, str, int, str], tuple[list[RangeInfo], str]] | None = None


def needs(*capabilities: str) -> Callable:
    """Run the test only against implementations that declare every capability."""

    def mark(test: Callable) -> Callable:
        test.needs = frozenset(capabilities)  # type: ignore[attr-defined]  # read by the class
        return test

    return mark


def entry(path: str, version: int = 0, *, mtime_us: int | None = None) -> Entry:
    return Entry(
        path,
        f"s3://lake/{path}#{version}",
        100 + version,
        f"etag-{version}",
        1_700_000_000_000_000 + version if mtime_us is None else mtime_us,
        "application/octet-stream",
        {"v": str(version)},
    )


def entries(paths) -> list[Entry]:
    return [entry(path) for path in paths]


def listed(committed: Implementation, metarange_id: str, **kwargs) -> list[Entry]:
    return list(committed.reader.iterate(committed.namespace, metarange_id, **kwargs))


def write(committed: Implementation, items: list[Entry]) -> str:
    return committed.writer.write_metarange(committed.namespace, iter(items)).metarange_id


# ---- merge_metaranges -------------------------------------------------------------------------


def _three(committed: Implementation) -> tuple[str, str, str]:
    """base: m/000..m/039; source changes m/005 and adds m/0105, removes m/030; destination
    changes m/020 and removes m/035 (no conflict)."""
    base_items = {e.path: e for e in entries(f"m/{i:03d}" for i in range(40))}
    source = dict(base_items)
    source["m/005"] = entry("m/005", 1)
    source["m/0105"] = entry("m/0105")
    del source["m/030"]
    destination = dict(base_items)
    destination["m/020"] = entry("m/020", 2)
    del destination["m/035"]
    base, ours, theirs = (
        write(committed, [items[p] for p in sorted(items)])
        for items in (base_items, source, destination)
    )
    return base, ours, theirs


def _conflicting(committed: Implementation) -> tuple[str, str, str]:
    """Both sides change x/001..x/003 differently; the source also adds x/100."""
    base_items = entries(f"x/{i:03d}" for i in range(12))
    source = {e.path: e for e in base_items}
    destination = dict(source)
    for i in (1, 2, 3):
        source[f"x/{i:03d}"] = entry(f"x/{i:03d}", 1)
        destination[f"x/{i:03d}"] = entry(f"x/{i:03d}", 2)
    source["x/100"] = entry("x/100")
    return (
        write(committed, base_items),
        write(committed, [source[p] for p in sorted(source)]),
        write(committed, [destination[p] for p in sorted(destination)]),
    )


class CommittedContract:
    """The committed-storage contract. Subclass it as `Test...` in a test module, name the
    implementations and what each supports beyond the common contract in SUPPORTS, and give
    it a `committed` fixture that yields the Implementation for `request.param` (one of
    SUPPORTS' names)."""

    # Implementation name -> what it supports beyond the common contract (see the module).
    SUPPORTS: ClassVar[dict[str, frozenset[str]]] = {}

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Each test runs for the implementations that declare what it @needs."""
        if "committed" in metafunc.fixturenames:
            wanted: frozenset[str] = getattr(metafunc.function, "needs", frozenset())
            names = [name for name, supports in self.SUPPORTS.items() if wanted <= supports]
            metafunc.parametrize("committed", names, indirect=True)

    # ---- write_metarange, get_entry, iterate ----------------------------------------------------

    def test_write_metarange_then_read_back(self, committed):
        ns = committed.namespace
        items = entries(f"data/{i:04d}" for i in range(100))
        result = committed.writer.write_metarange(ns, iter(items))
        assert result.summary.added == 100
        assert listed(committed, result.metarange_id) == items
        reader = committed.reader
        assert reader.get_entry(ns, result.metarange_id, "data/0042") == items[42]
        for missing in ("data/", "data/00425", "zzz", "a"):
            assert reader.get_entry(ns, result.metarange_id, missing) is None

    def test_the_same_entries_give_the_same_id_and_any_difference_another(self, committed):
        items = entries(f"k/{i:03d}" for i in range(30))
        first = write(committed, items)
        assert write(committed, list(items)) == first
        readdressed = list(items)
        readdressed[7] = Entry(
            items[7].path,
            "s3://elsewhere/x",
            items[7].size_bytes,
            items[7].checksum,
            items[7].mtime_us,
            items[7].content_type,
            items[7].metadata,
        )
        touched = list(items)
        touched[7] = entry(items[7].path, mtime_us=items[7].mtime_us + 1)  # mtime only
        ids = {
            first,
            write(committed, readdressed),
            write(committed, touched),
            write(committed, items[:-1]),
        }
        assert len(ids) == 4

    def test_an_empty_write_reads_as_empty(self, committed):
        empty = write(committed, [])
        assert listed(committed, empty) == []
        assert listed(committed, "") == []
        assert committed.reader.get_entry(committed.namespace, empty, "a") is None

    def test_writes_refuse_unsorted_and_duplicate_paths(self, committed):
        ns = committed.namespace
        with pytest.raises(UnsortedInput) as unsorted:
            committed.writer.write_metarange(ns, iter(entries(["b", "a"])))
        assert not isinstance(unsorted.value, DuplicatePath)
        assert isinstance(unsorted.value, errors.InvalidArgument)
        with pytest.raises(DuplicatePath):
            committed.writer.write_metarange(ns, iter(entries(["a", "b", "b"])))
        base = write(committed, entries(["a", "c"]))
        with pytest.raises(UnsortedInput):
            committed.writer.apply_changes(ns, base, [("d", entry("d")), ("b", entry("b"))])
        with pytest.raises(DuplicatePath):
            committed.writer.apply_changes(ns, base, [("b", entry("b")), ("b", None)])
        assert listed(committed, base) == entries(["a", "c"])  # never half-applied

    def test_iterate_from_a_start_within_a_prefix_and_seek(self, committed):
        paths = [f"{top}/{i:03d}" for top in ("a", "b", "c") for i in range(20)]
        mr = write(committed, entries(paths))
        assert [e.path for e in listed(committed, mr, start="b/015")] == paths[35:]
        assert [e.path for e in listed(committed, mr, prefix="b/")] == paths[20:40]
        assert [e.path for e in listed(committed, mr, start="b/015", prefix="b/")] == paths[35:40]
        assert [e.path for e in listed(committed, mr, start="a/005", prefix="b/")] == paths[20:40]
        assert listed(committed, mr, prefix="d/") == []
        iterator = committed.reader.iterate(committed.namespace, mr, prefix="c/")
        assert next(iterator).path == "c/000"
        iterator.seek_ge("c/010")
        assert [e.path for e in iterator] == paths[50:60]
        iterator.seek_ge("b/000")  # never before the prefix
        assert next(iterator).path == "c/000"

    # ---- apply_changes ----------------------------------------------------------------------------

    def test_apply_changes_counts_only_real_changes(self, committed):
        ns = committed.namespace
        base_items = entries(f"p/{i:03d}" for i in range(0, 60, 2))
        base = write(committed, base_items)
        same_identity = entry("p/010", mtime_us=5)  # only the mtime differs: not a change
        changes = [
            ("p/001", entry("p/001")),  # added
            ("p/004", entry("p/004", 1)),  # changed
            ("p/007", None),  # deleting a missing path: nothing
            ("p/010", same_identity),
            ("p/020", None),  # removed
            ("q/000", entry("q/000")),
        ]  # added past the last entry
        result = committed.writer.apply_changes(ns, base, iter(changes))
        summary = result.summary
        assert (summary.added, summary.removed, summary.changed) == (2, 1, 1)
        expected = {e.path: e for e in base_items}
        expected.update(
            {"p/001": entry("p/001"), "p/004": entry("p/004", 1), "q/000": entry("q/000")}
        )
        del expected["p/020"]
        assert listed(committed, result.metarange_id) == [expected[p] for p in sorted(expected)]
        kept = committed.reader.get_entry(ns, result.metarange_id, "p/010")
        assert kept.mtime_us == base_items[5].mtime_us  # the base entry is kept

    def test_apply_with_no_real_change_returns_the_base(self, committed):
        base = write(committed, entries(f"n/{i:02d}" for i in range(20)))
        result = committed.writer.apply_changes(
            committed.namespace,
            base,
            [("n/000", None), ("n/05", entry("n/05", mtime_us=1)), ("n/051", None)],
        )
        assert result.summary.total == 0
        assert result.metarange_id == base

    def test_apply_takes_change_objects_and_an_empty_base(self, committed):
        ns = committed.namespace
        result = committed.writer.apply_changes(
            ns,
            "",
            [
                Change(ChangeType.ADDED, "a", entry("a")),
                Change(ChangeType.REMOVED, "b"),
                Change(ChangeType.CHANGED, "c", entry("c", 2)),
            ],
        )
        assert (result.summary.added, result.summary.removed) == (2, 0)
        assert listed(committed, result.metarange_id) == [entry("a"), entry("c", 2)]

    def test_unknown_and_invalid_metarange_ids_are_refused(self, committed):
        ns = committed.namespace
        unknown = "f" * 64
        with pytest.raises(MetaRangeNotFound):
            committed.reader.get_entry(ns, unknown, "a")
        with pytest.raises(MetaRangeNotFound):
            committed.writer.apply_changes(ns, unknown, [("a", entry("a"))])
        with pytest.raises(InvalidMetaRangeId):
            committed.reader.get_entry(ns, "not-an-id", "a")
        with pytest.raises(MetaRangeNotFound):
            list(committed.reader.diff(ns, "", unknown))

    # ---- diff -------------------------------------------------------------------------------------

    def test_diff_by_path_and_identity(self, committed):
        ns = committed.namespace
        left_items = entries(f"d/{i:03d}" for i in range(40))
        right_items = {e.path: e for e in left_items}
        del right_items["d/003"]
        right_items["d/010"] = entry("d/010", 1)
        right_items["d/020"] = entry("d/020", mtime_us=7)  # mtime only: not a change
        right_items["d/0305"] = entry("d/0305")
        right_items["e/000"] = entry("e/000")
        left = write(committed, left_items)
        right = write(committed, [right_items[p] for p in sorted(right_items)])
        changes = list(committed.reader.diff(ns, left, right))
        assert [(c.type, c.path, c.entry) for c in changes] == [
            (ChangeType.REMOVED, "d/003", None),
            (ChangeType.CHANGED, "d/010", entry("d/010", 1)),
            (ChangeType.ADDED, "d/0305", entry("d/0305")),
            (ChangeType.ADDED, "e/000", entry("e/000")),
        ]
        assert [c.path for c in committed.reader.diff(ns, left, right, prefix="e/")] == ["e/000"]
        assert [c.path for c in committed.reader.diff(ns, left, right, start="d/011")] == [
            "d/0305",
            "e/000",
        ]
        assert [c.path for c in committed.reader.diff(ns, right, left)] == [
            "d/003",
            "d/010",
            "d/0305",
            "e/000",
        ]
        assert list(committed.reader.diff(ns, left, left)) == []

    def test_merge_takes_both_sides_changes(self, committed):
        base, source, destination = _three(committed)
        result = committed.writer.merge_metaranges(committed.namespace, base, source, destination)
        assert result.conflicts == () and result.more_conflicts == 0
        summary = result.summary
        assert (summary.added, summary.removed, summary.changed) == (1, 1, 1)
        merged = {e.path: e for e in listed(committed, result.metarange_id)}
        assert merged["m/005"] == entry("m/005", 1) and merged["m/020"] == entry("m/020", 2)
        assert "m/0105" in merged and "m/030" not in merged and "m/035" not in merged
        assert len(merged) == 39

    def test_merge_shortcuts(self, committed):
        base, source, destination = _three(committed)
        ns = committed.namespace
        nothing = committed.writer.merge_metaranges(ns, base, base, destination)
        assert nothing.metarange_id == destination and nothing.summary.total == 0
        fast_forward = committed.writer.merge_metaranges(ns, base, source, base)
        assert fast_forward.metarange_id == source
        assert (
            fast_forward.summary.added,
            fast_forward.summary.removed,
            fast_forward.summary.changed,
        ) == (1, 1, 1)

    def test_merge_conflicts_and_strategies(self, committed):
        ns = committed.namespace
        base, source, destination = _conflicting(committed)
        merge = committed.writer.merge_metaranges
        conflicted = merge(ns, base, source, destination)
        assert conflicted.metarange_id == ""  # DEFAULT with conflicts writes nothing
        assert conflicted.conflicts == tuple(
            Conflict(
                f"x/{i:03d}", entry(f"x/{i:03d}"), entry(f"x/{i:03d}", 1), entry(f"x/{i:03d}", 2)
            )
            for i in (1, 2, 3)
        )
        bounded = merge(ns, base, source, destination, max_conflicts=1)
        assert len(bounded.conflicts) == 1 and bounded.more_conflicts == 2
        source_wins = merge(ns, base, source, destination, strategy=MergeStrategy.SOURCE_WINS)
        assert source_wins.conflicts == ()
        won = {e.path: e for e in listed(committed, source_wins.metarange_id)}
        assert [won[f"x/{i:03d}"] for i in (1, 2, 3)] == [entry(f"x/{i:03d}", 1) for i in (1, 2, 3)]
        assert "x/100" in won
        assert (source_wins.summary.added, source_wins.summary.changed) == (1, 3)
        dest_wins = merge(ns, base, source, destination, strategy=MergeStrategy.DEST_WINS)
        kept = {e.path: e for e in listed(committed, dest_wins.metarange_id)}
        assert [kept[f"x/{i:03d}"] for i in (1, 2, 3)] == [
            entry(f"x/{i:03d}", 2) for i in (1, 2, 3)
        ]
        assert "x/100" in kept and dest_wins.summary.added == 1
        dry = merge(ns, base, source, destination, strategy=MergeStrategy.SOURCE_WINS, dry_run=True)
        assert dry.metarange_id == "" and dry.summary == source_wins.summary

    def test_merge_refuses_bad_arguments(self, committed):
        ns = committed.namespace
        base = write(committed, entries(["a"]))
        with pytest.raises(errors.InvalidArgument):
            committed.writer.merge_metaranges(ns, base, base, base, max_conflicts=-1)
        with pytest.raises(MetaRangeNotFound):
            committed.writer.merge_metaranges(ns, base, "f" * 64, base)

    # ---- namespace ownership ----------------------------------------------------------------------

    def test_claim_namespace(self, committed):
        ns = committed.namespace
        claim = committed.writer.claim_namespace
        first = claim(ns, b"marker-one")
        assert first.claimed and first.existing_marker is None
        second = claim(ns, b"marker-two")
        assert not second.claimed and second.existing_marker == b"marker-one"
        wrong = claim(ns, b"marker-two", b"not-it")
        assert not wrong.claimed
        assert claim(ns, b"marker-two", b"marker-one").claimed
        assert LocalBlobStore(ns).get(MARKER_KEY) == b"marker-two"

    def test_claim_leaves_a_used_namespace_alone(self, committed, tmp_path):
        used = tmp_path / "used"
        (used / "someone").mkdir(parents=True)
        (used / "someone" / "data.parquet").write_bytes(b"not ours")
        claim = committed.writer.claim_namespace(str(used), b"marker")
        assert not claim.claimed and claim.keys == ("someone/data.parquet",)
        assert not LocalBlobStore(str(used)).exists(MARKER_KEY)

    # ---- beyond the fake: ranges --------------------------------------------------------------

    @needs("ranges")
    def test_get_metarange_lists_disjoint_ranges_in_key_order(self, committed):
        ns = committed.namespace
        paths = [f"r/{i:04d}" for i in range(200)]
        mr = write(committed, entries(paths))
        ranges = committed.writer.get_metarange(ns, mr)
        assert len(ranges) > 5
        assert sum(r.count for r in ranges) == 200
        assert ranges[0].min_key == paths[0] and ranges[-1].max_key == paths[-1]
        for earlier, later in zip(ranges, ranges[1:], strict=False):
            assert earlier.min_key <= earlier.max_key < later.min_key
        assert committed.writer.get_metarange(ns, "") == []

    @needs("ranges", "range_reuse")
    def test_one_change_rewrites_at_most_two_ranges(self, committed):
        ns = committed.namespace
        mr = write(committed, entries(f"r/{i:04d}" for i in range(400)))
        total = len(committed.writer.get_metarange(ns, mr))
        result = committed.writer.apply_changes(ns, mr, [("r/0200", entry("r/0200", 1))])
        assert result.ranges_written <= 2 and result.ranges_reused >= total - 2

    @needs("pages")
    def test_metarange_pages_resume_to_the_whole_list(self, committed):
        ns = committed.namespace
        mr = write(committed, entries(f"g/{i:04d}" for i in range(120)))
        whole = committed.writer.get_metarange(ns, mr)
        pages, token = [], ""
        while True:
            page, token = committed.page(ns, mr, 3, token)
            assert 0 < len(page) <= 3
            pages.extend(page)
            if not token:
                break
        assert pages == whole
        other = write(committed, entries(["other"]))
        _first, token = committed.page(ns, mr, 1, "")
        with pytest.raises(errors.InvalidArgument):
            committed.page(ns, other, 1, token)  # a token belongs to its metarange
