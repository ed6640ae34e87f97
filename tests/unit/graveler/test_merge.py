"""Merge, revert, cherry-pick, merge bases and three-dot diffs in the core (fake committed
store; the real range-level merge is tested in tests/unit/committed and end to end)."""

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler.model import ChangeType, MergeStrategy
from quarry.kv import store as kv
from support.histories import entry, put_commit


def content(g, repo, ref):
    return {e.path: e.checksum for e in g.list_objects(repo, ref, page_size=1000)[0]}


@pytest.fixture
def forked(graveler, repo):
    put_commit(graveler, repo, "main", {"a": "1", "b": "1", "c": "1"})
    graveler.create_branch(repo, "feature", "main")
    return graveler, repo


def test_merge_combines_both_sides(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "2", "d": "1"})
    put_commit(g, repo, "main", {"b": "2", "c": None})
    outcome = g.merge(repo, "feature", "main", committer="me")
    assert content(g, repo, "main") == {"a": "2", "b": "2", "d": "1"}
    assert (outcome.summary.added, outcome.summary.changed) == (1, 1)
    main_head = g.get_commit(repo, "main")
    assert list(main_head.parents) == [
        g.get_commit(repo, "main~1").id,
        g.get_commit(repo, "feature").id,
    ]
    assert main_head.metadata["quarry.merge.strategy"] == "default"
    assert main_head.metadata["quarry.merge.base"] == outcome.base_commit_id
    # Merging again: the source is now an ancestor of the destination.
    with pytest.raises(gerrors.NoChanges):
        g.merge(repo, "feature", "main")


def test_fast_forward_like_merge_takes_the_source_content(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"x": "1"})
    g.merge(repo, "feature", "main")
    assert content(g, repo, "main") == content(g, repo, "feature")


def test_conflicts_are_listed_and_nothing_changes(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "feature", "b": None})
    put_commit(g, repo, "main", {"a": "main", "b": "main"})
    before = g.get_branch(repo, "main")
    with pytest.raises(gerrors.MergeConflict) as caught:
        g.merge(repo, "feature", "main")
    detail = caught.value.details[0]
    assert [c.path for c in detail.conflicts] == ["a", "b"]
    b = detail.conflicts[1]
    assert not b.HasField("source") and b.destination.checksum == "main"
    assert g.get_branch(repo, "main") == before
    dry = g.merge(repo, "feature", "main", dry_run=True)
    assert [c.path for c in dry.conflicts] == ["a", "b"] and dry.commit is None
    g.merge(repo, "feature", "main", strategy=MergeStrategy.SOURCE_WINS)
    assert content(g, repo, "main") == {"a": "feature", "c": "1"}


def test_dest_wins_and_identical_changes(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "same", "b": "feature", "n": "1"})
    put_commit(g, repo, "main", {"a": "same", "b": "main"})
    g.merge(repo, "feature", "main", strategy=MergeStrategy.DEST_WINS)
    assert content(g, repo, "main") == {"a": "same", "b": "main", "c": "1", "n": "1"}


def test_squash_has_one_parent(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"s": "1"})
    outcome = g.merge(repo, "feature", "main", squash=True)
    assert len(outcome.commit.parents) == 1
    assert outcome.commit.metadata["quarry.merge.source"] == g.get_commit(repo, "feature").id


def test_dry_run_writes_no_commit(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"z": "1"})
    head = g.get_branch(repo, "main").commit_id
    outcome = g.merge(repo, "feature", "main", dry_run=True)
    assert outcome.commit is None and outcome.summary.added == 1
    assert g.get_branch(repo, "main").commit_id == head


def test_destination_must_be_clean(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"z": "1"})
    g.put_objects(repo, "main", [entry("staged")])
    with pytest.raises(gerrors.DirtyBranch):
        g.merge(repo, "feature", "main")


def test_clean_destination_check_does_not_scan_staging(forked, kv_store):
    g, repo = forked
    put_commit(g, repo, "feature", {"z": "1"})
    kv_store.reset()
    g.merge(repo, "feature", "main")
    assert kv_store.total(cls="staging") == 0


def _race_merges(g, repo, monkeypatch, times):
    """Make another commit land on main right before each of our merge's swaps."""
    real_set = g.refs.set_branch_if
    state = {"left": times, "busy": False}

    def racing_set(repo_, branch, predicate):
        is_our_merge = (
            branch.name == "main"
            and isinstance(predicate, kv.Equals)
            and "quarry.merge.source" in g.refs.get_commit(repo_, branch.commit_id).metadata
        )
        if is_our_merge and state["left"] and not state["busy"]:
            state["left"] -= 1
            state["busy"] = True
            try:
                put_commit(g, repo, "main", {f"race{state['left']}": "1"}, "racer")
            finally:
                state["busy"] = False
        return real_set(repo_, branch, predicate)

    monkeypatch.setattr(g.refs, "set_branch_if", racing_set)
    return real_set


def test_retry_reuses_the_merged_metarange_when_head_moves(forked, committed, monkeypatch):
    g, repo = forked
    put_commit(g, repo, "feature", {"f": "1"})
    _race_merges(g, repo, monkeypatch, 2)
    calls = []
    real_merge = committed.merge_metaranges

    def spy(namespace, base, source, destination, **kw):
        calls.append((base, source, destination))
        return real_merge(namespace, base, source, destination, **kw)

    monkeypatch.setattr(committed, "merge_metaranges", spy)
    outcome = g.merge(repo, "feature", "main")
    assert outcome.attempts == 3
    assert content(g, repo, "main") == {
        "a": "1",
        "b": "1",
        "c": "1",
        "f": "1",
        "race0": "1",
        "race1": "1",
    }
    feature_metarange = g.get_commit(repo, "feature").metarange_id
    assert calls[0][1] == feature_metarange
    # Each retry merged the previous attempt's result (source) from the HEAD it was merged
    # onto (base) onto the new HEAD (destination).
    for before, after in zip(calls, calls[1:], strict=False):
        assert after[0] == before[2]
        assert after[2] != before[2]  # the new HEAD


def test_head_moved_every_time_returns_a_hint_that_resumes(forked, monkeypatch):
    g, repo = forked
    put_commit(g, repo, "feature", {"f": "1"})
    real_set = _race_merges(g, repo, monkeypatch, 99)
    with pytest.raises(gerrors.HeadMoved) as caught:
        g.merge(repo, "feature", "main")
    hint = caught.value.details[0].hint_metarange_id
    assert hint and caught.value.metadata["hint_metarange_id"] == hint
    monkeypatch.setattr(g.refs, "set_branch_if", real_set)
    outcome = g.merge(repo, "feature", "main", hint_metarange_id=hint)
    assert outcome.attempts == 1
    assert content(g, repo, "main")["f"] == "1"
    assert sum(1 for p in content(g, repo, "main") if p.startswith("race")) == 5
    # A hint for another source is ignored, not trusted.
    g.create_branch(repo, "other", "main~3")
    put_commit(g, repo, "other", {"o": "1"})
    g.merge(repo, "other", "main", hint_metarange_id=hint)
    assert content(g, repo, "main")["o"] == "1"


def test_revert_and_cherry_pick(forked):
    g, repo = forked
    change = put_commit(g, repo, "feature", {"a": "2", "new": "1"})
    g.cherry_pick(repo, "main", change.id)
    assert content(g, repo, "main") == {"a": "2", "b": "1", "c": "1", "new": "1"}
    g.revert(repo, "main", "main")
    assert content(g, repo, "main") == {"a": "1", "b": "1", "c": "1"}
    head = g.get_commit(repo, "main")
    assert head.metadata["quarry.revert"] and len(head.parents) == 1
    # Nothing left to do: the refusal names what was asked (it said "the merge").
    with pytest.raises(gerrors.NoChanges, match="the cherry-pick changes nothing on main"):
        g.cherry_pick(repo, "main", head.id)
    with pytest.raises(gerrors.NoChanges, match="the revert changes nothing on main"):
        g.revert(repo, "main", change.id)


def test_revert_of_a_merge_commit_needs_a_parent_number(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"f": "1"})
    put_commit(g, repo, "main", {"m": "1"})
    g.merge(repo, "feature", "main")
    with pytest.raises(gerrors.InvalidParent):
        g.revert(repo, "main", "main")
    g.revert(repo, "main", "main", parent_number=1)
    assert "f" not in content(g, repo, "main") and content(g, repo, "main")["m"] == "1"


def test_criss_cross_merge_base_is_deterministic(graveler, repo):
    g = graveler
    put_commit(g, repo, "main", {"base": "1"})
    g.create_branch(repo, "x", "main")
    put_commit(g, repo, "main", {"m1": "1"})
    put_commit(g, repo, "x", {"x1": "1"})
    m1 = g.get_commit(repo, "main").id
    x1 = g.get_commit(repo, "x").id
    g.merge(repo, x1, "main")
    g.merge(repo, m1, "x")
    put_commit(g, repo, "main", {"m2": "1"})
    put_commit(g, repo, "x", {"x2": "1"})
    base = g.find_merge_base(repo, "main", "x")
    assert base.id in (m1, x1)
    assert g.find_merge_base(repo, "x", "main").id == base.id
    outcome = g.merge(repo, "x", "main")
    assert outcome.commit.metadata["quarry.merge.base"] == base.id
    assert content(g, repo, "main") == {"base": "1", "m1": "1", "x1": "1", "m2": "1", "x2": "1"}


def test_three_dot_diff(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "f", "b": "same", "n": "1"})
    put_commit(g, repo, "main", {"a": "m", "b": "same"})
    changes, _ = g.diff(repo, "main", "feature", three_dot=True)
    kinds = {c.path: c.type for c in changes}
    assert kinds == {"a": ChangeType.CONFLICT, "b": ChangeType.CHANGED, "n": ChangeType.ADDED}


def _noop_layers(g, repo, how):
    """Leave main clean (no uncommitted change) but with staging layers holding HEAD's
    values, the three ways a user gets there."""
    if how == "put-again":
        g.put_objects(repo, "main", [entry("a", "1")])  # HEAD's value, staged again
    elif how == "discard-path":
        g.put_objects(repo, "main", [entry("a", "9")])
        assert g.discard_changes(repo, "main", path="a") == 1  # stages HEAD's entry back
    else:  # compacted: a compacted metarange built over the old HEAD
        g.put_objects(repo, "main", [entry("a", "1"), entry("tmp", "1")])
        g.delete_objects(repo, "main", ["tmp"])
        assert g.compact(repo, "main")[0]
    assert g.diff_uncommitted(repo, "main")[0] == []  # clean, as a merge requires


@pytest.mark.parametrize("how", ["put-again", "discard-path", "compacted"])
def test_a_merge_onto_layers_holding_heads_values_is_seen_and_kept(forked, how):
    """Found by a tester's model-based driver: the merge moved only the branch's commit id,
    so those layers (the old HEAD's values) hid the merge from every reader of `main`
    (`main@` had it), showed it reversed as uncommitted, and the next commit undid it.
    Safety rule: a change a merge, revert or cherry-pick commits is what the branch reads."""
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "2"})
    _noop_layers(g, repo, how)
    g.merge(repo, "feature", "main")
    assert content(g, repo, "main")["a"] == "2"
    assert g.diff_uncommitted(repo, "main")[0] == []
    put_commit(g, repo, "main", {"later": "1"})  # an unrelated commit keeps the merge
    assert content(g, repo, "main@")["a"] == "2"


@pytest.mark.parametrize("how", ["put-again", "compacted"])
def test_a_cherry_pick_and_a_revert_onto_such_layers_are_seen(forked, how):
    g, repo = forked
    change = put_commit(g, repo, "feature", {"a": "2"})
    _noop_layers(g, repo, how)
    g.cherry_pick(repo, "main", change.id)
    assert content(g, repo, "main")["a"] == "2"
    g.put_objects(repo, "main", [entry("a", "2")])  # HEAD's value again
    g.revert(repo, "main", "main")
    assert content(g, repo, "main")["a"] == "1"


def test_a_write_racing_the_merge_onto_layers_is_never_dropped(forked, monkeypatch):
    """The move drops the old layers: a write acknowledged between the clean check and the
    move must survive it (it lands on the token sealed before the check, or the move's
    compare-and-swap fails and the merge is redone)."""
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "2"})
    _noop_layers(g, repo, "put-again")
    merges = g.merges
    real = merges.core.range_writer.merge_metaranges
    raced = []

    def racing(*args, **kwargs):
        if not raced:
            raced.append(True)
            g.put_objects(repo, "main", [entry("during", "1")])  # acknowledged mid-merge
        return real(*args, **kwargs)

    monkeypatch.setattr(merges.core.range_writer, "merge_metaranges", racing)
    # The write made the branch dirty: the move's swap failed, and the redone merge finds
    # a real uncommitted change and refuses, as it does for any dirty destination.
    with pytest.raises(gerrors.DirtyBranch):
        g.merge(repo, "feature", "main")
    listed = content(g, repo, "main")
    assert listed["a"] == "1" and listed["during"] == "1"  # nothing moved, nothing lost


def test_a_dry_run_of_a_merge_that_changes_nothing_answers_as_the_merge_would(forked):
    """The dry run said "would make 0 added, 0 removed, 0 changed" and the merge then
    failed with NO_CHANGES: a dry run must predict the merge's outcome."""
    g, repo = forked
    g.commit(repo, "feature", "nothing", allow_empty=True)
    for dry_run in (True, False):
        with pytest.raises(gerrors.NoChanges):
            g.merge(repo, "feature", "main", dry_run=dry_run)
    assert g.merge(repo, "feature", "main", dry_run=True, allow_empty=True).summary.total == 0


def test_a_merge_conditioned_on_the_destination_head_lands_only_on_that_head(forked):
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "2"})
    seen = g.get_branch(repo, "main").commit_id
    put_commit(g, repo, "main", {"b": "2"})  # main moved since `seen`
    with pytest.raises(gerrors.DestinationMoved):
        g.merge(repo, "feature", "main", destination_head_id=seen)
    assert content(g, repo, "main")["a"] == "1"  # nothing merged
    now = g.get_branch(repo, "main").commit_id
    g.merge(repo, "feature", "main", destination_head_id=now)
    assert content(g, repo, "main")["a"] == "2"


def test_a_merge_refused_for_uncommitted_changes_leaves_the_branch_as_it_was(forked):
    """The seal that lets a merge drop no-op layers ran before the check: every refused
    attempt sealed the token (1, 2, 3... sealed tokens, dirty false)."""
    g, repo = forked
    put_commit(g, repo, "feature", {"a": "2"})
    g.put_objects(repo, "main", [entry("staged", "1")])
    before = g.get_branch(repo, "main")
    for _ in range(3):
        with pytest.raises(gerrors.DirtyBranch):
            g.merge(repo, "feature", "main")
    assert g.get_branch(repo, "main") == before


def _criss_cross(g, repo):
    """Two merges in opposite directions at once (as two users syncing do): feat -> main
    and main's previous HEAD -> feat. Returns main's HEAD before the merges."""
    g.create_branch(repo, "feat", "main")
    put_commit(g, repo, "feat", {"p": "1", "p2": "1"})
    put_commit(g, repo, "main", {"q": "1"})
    before = put_commit(g, repo, "main", {"r": "1"})  # main's side: higher generation
    g.merge(repo, "feat", "main")
    g.merge(repo, before.id, "feat")
    return before


def test_a_criss_cross_merge_runs_from_the_merge_of_its_bases(graveler, repo):
    """With one of the two best common ancestors as the base, a file the destination
    deleted came back (the chosen base lacked it) and a path only one side changed was a
    conflict. From their merge (git's virtual base), as git does: neither."""
    g = graveler
    put_commit(g, repo, "main", {"base": "1"})
    _criss_cross(g, repo)
    put_commit(g, repo, "feat", {"p": None})  # feat deletes p
    g.create_branch(repo, "feat2", "feat")
    put_commit(g, repo, "feat2", {"p2": "2"})  # a path main never touched
    head = g.get_commit(repo, "main").id
    outcome = g.merge(repo, "main", "feat2", allow_empty=True)
    assert content(g, repo, "feat2")["p2"] == "2" and "p" not in content(g, repo, "feat2")
    assert len(outcome.commit.metadata["quarry.merge.bases"].split(",")) == 2
    g.merge(repo, "main", "feat", allow_empty=True)
    assert "p" not in content(g, repo, "feat")  # the deletion holds
    assert g.get_commit(repo, "main").id == head


def test_paths_the_merge_bases_disagree_on_are_conflicts_unless_both_sides_agree(graveler, repo):
    g = graveler
    put_commit(g, repo, "main", {"x": "0"})
    g.create_branch(repo, "feat", "main")
    put_commit(g, repo, "feat", {"x": "f"})
    before = put_commit(g, repo, "main", {"x": "m"})
    # The criss-cross, each side resolving x its own way.
    g.merge(repo, "feat", "main", strategy=MergeStrategy.DEST_WINS, allow_empty=True)  # x=m
    g.merge(repo, before.id, "feat", strategy=MergeStrategy.DEST_WINS, allow_empty=True)  # x=f
    with pytest.raises(gerrors.MergeConflict):
        g.merge(repo, "feat", "main")  # x=m vs x=f from bases that disagree: a conflict
    put_commit(g, repo, "feat", {"x": "m"})  # feat now agrees with main
    g.merge(repo, "feat", "main", allow_empty=True)
    assert content(g, repo, "main")["x"] == "m"


def test_quarrys_own_metadata_keys_are_refused_from_callers(forked):
    """quarry.merge.*, quarry.revert, quarry.cherry-pick, quarry.import are Quarry's own
    record of what a commit did: a caller's forged `quarry.merge.bases` passed for one.
    Other quarry.* keys (Spark's quarry.spark.*) are clients' own."""
    g, repo = forked
    put_commit(g, repo, "feature", {"f": "1"})
    for key in ("quarry.merge.bases", "quarry.revert", "quarry.cherry-pick", "quarry.import"):
        with pytest.raises(gerrors.ReservedMetadataKey):
            g.merge(repo, "feature", "main", metadata={key: "forged"})
        g.put_objects(repo, "main", [entry(f"m-{key}")])
        with pytest.raises(gerrors.ReservedMetadataKey):
            g.commit(repo, "main", "m", metadata={key: "forged"})
    g.discard_changes(repo, "main")
    merged = g.merge(repo, "feature", "main", metadata={"quarry.spark.job": "j"}).commit
    assert merged.metadata["quarry.spark.job"] == "j"
    assert "quarry.merge.bases" not in merged.metadata
