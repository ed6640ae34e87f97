"""Every read and write in both states: with the uncommitted changes still in staging, and
with (some of) them folded into a compacted metarange. Results must be identical."""

import contextlib

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler.model import ChangeType, Entry
from quarry.graveler.staging import Dropper
from support.hammer import hammer


def entry(path, checksum="c1"):
    return Entry(path, f"data/{path}-{checksum}", 10, checksum)


def build(g, repo, compact_between: bool, compact_after: bool):
    """Committed: keep/1..3, gone/1..3, back, dir/x. Uncommitted, in two rounds: delete
    gone/* (tombstones over committed entries), change keep/1, add new/a; delete back, then
    re-add it; add only-staged."""
    g.put_objects(
        repo,
        "main",
        [entry(f"keep/{i}") for i in range(1, 4)]
        + [entry(f"gone/{i}") for i in range(1, 4)]
        + [entry("back"), entry("dir/x")],
    )
    g.commit(repo, "main", "base")
    g.delete_objects(repo, "main", ["gone/1", "gone/2", "gone/3", "back"])
    g.put_objects(repo, "main", [entry("keep/1", "v2"), entry("new/a")])
    if compact_between:
        g.compact(repo, "main")
    g.put_objects(repo, "main", [entry("back", "v3"), entry("only-staged")])
    if compact_after:
        g.compact(repo, "main")


STATES = {
    "staging only": (False, False),
    "compacted then staged": (True, False),
    "all compacted": (True, True),
    "compacted twice": (True, True),
}


@pytest.fixture(params=list(STATES))
def state(request, graveler, repo):
    between, after = STATES[request.param]
    build(graveler, repo, between, after)
    if request.param == "compacted twice":
        graveler.compact(repo, "main")  # nothing new: same compacted metarange
    return graveler, repo, request.param


EXPECTED = {
    "back": "v3",
    "dir/x": "c1",
    "keep/1": "v2",
    "keep/2": "c1",
    "keep/3": "c1",
    "new/a": "c1",
    "only-staged": "c1",
}


def listing(g, repo, ref="main", **kw):
    return {e.path: e.checksum for e in g.list_objects(repo, ref, page_size=1000, **kw)[0]}


def test_compaction_state_is_as_built(state):
    g, repo, name = state
    branch = g.get_branch(repo, "main")
    assert bool(branch.compacted_metarange_id) == (name != "staging only")
    if name in ("all compacted", "compacted twice"):
        assert list(branch.sealed_tokens) == [] and branch.dirty is False


def test_stat_and_list(state):
    g, repo, _ = state
    assert listing(g, repo) == EXPECTED
    for path, checksum in EXPECTED.items():
        assert g.stat_object(repo, "main", path).checksum == checksum
    for gone in ("gone/1", "gone/2"):
        with pytest.raises(gerrors.ObjectNotFound):
            g.stat_object(repo, "main", gone)
    entries, prefixes, _ = g.list_objects(repo, "main", delimiter="/")
    assert prefixes == ["dir/", "keep/", "new/"]  # gone/ holds only deletions
    pages, token = [], ""
    while True:
        page, _, token = g.list_objects(repo, "main", page_size=2, page_token=token)
        pages += [e.path for e in page]
        if not token:
            break
    assert pages == sorted(EXPECTED)
    assert listing(g, repo, "main@") == {f"keep/{i}": "c1" for i in range(1, 4)} | {
        f"gone/{i}": "c1" for i in range(1, 4)
    } | {"back": "c1", "dir/x": "c1"}


def test_diff_uncommitted(state):
    g, repo, _ = state
    changes = {c.path: c.type for c in g.diff_uncommitted(repo, "main", page_size=1000)[0]}
    assert changes == {
        "back": ChangeType.CHANGED,
        "gone/1": ChangeType.REMOVED,
        "gone/2": ChangeType.REMOVED,
        "gone/3": ChangeType.REMOVED,
        "keep/1": ChangeType.CHANGED,
        "new/a": ChangeType.ADDED,
        "only-staged": ChangeType.ADDED,
    }
    first, token = g.diff_uncommitted(repo, "main", page_size=3)
    second, token = g.diff_uncommitted(repo, "main", page_size=3, page_token=token)
    third, token = g.diff_uncommitted(repo, "main", page_size=3, page_token=token)
    assert [c.path for c in first + second + third] == sorted(changes) and token == ""
    assert [c.path for c in g.diff_uncommitted(repo, "main", prefix="gone/")[0]] == [
        "gone/1",
        "gone/2",
        "gone/3",
    ]


def test_deletes_decide_on_every_layer(state):
    g, repo, _ = state
    assert g.delete_objects(repo, "main", ["gone/1"]) == 0  # already deleted (compacted)
    assert g.delete_objects(repo, "main", ["new/a", "dir/x", "never"]) == 2
    assert "new/a" not in listing(g, repo) and "dir/x" not in listing(g, repo)


def test_readd_after_compacted_delete(state):
    g, repo, _ = state
    g.put_objects(repo, "main", [entry("gone/2", "again")])
    assert g.stat_object(repo, "main", "gone/2").checksum == "again"
    with pytest.raises(gerrors.ObjectExists):
        g.put_objects(repo, "main", [entry("new/a", "x")], if_absent=True)
    g.put_objects(repo, "main", [entry("gone/3", "if-absent")], if_absent=True)
    assert g.stat_object(repo, "main", "gone/3").checksum == "if-absent"


def test_discard_a_path_whose_change_may_live_in_the_compacted_metarange(state):
    g, repo, _ = state
    g.discard_changes(repo, "main", path="keep/1")
    g.discard_changes(repo, "main", path="gone/1")
    assert g.stat_object(repo, "main", "keep/1").checksum == "c1"
    assert g.stat_object(repo, "main", "gone/1").checksum == "c1"
    g.discard_changes(repo, "main", prefix="new/")
    assert "new/a" not in listing(g, repo)
    remaining = {c.path for c in g.diff_uncommitted(repo, "main")[0]}
    assert remaining == {"back", "gone/2", "gone/3", "only-staged"}
    g.discard_changes(repo, "main")
    branch = g.get_branch(repo, "main")
    assert branch.compacted_metarange_id == "" and g.diff_uncommitted(repo, "main")[0] == []


def test_commit_applies_onto_the_compacted_metarange_and_clears_it(state):
    g, repo, _ = state
    outcome = g.commit(repo, "main", "all")
    assert (outcome.summary.added, outcome.summary.removed, outcome.summary.changed) == (2, 3, 2)
    branch = g.get_branch(repo, "main")
    assert branch.compacted_metarange_id == "" and list(branch.sealed_tokens) == []
    assert listing(g, repo, "main@") == EXPECTED
    with pytest.raises(gerrors.NoChanges):
        g.commit(repo, "main", "again")


def test_reset_and_dirty_checks(state):
    g, repo, _ = state
    g.create_branch(repo, "side", "main")
    g.put_objects(repo, "side", [entry("s")])
    g.commit(repo, "side", "s")
    with pytest.raises(gerrors.DirtyBranch):
        g.merge(repo, "side", "main")
    with pytest.raises(gerrors.DirtyBranch):
        g.reset_branch(repo, "main", "main@")
    g.reset_branch(repo, "main", "main@", force=True)
    assert g.get_branch(repo, "main").compacted_metarange_id == ""
    assert "gone/1" in listing(g, repo)


def test_writers_readers_and_a_compactor_at_once(graveler, repo):
    g = graveler

    def put(path, version):
        g.put_objects(repo, "main", [Entry(path, f"{path}/{version}", version, f"v{version}")])

    def read(path):
        try:
            return int(g.stat_object(repo, "main", path).checksum[1:])
        except gerrors.ObjectNotFound:
            return None

    rounds = {"n": 0}

    def compact_or_commit():
        rounds["n"] += 1
        if rounds["n"] % 4 == 0:
            try:
                g.commit(repo, "main", "c")
            except gerrors.NoChanges:
                return False
        else:
            g.compact(repo, "main")
        return True

    dropper = Dropper(g.staging, interval_seconds=0.005, grace_seconds=0).start()
    try:
        result = hammer(
            put,
            read,
            compact_or_commit,
            writers=4,
            readers=3,
            committers=2,
            retryable=(gerrors.BranchContended,),
            min_writes=300,
            min_reads=150,
            min_commits=10,
        )
    finally:
        dropper.stop()
    assert not result.errors, result.errors[:5]
    assert not result.stale_reads, result.stale_reads[:5]
    for path, version in result.acked.items():
        assert read(path) == version, path
    with contextlib.suppress(gerrors.NoChanges):  # the last round committed everything
        g.commit(repo, "main", "final")
    for path, version in result.acked.items():
        assert g.stat_object(repo, "main@", path).checksum == f"v{version}"
