"""GC retention rules and the commits they keep (quarry.retention): pure functions, no
services and no Spark."""

from __future__ import annotations

import datetime as dt
import itertools
import json

import pytest

from quarry import errors
from quarry.blob.layout import METARANGES_PREFIX, RANGES_PREFIX
from quarry.retention import (
    COLLECTABLE,
    DEFAULT_RETENTION_DAYS,
    Classified,
    CommitNode,
    InvalidRetentionRules,
    RetentionRules,
    classify,
    retained_commits,
)
from support.foreign_files import FOREIGN_KEYS

NOW = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC)
# A Spark job's folder and a write UUID as Spark's writer names its files.
SPARK_JOB = "data/spark/20240501T120000-0123456789ab/"
SPARK_UUID = "8e025301-1de7-4f73-ac88-9ee76d72844d"


def ago(days: float) -> dt.datetime:
    return NOW - dt.timedelta(days=days)


def graph(*specs) -> dict[str, CommitNode]:
    """Commits from (id, parents, age in days), parents first. Generations follow lakeFS:
    1 + the highest generation of the parents (1 for a root)."""
    commits: dict[str, CommitNode] = {}
    for commit_id, parents, age in specs:
        generation = 1 + max((commits[p].generation for p in parents), default=0)
        commits[commit_id] = CommitNode(
            commit_id, tuple(parents), ago(age), generation, f"mr-{commit_id}"
        )
    return commits


def keep(commits, heads, tagged=(), rules=None, now=NOW) -> set[str]:
    return retained_commits(commits, heads, tagged, rules or RetentionRules(), now)


def orders(commits: dict[str, CommitNode]):
    """The same commits in several mapping orders (the result may not depend on it)."""
    items = list(commits.items())
    yield dict(items)
    yield dict(reversed(items))
    yield dict(sorted(items))
    yield dict(sorted(items, reverse=True))


# --- RetentionRules ------------------------------------------------------------------------


def test_rules_defaults():
    rules = RetentionRules()
    assert rules.default_retention_days == DEFAULT_RETENTION_DAYS == 21.0
    assert dict(rules.branch_retention_days) == {}
    assert rules.days_for("main") == 21.0


def test_days_for_uses_the_branch_override_else_the_default():
    rules = RetentionRules(7, {"main": 30, "release": 0})
    assert rules.days_for("main") == 30
    assert rules.days_for("release") == 0  # a 0 override is not "missing"
    assert rules.days_for("dev") == 7
    assert rules.days_for("Main") == 7  # branch names are case-sensitive


@pytest.mark.parametrize(
    "default, branches",
    [
        (-1, {}),
        (-0.001, {}),
        (21, {"main": -1}),
        (21, {"main": 3, "dev": -0.5}),
    ],
)
def test_negative_days_are_invalid(default, branches):
    with pytest.raises(InvalidRetentionRules) as info:
        RetentionRules(default, branches)
    assert info.value.reason == "INVALID_RETENTION_RULES"
    assert isinstance(info.value, errors.InvalidArgument)


@pytest.mark.parametrize(
    "default, branches",
    [
        ("7", {}),
        (None, {}),
        (7, {"main": "30"}),
        (True, {}),
        (float("nan"), {}),
        (float("inf"), {}),
        (1e12, {}),
        (7, {"main": 36501}),
    ],
)
def test_non_numeric_days_are_invalid(default, branches):
    with pytest.raises(InvalidRetentionRules):
        RetentionRules(default, branches)


def test_zero_days_are_valid():
    rules = RetentionRules(0, {"main": 0})
    assert rules.days_for("main") == 0 and rules.days_for("x") == 0


def test_from_json_lakefs_format():
    rules = RetentionRules.from_json(
        json.dumps(
            {
                "default_retention_days": 14,
                "branches": [
                    {"branch_id": "main", "retention_days": 28},
                    {"branch_id": "dev", "retention_days": 1.5},
                ],
            }
        )
    )
    assert rules.default_retention_days == 14.0
    assert dict(rules.branch_retention_days) == {"main": 28.0, "dev": 1.5}
    assert rules.days_for("main") == 28.0
    assert rules.days_for("dev") == 1.5
    assert rules.days_for("feature") == 14.0


@pytest.mark.parametrize("text", ["{}", '{"branches": []}'])
def test_from_json_missing_fields_take_the_defaults(text):
    rules = RetentionRules.from_json(text)
    assert rules == RetentionRules()
    assert rules.default_retention_days == DEFAULT_RETENTION_DAYS


def test_from_json_branches_without_default():
    rules = RetentionRules.from_json('{"branches": [{"branch_id": "main", "retention_days": 3}]}')
    assert rules.default_retention_days == DEFAULT_RETENTION_DAYS
    assert rules.days_for("main") == 3.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "{",
        "[]",
        '"rules"',
        "42",
        "null",
        '{"default_retention_days": "abc"}',
        '{"default_retention_days": null}',
        '{"default_retention_days": [1]}',
        '{"branches": 5}',
        '{"branches": null}',
        '{"branches": ["main"]}',
        '{"branches": [{"retention_days": 3}]}',
        '{"branches": [{"branch_id": "main"}]}',
        '{"branches": [{"branch_id": "main", "retention_days": "soon"}]}',
        '{"branches": [{"branch_id": "main", "retention_days": null}]}',
        '{"default_retention_days": -1}',
        '{"branches": [{"branch_id": "main", "retention_days": -2}]}',
    ],
)
def test_from_json_malformed(text):
    with pytest.raises(InvalidRetentionRules) as info:
        RetentionRules.from_json(text)
    assert info.value.reason == "INVALID_RETENTION_RULES"


@pytest.mark.parametrize(
    "rules",
    [
        RetentionRules(),
        RetentionRules(0),
        RetentionRules(7.5, {"main": 30, "dev": 0, "release-1.0": 365}),
    ],
)
def test_to_json_round_trip(rules):
    text = rules.to_json()
    again = RetentionRules.from_json(text)
    assert again == rules
    assert json.loads(again.to_json()) == json.loads(text)
    assert RetentionRules.from_json(again.to_json()).to_json() == again.to_json()


def test_to_json_is_the_lakefs_format_sorted_by_branch():
    doc = json.loads(RetentionRules(7, {"zeta": 1, "alpha": 30}).to_json())
    assert doc == {
        "default_retention_days": 7,
        "branches": [
            {"branch_id": "alpha", "retention_days": 30},
            {"branch_id": "zeta", "retention_days": 1},
        ],
    }


# --- retained_commits ----------------------------------------------------------------------


def test_linear_history_keeps_the_window_and_the_head():
    commits = graph(("c1", [], 40), ("c2", ["c1"], 25), ("c3", ["c2"], 10), ("c4", ["c3"], 2))
    for ordered in orders(commits):
        assert keep(ordered, {"main": "c4"}) == {"c3", "c4"}
    assert keep(commits, {"main": "c4"}, rules=RetentionRules(30)) == {"c2", "c3", "c4"}
    assert keep(commits, {"main": "c4"}, rules=RetentionRules(5)) == {"c4"}


def test_window_boundary_is_inclusive():
    commits = {
        "old": CommitNode("old", (), NOW - dt.timedelta(days=21, seconds=1), 1, "m"),
        "edge": CommitNode("edge", ("old",), NOW - dt.timedelta(days=21), 2, "m"),
        "head": CommitNode("head", ("edge",), NOW, 3, "m"),
    }
    assert keep(commits, {"main": "head"}) == {"edge", "head"}


def test_zero_days_keeps_only_the_head():
    commits = graph(("c1", [], 1 / 86400), ("c2", ["c1"], 0))
    assert keep(commits, {"main": "c2"}, rules=RetentionRules(0)) == {"c2"}


def test_head_older_than_the_window_is_still_kept():
    commits = graph(("c1", [], 90), ("c2", ["c1"], 60))
    assert keep(commits, {"main": "c2"}) == {"c2"}


def test_every_branch_head_is_kept():
    commits = graph(("root", [], 100), ("a", ["root"], 50), ("b", ["root"], 70))
    assert keep(commits, {"x": "a", "y": "b"}) == {"a", "b"}


def test_branch_override_keeps_more_history():
    # c1 is reachable from main (30 days) and from dev (default, 7 days).
    commits = graph(("c1", [], 20), ("m1", ["c1"], 10), ("d1", ["c1"], 1))
    heads = {"main": "m1", "dev": "d1"}
    assert keep(commits, heads, rules=RetentionRules(7, {"main": 30})) == {"c1", "m1", "d1"}
    assert keep(commits, heads, rules=RetentionRules(7)) == {"m1", "d1"}
    # The override only applies to its own branch.
    assert keep(commits, heads, rules=RetentionRules(7, {"other": 30})) == {"m1", "d1"}


def test_short_override_does_not_shorten_another_branch():
    # c1 is reachable from main (1 day) and from dev (default, 30 days): the longer wins.
    commits = graph(("c1", [], 20), ("m1", ["c1"], 0.5), ("d1", ["c1"], 0.5))
    heads = {"main": "m1", "dev": "d1"}
    assert "c1" in keep(commits, heads, rules=RetentionRules(30, {"main": 1}))
    assert "c1" not in keep(commits, {"main": "m1"}, rules=RetentionRules(30, {"main": 1}))


@pytest.mark.parametrize("heads", [{"short": "h", "long": "h"}, {"long": "h", "short": "h"}])
def test_two_branches_on_one_head_use_the_longer_window(heads):
    commits = graph(("p", [], 10), ("h", ["p"], 0))
    rules = RetentionRules(21, {"short": 1, "long": 30})
    assert keep(commits, heads, rules=rules) == {"p", "h"}
    assert keep(commits, {"short": "h"}, rules=rules) == {"h"}


def test_tag_keeps_exactly_the_tagged_commit():
    commits = graph(("c1", [], 100), ("c2", ["c1"], 90), ("c3", ["c2"], 1))
    assert keep(commits, {"main": "c3"}, tagged=["c2"]) == {"c2", "c3"}
    assert keep(commits, {"main": "c3"}) == {"c3"}


def test_tag_off_any_branch_keeps_the_tag_but_not_its_ancestors():
    commits = graph(
        ("c1", [], 100),
        ("t1", ["c1"], 1),  # only tagged, not on a branch
        ("main", [], 1),
    )
    kept = keep(commits, {"main": "main"}, tagged={"t1"})
    assert kept == {"t1", "main"}
    assert "c1" not in kept  # a tag gives no retention window to its history


def test_commit_reachable_from_no_branch_or_tag_is_not_kept():
    # "orphan" is recent, but nothing refers to it.
    commits = graph(("c1", [], 5), ("c2", ["c1"], 1), ("orphan", ["c1"], 0.1))
    kept = keep(commits, {"main": "c2"})
    assert kept == {"c1", "c2"}
    assert "orphan" not in kept


def test_no_heads_keeps_only_tags():
    commits = graph(("c1", [], 1), ("c2", ["c1"], 0))
    assert keep(commits, {}) == set()
    assert keep(commits, {}, tagged=["c1"]) == {"c1"}


def test_merge_second_parent_history_is_kept_on_a_long_window():
    # main: a (80d) <- merge (5d); the merged feature: a <- f1 (45d) <- f2 (44d).
    # f1 and f2 are only on main through the merge's SECOND parent.
    commits = graph(("a", [], 80), ("f1", ["a"], 45), ("f2", ["f1"], 44), ("merge", ["a", "f2"], 5))
    rules = RetentionRules(7, {"main": 60})
    for ordered in orders(commits):
        assert keep(ordered, {"main": "merge"}, rules=rules) == {"merge", "f2", "f1"}
    assert keep(commits, {"main": "merge"}, rules=RetentionRules(7)) == {"merge"}
    # A short-window branch still pointing at the feature does not shorten main's window.
    assert keep(commits, {"main": "merge", "feature": "f2"}, rules=rules) == {"merge", "f2", "f1"}


def test_merge_first_parent_history_is_kept_too():
    commits = graph(("a", [], 80), ("m1", ["a"], 45), ("f1", ["a"], 3), ("merge", ["m1", "f1"], 2))
    assert keep(commits, {"main": "merge"}, rules=RetentionRules(60)) == {"merge", "m1", "f1"}


def _long_path_graph(b_path_ages):
    """x is the parent of A's head directly, and of B's head through a path of 3 commits.
    w and v are x's ancestors."""
    b1, b2, b3 = b_path_ages
    return graph(
        ("v", [], 40),
        ("w", ["v"], 20),
        ("x", ["w"], 10),
        ("a1", ["x"], 0.5),
        ("b1", ["x"], b1),
        ("b2", ["b1"], b2),
        ("b3", ["b2"], b3),
    )


@pytest.mark.parametrize(
    "b_path_ages",
    [
        (0.4, 0.3, 0.2),  # ordinary times
        (12, 11, 0.2),  # clock skew: b1 and b2 claim to be older than their parent x
    ],
)
def test_earliest_cutoff_reaches_a_commit_through_the_longer_path(b_path_ages):
    """x is 1 hop from A's head (1-day window) and 3 hops from B's head (30 days). It must
    get B's cutoff although A reaches it first, and pass it on to its own ancestors."""
    commits = _long_path_graph(b_path_ages)
    rules = RetentionRules(21, {"A": 1, "B": 30})
    heads = {"A": "a1", "B": "b3"}
    expected = {"a1", "b1", "b2", "b3", "x", "w"}
    for ordered in orders(commits):
        for head_order in (heads, dict(reversed(list(heads.items())))):
            assert keep(ordered, head_order, rules=rules) == expected
    # Without B, only A's 1-day window applies.
    assert keep(commits, {"A": "a1"}, rules=rules) == {"a1"}


def test_every_mapping_order_gives_the_same_answer():
    commits = _long_path_graph((12, 11, 0.2))
    rules = RetentionRules(21, {"A": 1, "B": 30})
    results = {
        frozenset(keep(dict(perm), {"A": "a1", "B": "b3"}, rules=rules))
        for perm in itertools.islice(itertools.permutations(commits.items()), 0, None, 97)
    }
    assert results == {frozenset({"a1", "b1", "b2", "b3", "x", "w"})}


def test_criss_cross_merges():
    # r <- x1, r <- y1; A's head merges (x1, y1), B's head merges (y1, x1).
    commits = graph(
        ("r", [], 40),
        ("x1", ["r"], 25),
        ("y1", ["r"], 25),
        ("x2", ["x1", "y1"], 3),
        ("y2", ["y1", "x1"], 3),
    )
    heads = {"A": "x2", "B": "y2"}
    assert keep(commits, heads, rules=RetentionRules(21, {"A": 1, "B": 30})) == {
        "x2",
        "y2",
        "x1",
        "y1",
    }
    assert keep(commits, heads, rules=RetentionRules(21, {"A": 1, "B": 50})) == {
        "x2",
        "y2",
        "x1",
        "y1",
        "r",
    }
    assert keep(commits, heads, rules=RetentionRules(21, {"A": 1, "B": 2})) == {"x2", "y2"}


def test_diamond_keeps_both_sides_and_the_base_in_the_window():
    commits = graph(
        ("base", [], 9),
        ("left", ["base"], 8),
        ("right", ["base"], 30),
        ("top", ["left", "right"], 1),
    )
    assert keep(commits, {"main": "top"}, rules=RetentionRules(10)) == {"top", "left", "base"}


def test_old_commit_does_not_stop_the_walk():
    # An old commit between recent ones (clock skew): its recent ancestor stays kept.
    commits = graph(("c1", [], 2), ("c2", ["c1"], 50), ("c3", ["c2"], 1))
    assert keep(commits, {"main": "c3"}) == {"c1", "c3"}


# --- classify ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, expected",
    [
        (f"{RANGES_PREFIX}{'ab' * 32}.parquet", Classified("range", "ab" * 32)),
        (f"{METARANGES_PREFIX}{'0f' * 32}.parquet", Classified("metarange", "0f" * 32)),
        # only content ids (64 lower-case hex) are Quarry's files; anything else is left alone
        (f"{RANGES_PREFIX}abc123.parquet", Classified("internal")),
        ("_quarry/ranges/r.1.parquet", Classified("internal")),
        ("_quarry/ranges/.parquet", Classified("internal")),
        (f"{RANGES_PREFIX}{'AB' * 32}.parquet", Classified("internal")),
        # nested or not parquet under the range prefixes: internal, never collected
        (f"{RANGES_PREFIX}nested/abc.parquet", Classified("internal")),
        (f"{METARANGES_PREFIX}a/b/c.parquet", Classified("internal")),
        (f"{RANGES_PREFIX}abc.json", Classified("internal")),
        (f"{RANGES_PREFIX}abc.parquet.tmp", Classified("internal")),
        (f"{METARANGES_PREFIX}abc", Classified("internal")),
        ("_quarry/gc/reports/x.json", Classified("internal")),
        ("_quarry/anything", Classified("internal")),
        ("_quarry/", Classified("internal")),
        # Quarry's own data layout: upload data and Spark job files, exactly as written
        ("data/" + "0123456789abcdef" * 2, Classified("data")),
        (
            "data/spark/20240501T120000-0123456789ab/part-00003-c001-t42.snappy.parquet",
            Classified("data"),
        ),
        ("data/spark/20240501T120000-0123456789ab/part-00003-c001-t42.csv", Classified("data")),
        # ... and Spark's writer's: committed, in hidden partition folders, task attempts'
        (f"{SPARK_JOB}part-00003-{SPARK_UUID}-c001.snappy.parquet", Classified("data")),
        (
            f"{SPARK_JOB}__quarry_partition_0=a%2Fb/__quarry_partition_1=1/"
            f"part-00003-{SPARK_UUID}.c000.snappy.parquet",
            Classified("data"),
        ),
        (
            f"{SPARK_JOB}_temporary/0/_temporary/attempt_202611261350012345_0004_m_000003_7/"
            f"part-00003-{SPARK_UUID}-c000.snappy.parquet",
            Classified("data"),
        ),
        (
            f"{SPARK_JOB}_temporary/0/task_202611261350012345_0004_m_000003/"
            f"__quarry_partition_0=1/part-00003-{SPARK_UUID}.c000.snappy.parquet",
            Classified("data"),
        ),
        # (not what Quarry's Spark writer leaves: marker, checksum, foreign folder or format)
        (f"{SPARK_JOB}_SUCCESS", Classified("foreign")),
        (f"{SPARK_JOB}.part-00003-{SPARK_UUID}-c001.snappy.parquet.crc", Classified("foreign")),
        (f"{SPARK_JOB}k=1/part-00003-{SPARK_UUID}.c000.snappy.parquet", Classified("foreign")),
        (f"{SPARK_JOB}part-00003-{SPARK_UUID}-c001.csv", Classified("foreign")),
        (
            f"{SPARK_JOB}_temporary/x/part-00003-{SPARK_UUID}-c001.snappy.parquet",
            Classified("foreign"),
        ),
        # everything else is foreign (ISSUE 10: GC never deletes a file Quarry did not write)
        ("data/spark/job/part-00000.parquet", Classified("foreign")),
        ("tables/t1/x.parquet", Classified("foreign")),
        ("abc.parquet", Classified("foreign")),
        ("_quarry", Classified("foreign")),
        ("_quarryx/ranges/a.parquet", Classified("foreign")),
        ("data/_quarry/ranges/a.parquet", Classified("foreign")),
        ("_Quarry/ranges/a.parquet", Classified("foreign")),
    ],
)
def test_classify(key, expected):
    assert classify(key) == expected


def test_foreign_files_are_never_collectable():
    for key in FOREIGN_KEYS:
        assert classify(key).kind not in COLLECTABLE, key


def test_the_keys_quarry_writes_are_collectable():
    """The patterns match what the generators really produce (not a copy of their shape)."""
    import uuid

    from quarry.cli.upload import DATA_PREFIX
    from quarry.spark.common import Connection, new_job_id
    from quarry.spark.executor import FORMATS, WriteSpec, file_key

    assert classify(f"{DATA_PREFIX}{uuid.uuid4().hex}").kind == "data"
    for fmt in FORMATS:
        spec = WriteSpec(
            Connection("a:1", "b:2"), "repo", "br", "/ns", "t/", new_job_id(), format=fmt
        )
        assert classify(file_key(spec, 123456, 1234, 7)).kind == "data"
        assert classify(file_key(spec, 0, 0, 0)).kind == "data"
